//! A failed fsync or write (injected): nothing unwritten is acknowledged, then or later.

use std::collections::HashSet;
use std::net::IpAddr;

use super::testkit::{alloc, alloc_all, daemon, held, open, opts, Net1};
use crate::fault::{self, Call};
use crate::store::*;
use crate::testutil::{req, sets, temp_dir};
use crate::ErrorKind;

/// Every address in `held` has one holder.
fn unique(held: &[(String, IpAddr)]) {
    let set: HashSet<IpAddr> = held.iter().map(|(_, a)| *a).collect();
    assert_eq!(
        set.len(),
        held.len(),
        "an address with two holders: {held:?}"
    );
}

/// Every acknowledged address differs from `a`, handed out after a failure.
fn not_acked(acked: &[(String, IpAddr)], a: IpAddr) {
    assert!(acked.iter().all(|(_, x)| *x != a), "{a} handed out twice");
}

/// c1..c3 allocated: the acknowledged leases that a failure after them must keep.
fn three(tag: &str) -> Net1 {
    Net1::new(tag, &["c1", "c2", "c3"])
}

#[test]
fn failed_fsync_of_an_add_is_not_acknowledged_and_rolled_back() {
    let mut t = three("fsync-add");
    t.fail(Call::Fsync, 1);
    let e = t.alloc("c4").unwrap_err();
    assert_eq!(fault::fired(t.dir.path(), Call::Fsync), 1);
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("not made"), "{e}");
    assert_eq!(held(&mut t.s), t.acked, "the failed ADD is in memory");
    assert!(!t.dir.path().join("net1").join(UNSYNCED).exists());

    // Later answers, then the files read afresh: every acknowledged lease, never c4.
    for c in ["c5", "c6"] {
        let a = t.alloc(c).unwrap();
        t.acked.push((c.to_string(), a));
    }
    t.s.release("c1", "eth0").unwrap();
    t.acked.remove(0);
    t.acked.sort();
    assert_eq!(held(&mut t.s), t.acked);
    let mut fresh = t.reopen();
    assert_eq!(held(&mut fresh), t.acked);
    unique(&t.acked);
    // A retry of the failed ADD gets an address as any new one does.
    not_acked(&t.acked, alloc(&mut fresh, "c4", &t.rs).unwrap());
}

#[test]
fn failed_fsync_of_a_release_keeps_the_lease() {
    let mut t = three("fsync-del");
    t.fail(Call::Fsync, 1);
    assert_eq!(t.s.release("c1", "eth0").unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(held(&mut t.s), t.acked);
    assert_eq!(held(&mut t.reopen()), t.acked);
    let a = t.alloc("c4").unwrap();
    not_acked(&t.acked, a);
    t.s.release("c1", "eth0").unwrap();
    assert_eq!(held(&mut t.reopen()).len(), 3);
}

#[test]
fn failed_fsync_fails_every_answer_of_the_batch() {
    let mut t = three("fsync-batch");
    t.fail(Call::Fsync, 1);
    let ops = [
        Op::Allocate(req("net1", "b1", &t.rs)),
        Op::Leases,
        Op::Allocate(req("net1", "b2", &t.rs)),
    ];
    let results = t.s.execute_batch(&ops).finish(|| &mut t.s);
    assert!(results.iter().all(|r| r.is_err()), "{results:?}");
    assert_eq!(held(&mut t.reopen()), t.acked);
}

#[test]
fn failed_rewrite_refuses_every_process_until_it_succeeds() {
    let mut t = three("fsync-poison");
    // The batch's fsync fails, and so does every fsync of the rewrite.
    t.fail(Call::Fsync, 100);
    let e = t.alloc("c4").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains("rewriting"), "{e}");
    let marker = t.dir.path().join("net1").join(UNSYNCED);
    assert!(marker.exists());
    // This handle and any other (another process, a restarted daemon) refuse, reads too.
    for e in [
        t.s.leases().unwrap_err(),
        t.reopen().leases().unwrap_err(),
        alloc(&mut t.reopen(), "c5", &t.rs).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.to_string().contains("refusing requests"), "{e}");
    }

    // The disk recovers: the first request of another handle rewrites the files without
    // the failed batch; the first handle then reads those.
    t.fail(Call::Fsync, 0);
    let mut other = t.reopen();
    assert_eq!(held(&mut other), t.acked);
    assert!(!marker.exists());
    assert_eq!(held(&mut t.s), t.acked);
    let a = t.alloc("c5").unwrap();
    not_acked(&t.acked, a);
    assert_eq!(held(&mut t.reopen()).len(), 4);
}

#[test]
fn failed_append_leaves_no_partial_record() {
    let mut t = three("write-fail");
    let path = t.dir.path().join("net1/journal");
    let before = std::fs::read(&path).unwrap();
    t.fail(Call::Write, 1);
    assert_eq!(t.alloc("c4").unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(held(&mut t.s), t.acked);
    t.alloc("c5").unwrap();
    assert_eq!(held(&mut t.reopen()).len(), 4);
}

#[test]
fn failed_fsync_in_the_daemon_is_not_acknowledged() {
    let d = temp_dir("fsync-daemon");
    let rs = sets("10.22.0.0/24");
    let data = d.path().join("data");
    let (h, c) = daemon(&d.path().join("ipamd.sock"), &data);
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
        ..opts()
    };
    let mut s = Store::open(d.path(), "net1", o).unwrap();
    let mut acked = alloc_all(&mut s, &["c1", "c2"], &rs);
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
