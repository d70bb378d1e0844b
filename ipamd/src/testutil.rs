//! Helpers for the crate's tests.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::json;

use crate::api::{AllocateRequest, LeaseKey};
use crate::config::{IpamConfig, RangeSet};

/// A directory removed when dropped (no tempfile dependency for this).
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ipamd-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn sets(subnet: &str) -> Vec<RangeSet> {
    IpamConfig::ranges_from_json(&json!([[{ "subnet": subnet }]])).unwrap()
}

pub(crate) fn key(net: &str, cid: &str) -> LeaseKey {
    LeaseKey {
        network: net.into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
    }
}

pub(crate) fn req(net: &str, cid: &str, range_sets: &[RangeSet]) -> AllocateRequest {
    AllocateRequest {
        key: key(net, cid),
        range_sets: range_sets.to_vec(),
        requested: vec![],
    }
}
