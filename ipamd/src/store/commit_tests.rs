//! A failed fsync or write (injected): nothing unwritten is acknowledged, then or later.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;

use super::integrity_tests::{alloc, held, open};
use super::*;
use crate::fault::{self, Call};
use crate::testutil::{req, sets, temp_dir};

/// Every address in `held` has one holder.
fn unique(held: &[(String, IpAddr)]) {
    let set: HashSet<IpAddr> = held.iter().map(|(_, a)| *a).collect();
    assert_eq!(
        set.len(),
        held.len(),
        "an address with two holders: {held:?}"
    );
}

/// c1..c3 allocated; returns them with their addresses.
fn three(dir: &Path) -> (Store, Vec<(String, IpAddr)>) {
    let rs = sets("10.22.0.0/24");
    let mut s = open(dir, "net1");
    let acked = (1..=3)
        .map(|i| {
            let c = format!("c{i}");
            let a = alloc(&mut s, &c, &rs).unwrap();
            (c, a)
        })
        .collect();
    (s, acked)
}

#[test]
fn failed_fsync_of_an_add_is_not_acknowledged_and_rolled_back() {
    let d = temp_dir("fsync-add");
    let rs = sets("10.22.0.0/24");
    let (mut s, mut acked) = three(d.path());
    fault::inject(d.path(), Call::Fsync, 0, 1);
    let e = alloc(&mut s, "c4", &rs).unwrap_err();
    assert_eq!(fault::fired(d.path(), Call::Fsync), 1);
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("not made"), "{e}");
    assert_eq!(held(&mut s), acked, "the failed ADD is in memory");
    assert!(!d.path().join("net1").join(commit::UNSYNCED).exists());

    // Later answers, then the files read afresh: every acknowledged lease, never c4.
    for c in ["c5", "c6"] {
        acked.push((c.to_string(), alloc(&mut s, c, &rs).unwrap()));
    }
    s.release("c1", "eth0").unwrap();
    acked.remove(0);
    acked.sort();
    assert_eq!(held(&mut s), acked);
    let mut fresh = open(d.path(), "net1");
    assert_eq!(held(&mut fresh), acked);
    unique(&acked);
    // A retry of the failed ADD gets an address as any new one does.
    let a = alloc(&mut fresh, "c4", &rs).unwrap();
    assert!(acked.iter().all(|(_, x)| *x != a));
}

#[test]
fn failed_fsync_of_a_release_keeps_the_lease() {
    let d = temp_dir("fsync-del");
    let rs = sets("10.22.0.0/24");
    let (mut s, acked) = three(d.path());
    fault::inject(d.path(), Call::Fsync, 0, 1);
    assert_eq!(s.release("c1", "eth0").unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(held(&mut s), acked);
    assert_eq!(held(&mut open(d.path(), "net1")), acked);
    let a = alloc(&mut s, "c4", &rs).unwrap();
    assert!(acked.iter().all(|(_, x)| *x != a));
    s.release("c1", "eth0").unwrap();
    assert_eq!(held(&mut open(d.path(), "net1")).len(), 3);
}

#[test]
fn failed_fsync_fails_every_answer_of_the_batch() {
    let d = temp_dir("fsync-batch");
    let rs = sets("10.22.0.0/24");
    let (mut s, acked) = three(d.path());
    fault::inject(d.path(), Call::Fsync, 0, 1);
    let ops = [
        Op::Allocate(req("net1", "b1", &rs)),
        Op::Leases,
        Op::Allocate(req("net1", "b2", &rs)),
    ];
    let results = s.execute_batch(&ops).finish(|| &mut s);
    assert!(results.iter().all(|r| r.is_err()), "{results:?}");
    assert_eq!(held(&mut open(d.path(), "net1")), acked);
}

#[test]
fn failed_rewrite_refuses_every_process_until_it_succeeds() {
    let d = temp_dir("fsync-poison");
    let rs = sets("10.22.0.0/24");
    let (mut s, acked) = three(d.path());
    // The batch's fsync fails, and so does every fsync of the rewrite.
    fault::inject(d.path(), Call::Fsync, 0, 100);
    let e = alloc(&mut s, "c4", &rs).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains("rewriting"), "{e}");
    let marker = d.path().join("net1").join(commit::UNSYNCED);
    assert!(marker.exists());
    // This handle and any other (another process, a restarted daemon) refuse, reads too.
    for e in [
        s.leases().unwrap_err(),
        open(d.path(), "net1").leases().unwrap_err(),
        alloc(&mut open(d.path(), "net1"), "c5", &rs).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.to_string().contains("refusing requests"), "{e}");
    }

    // The disk recovers: the first request of another handle rewrites the files without
    // the failed batch; the first handle then reads those.
    fault::inject(d.path(), Call::Fsync, 0, 0);
    let mut other = open(d.path(), "net1");
    assert_eq!(held(&mut other), acked);
    assert!(!marker.exists());
    assert_eq!(held(&mut s), acked);
    let a = alloc(&mut s, "c5", &rs).unwrap();
    assert!(acked.iter().all(|(_, x)| *x != a));
    assert_eq!(held(&mut open(d.path(), "net1")).len(), 4);
}

#[test]
fn failed_append_leaves_no_partial_record() {
    let d = temp_dir("write-fail");
    let rs = sets("10.22.0.0/24");
    let (mut s, acked) = three(d.path());
    let path = d.path().join("net1/journal");
    let before = std::fs::read(&path).unwrap();
    fault::inject(d.path(), Call::Write, 0, 1);
    assert_eq!(alloc(&mut s, "c4", &rs).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(held(&mut s), acked);
    alloc(&mut s, "c5", &rs).unwrap();
    assert_eq!(held(&mut open(d.path(), "net1")).len(), 4);
}

#[test]
fn failed_fsync_in_the_daemon_is_not_acknowledged() {
    let d = temp_dir("fsync-daemon");
    let rs = sets("10.22.0.0/24");
    let data = d.path().join("data");
    let sock = d.path().join("ipamd.sock");
    let daemon_opts = crate::daemon::DaemonOptions {
        socket: sock.clone(),
        data_dir: data.clone(),
        log_level: "error".into(),
        ..Default::default()
    };
    let h = crate::daemon::start_with(daemon_opts, super::integrity_tests::opts()).unwrap();
    let c = crate::client::Client::new(&sock, &data);
    let a1 = c.allocate(&req("net1", "c1", &rs)).unwrap();
    fault::inject(&data, Call::Fsync, 0, 1);
    let e = c.allocate(&req("net1", "c2", &rs)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let a3 = c.allocate(&req("net1", "c3", &rs)).unwrap();
    assert_ne!(a1, a3);
    let cids: Vec<String> = c
        .leases(Some("net1"))
        .unwrap()
        .into_iter()
        .map(|l| l.container_id)
        .collect();
    assert_eq!(cids, ["c1", "c3"]);
    h.stop().unwrap();
    let mut s = open(&data, "net1");
    let got: Vec<String> = held(&mut s).into_iter().map(|(c, _)| c).collect();
    assert_eq!(got, ["c1", "c3"]);
}

#[test]
fn failed_compaction_after_an_add_is_not_acknowledged() {
    let d = temp_dir("compact-fail");
    let rs = sets("10.22.0.0/24");
    let o = StoreOptions {
        compact_threshold: 400, // the third record goes over
        ..super::integrity_tests::opts()
    };
    let mut s = Store::open(d.path(), "net1", o).unwrap();
    let mut acked = Vec::new();
    for c in ["c1", "c2"] {
        acked.push((c.to_string(), alloc(&mut s, c, &rs).unwrap()));
    }
    // The first fsync of the third ADD is the compaction's (snapshot temp file).
    fault::inject(d.path(), Call::Fsync, 0, 1);
    let e = alloc(&mut s, "c3", &rs).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("snapshot.tmp"), "{e}");
    assert_eq!(fault::fired(d.path(), Call::Fsync), 1);
    assert_eq!(held(&mut s), acked);
    acked.push(("c4".to_string(), alloc(&mut s, "c4", &rs).unwrap()));
    assert_eq!(held(&mut open(d.path(), "net1")), acked);
    unique(&acked);
}
