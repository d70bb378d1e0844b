//! One call through the snapshot's index answers as the whole state would, and an index
//! that is missing, stale or damaged is never believed.

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use super::super::*;
use crate::config::RangeSet;
use crate::testutil::{req, sets, temp_dir};

fn opts(boot: &str, threshold: u64) -> StoreOptions {
    StoreOptions {
        boot_id: boot.into(),
        compact_threshold: threshold,
        lock_timeout: Duration::from_secs(10),
        reclaim_when_full: true,
    }
}

/// One call as the plugin without a daemon makes it: a fresh handle, through the index.
fn once(data: &Path, boot: &str, op: Op) -> Result<Reply, Error> {
    run_once(data, "net1", opts(boot, 2048), op)
}

fn add(data: &Path, cid: &str, rs: &[RangeSet]) -> Result<IpAddr, Error> {
    match once(data, "boot-a", Op::Allocate(req("net1", cid, rs)))? {
        Reply::Allocations(a) => Ok(a[0].address.addr()),
        other => Err(unexpected(&other)),
    }
}

fn del(data: &Path, cid: &str) {
    once(data, "boot-a", release(cid)).unwrap();
}

fn release(cid: &str) -> Op {
    Op::Release {
        cid: cid.into(),
        ifname: "eth0".into(),
    }
}

fn check(data: &Path, cid: &str) -> Vec<IpAddr> {
    let op = Op::Check {
        cid: cid.into(),
        ifname: "eth0".into(),
    };
    match once(data, "boot-a", op).unwrap() {
        Reply::Allocations(a) => a.iter().map(|a| a.address.addr()).collect(),
        other => panic!("{other:?}"),
    }
}

/// Every lease, read the whole way (as the daemon reads them).
fn held(data: &Path) -> Vec<(String, IpAddr)> {
    let mut s = Store::open(data, "net1", opts("boot-a", 1 << 20)).unwrap();
    crate::store_tests::testkit::held(&mut s)
}

/// A store whose snapshot (and index) hold `n` leases, with a few records in its journal.
fn compacted(data: &Path, n: usize, rs: &[RangeSet]) {
    let mut s = Store::open(data, "net1", opts("boot-a", 1 << 20)).unwrap();
    for i in 0..n {
        s.allocate(&req("net1", &format!("c{i}"), rs)).unwrap();
    }
    s.locked(|st| st.compact()).unwrap();
    s.allocate(&req("net1", "after", rs)).unwrap();
    s.release("c0", "eth0").unwrap();
}

#[test]
fn calls_through_the_index_answer_as_the_whole_state() {
    // The same calls on two stores, one through the index and one reading everything:
    // every answer and the final leases are the same, across several compactions.
    let (a, b) = (temp_dir("idx-a"), temp_dir("idx-b"));
    let rs = sets("10.40.0.0/24");
    let mut full = Store::open(b.path(), "net1", opts("boot-a", 2048)).unwrap();
    let mut live = Vec::new();
    for step in 0..400u32 {
        let pick = (step.wrapping_mul(2_654_435_761) >> 7) as usize;
        let op = if live.len() < 20 || (!pick.is_multiple_of(3) && live.len() < 120) {
            let cid = format!("p{step}");
            live.push(cid.clone());
            Op::Allocate(req("net1", &cid, &rs))
        } else if pick.is_multiple_of(5) {
            // A repeated ADD, a CHECK, or a DEL of someone unknown.
            let cid = live[pick % live.len()].clone();
            match pick % 3 {
                0 => Op::Allocate(req("net1", &cid, &rs)),
                1 => Op::Check {
                    cid,
                    ifname: "eth0".into(),
                },
                _ => release("nobody"),
            }
        } else {
            release(&live.swap_remove(pick % live.len()))
        };
        let got = once(a.path(), "boot-a", op.clone());
        let want = full.execute(op);
        assert_eq!(got, want, "step {step}");
    }
    assert_eq!(held(a.path()), held(b.path()));
    let gen = |d: &Path| {
        crate::snapshot::read(&d.join("net1/snapshot"))
            .unwrap()
            .0
            .unwrap()
            .generation
    };
    assert!(gen(a.path()) > 3, "too few compactions to tell");
    // The in-process path keeps its journal short whatever the snapshot's size.
    let journal = std::fs::metadata(a.path().join("net1/journal"))
        .unwrap()
        .len();
    assert!(journal < 2048 + 1024, "journal of {journal} bytes");
}

#[test]
fn a_store_of_the_previous_release_without_an_index_keeps_working_and_gets_one() {
    // The previous release writes the same snapshot and journal, and no index.
    let d = temp_dir("idx-upgrade");
    let rs = sets("10.41.0.0/24");
    compacted(d.path(), 30, &rs);
    let index = d.path().join("net1").join(crate::index::FILE);
    std::fs::remove_file(&index).unwrap();
    let before = held(d.path());
    assert_eq!(
        check(d.path(), "c7"),
        vec![before.iter().find(|h| h.0 == "c7").unwrap().1]
    );
    assert!(index.exists(), "the index is written again");
    let mode = std::fs::metadata(&index).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let taken: HashSet<IpAddr> = before.iter().map(|h| h.1).collect();
    let new = add(d.path(), "new", &rs).unwrap();
    assert!(!taken.contains(&new), "{new} handed out twice");
    del(d.path(), "c7");
    assert!(check(d.path(), "c7").is_empty());
    assert_eq!(held(d.path()).len(), before.len());
}

#[test]
fn a_version_1_snapshot_is_rewritten_so_it_can_be_indexed() {
    let d = temp_dir("idx-v1");
    let rs = sets("10.42.0.0/24");
    compacted(d.path(), 5, &rs);
    let path = d.path().join("net1/snapshot");
    let mut v1 = crate::snapshot::decode(&std::fs::read(&path).unwrap()).unwrap();
    v1.version = 1;
    std::fs::write(&path, serde_json::to_vec(&v1).unwrap()).unwrap();
    let before = held(d.path());
    let new = add(d.path(), "new", &rs).unwrap();
    assert!(before.iter().all(|h| h.1 != new));
    assert!(std::fs::read(&path)
        .unwrap()
        .starts_with(b"ipamd-snapshot v2 "));
    assert!(crate::index::Index::open(&d.path().join("net1")).is_ok());
}

#[test]
fn a_stale_index_is_not_believed() {
    let d = temp_dir("idx-stale");
    let rs = sets("10.43.0.0/24");
    compacted(d.path(), 3, &rs);
    let index = d.path().join("net1").join(crate::index::FILE);
    let old = std::fs::read(&index).unwrap();
    // More leases, in a newer snapshot; then the old index put back in place.
    let mut s = Store::open(d.path(), "net1", opts("boot-a", 1 << 20)).unwrap();
    for i in 0..20 {
        s.allocate(&req("net1", &format!("more{i}"), &rs)).unwrap();
    }
    s.locked(|st| st.compact()).unwrap();
    std::fs::write(&index, &old).unwrap();
    let taken: HashSet<IpAddr> = held(d.path()).iter().map(|h| h.1).collect();
    let new = add(d.path(), "new", &rs).unwrap();
    assert!(!taken.contains(&new), "{new} handed out twice");
    assert_ne!(std::fs::read(&index).unwrap(), old, "rewritten");
}

#[test]
fn a_damaged_index_is_not_believed_wherever_it_is_damaged() {
    let d = temp_dir("idx-damage");
    let rs = sets("10.44.0.0/26");
    compacted(d.path(), 12, &rs);
    let dir = d.path().join("net1");
    let index = dir.join(crate::index::FILE);
    let good = std::fs::read(&index).unwrap();
    let leases = held(d.path());
    let taken: HashSet<IpAddr> = leases.iter().map(|h| h.1).collect();
    for at in (0..good.len()).step_by(3) {
        let mut bad = good.clone();
        bad[at] ^= 0x04;
        std::fs::write(&index, &bad).unwrap();
        let (cid, addr) = &leases[at % leases.len()];
        assert_eq!(check(d.path(), cid), vec![*addr], "byte {at}");
        // Each call may write the index again: damage it again for the ADD.
        std::fs::write(&index, &bad).unwrap();
        let new = add(d.path(), &format!("n{at}"), &rs).unwrap();
        assert!(!taken.contains(&new), "byte {at}: {new} handed out twice");
        del(d.path(), &format!("n{at}"));
    }
    // A link in its place is not followed, but replaced.
    std::fs::remove_file(&index).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &index).unwrap();
    assert_eq!(check(d.path(), &leases[1].0), vec![leases[1].1]);
    assert!(!std::fs::symlink_metadata(&index).unwrap().is_symlink());
}

#[test]
fn a_damaged_holder_in_the_snapshot_is_refused_as_before() {
    let d = temp_dir("idx-snap");
    let rs = sets("10.45.0.0/24");
    compacted(d.path(), 4, &rs);
    let path = d.path().join("net1/snapshot");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(4).position(|w| w == b"\"c2\"").unwrap();
    bytes[at + 2] = b'9';
    std::fs::write(&path, &bytes).unwrap();
    let op = Op::Check {
        cid: "c2".into(),
        ifname: "eth0".into(),
    };
    let e = once(d.path(), "boot-a", op).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("damaged"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as it is");
}

#[test]
fn a_full_set_reads_every_lease_and_reclaims_the_previous_boot() {
    let d = temp_dir("idx-full");
    let rs = sets("10.46.0.0/29");
    let mut s = Store::open(d.path(), "net1", opts("boot-a", 1 << 20)).unwrap();
    for i in 0..5 {
        s.allocate(&req("net1", &format!("c{i}"), &rs)).unwrap();
    }
    s.locked(|st| st.compact()).unwrap();
    // Another boot: the /29's leases (5 usable addresses) are all of boot-a.
    let got = once(d.path(), "boot-b", Op::Allocate(req("net1", "fresh", &rs))).unwrap();
    assert!(matches!(got, Reply::Allocations(a) if a.len() == 1));
    assert_eq!(held(d.path()).len(), 1);
}
