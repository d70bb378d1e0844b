//! What the store's failure and damage tests share: a store of their options, allocation
//! and the leases it holds, and a daemon over a data dir.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use tempfile::TempDir;

use crate::client::Client;
use crate::config::RangeSet;
use crate::daemon::{DaemonHandle, DaemonOptions};
use crate::fault::{self, Call};
use crate::store::*;
use crate::testutil::{req, sets, temp_dir};
use crate::Error;

/// A fixed boot ID (no reclaim between the handles of one test) and no compaction.
pub(super) fn opts() -> StoreOptions {
    StoreOptions {
        boot_id: "boot-a".into(),
        compact_threshold: 1 << 20,
        lock_timeout: Duration::from_secs(10),
        reclaim_when_full: false,
    }
}

pub(super) fn open(dir: &Path, network: &str) -> Store {
    Store::open(dir, network, opts()).unwrap()
}

pub(super) fn alloc(s: &mut Store, cid: &str, rs: &[RangeSet]) -> Result<IpAddr, Error> {
    let net = s.network().to_string();
    s.allocate(&req(&net, cid, rs)).map(|a| a[0].address.addr())
}

/// Allocates for each of `cids` in turn; (container ID, address) of each.
pub(super) fn alloc_all(s: &mut Store, cids: &[&str], rs: &[RangeSet]) -> Vec<(String, IpAddr)> {
    cids.iter()
        .map(|c| (c.to_string(), alloc(s, c, rs).unwrap()))
        .collect()
}

/// (container ID, address) of every lease, sorted.
pub(crate) fn held(s: &mut Store) -> Vec<(String, IpAddr)> {
    let mut v: Vec<_> = s
        .leases()
        .unwrap()
        .into_iter()
        .map(|l| (l.container_id, l.address))
        .collect();
    v.sort();
    v
}

/// A daemon on `sock` serving the store files under `data` with [`opts`], and its client.
pub(super) fn daemon(sock: &Path, data: &Path) -> (DaemonHandle, Client) {
    let daemon_opts = DaemonOptions {
        socket: sock.to_path_buf(),
        data_dir: data.to_path_buf(),
        log_level: "error".into(),
        ..Default::default()
    };
    let h = crate::daemon::start_with(daemon_opts, opts()).unwrap();
    (h, Client::new(sock, data))
}

/// net1 in a fresh directory (`tag` in its name) with leases allocated from 10.22.0.0/24:
/// the start of most of these tests.
pub(super) struct Net1 {
    pub dir: TempDir,
    pub rs: Vec<RangeSet>,
    pub s: Store,
    /// The leases acknowledged so far.
    pub acked: Vec<(String, IpAddr)>,
}

impl Net1 {
    /// With `cids` allocated in turn.
    pub fn new(tag: &str, cids: &[&str]) -> Net1 {
        let dir = temp_dir(tag);
        let rs = sets("10.22.0.0/24");
        let mut s = open(dir.path(), "net1");
        let acked = alloc_all(&mut s, cids, &rs);
        Net1 { dir, rs, s, acked }
    }

    /// The next `n` calls of `call` fail.
    pub fn fail(&self, call: Call, n: u32) {
        fault::inject(self.dir.path(), call, 0, n);
    }

    pub fn alloc(&mut self, cid: &str) -> Result<IpAddr, Error> {
        alloc(&mut self.s, cid, &self.rs)
    }

    /// A new handle on the files, as another process or a restarted daemon opens them.
    pub fn reopen(&self) -> Store {
        open(self.dir.path(), "net1")
    }
}
