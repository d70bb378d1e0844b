//! Helpers for the crate's tests.

use tempfile::TempDir;

use serde_json::json;

use crate::api::{AllocateRequest, LeaseKey};
use crate::config::{IpamConfig, RangeSet};

/// A fresh directory, removed when dropped; `tag` goes into its name.
pub(crate) fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ipamd-test-{tag}-"))
        .tempdir()
        .unwrap()
}

/// Whether the tests run as root: those that act as other users or own files
/// for them skip otherwise.
pub(crate) fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Return from the calling test unless it runs as [`root`], saying what for.
macro_rules! skip_unless_root {
    ($why:literal) => {
        if !$crate::testutil::root() {
            eprintln!(concat!("skipping: needs root ", $why));
            return;
        }
    };
}
pub(crate) use skip_unless_root;

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
        pools: vec![],
    }
}

/// Run the calling test alone in a child process (the test binary again, filtered to it):
/// for tests that measure the whole process (fds, threads) or change process-wide state
/// (umask), which the tests running beside them on other threads would disturb. Returns
/// true in the child, which then does the work; in the parent it waits for the child and
/// fails if the child did.
pub(crate) fn in_child(test: &str) -> bool {
    const ENV: &str = "IPAMD_TEST_CHILD";
    if std::env::var(ENV).as_deref() == Ok(test) {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV, test)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {test} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {test} ran nothing:\n{text}"
    );
    false
}

/// Open file descriptors and threads of this process.
pub(crate) fn fds_and_threads() -> (usize, usize) {
    let count = |p: &str| std::fs::read_dir(p).unwrap().count();
    (count("/proc/self/fd"), count("/proc/self/task"))
}
