use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::api::{AllocateRequest, Allocation};
use crate::attachment::Attachment;
use crate::config::RangeSet;
use crate::testutil::{req, sets, temp_dir};
use tempfile::TempDir;

fn opts(boot: &str) -> StoreOptions {
    StoreOptions {
        boot_id: boot.into(),
        compact_threshold: 1 << 20,
        lock_timeout: Duration::from_secs(10),
        reclaim_when_full: false,
    }
}

fn open(dir: &Path) -> Store {
    Store::open(dir, "net1", opts("boot-a")).unwrap()
}

/// A store in a fresh directory (returned too, to open it again) and a /24
/// to allocate from.
fn fresh_store() -> (TempDir, Vec<RangeSet>, Store) {
    let d = temp_dir("store");
    let s = open(d.path());
    (d, sets("10.22.0.0/24"), s)
}

/// A directory whose /29 (returned too) a previous boot, "boot-a", filled.
fn filled_by_previous_boot() -> (TempDir, Vec<RangeSet>) {
    let d = temp_dir("boot");
    let rs = sets("10.22.0.0/29");
    let mut old = Store::open(d.path(), "net1", opts("boot-a")).unwrap();
    for i in 0..5 {
        alloc(&mut old, &format!("c{i}"), &rs).unwrap();
    }
    (d, rs)
}

fn alloc(s: &mut Store, cid: &str, rs: &[RangeSet]) -> Result<Vec<Allocation>, Error> {
    alloc_req(s, &req("net1", cid, rs))
}

fn alloc_req(s: &mut Store, r: &AllocateRequest) -> Result<Vec<Allocation>, Error> {
    s.allocate(r)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn addrs(s: &mut Store) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = s.leases().unwrap().iter().map(|l| l.address).collect();
    v.sort();
    v
}

#[test]
fn allocate_is_idempotent_and_skips_gateway() {
    let (d, rs, mut s) = fresh_store();
    let a = alloc(&mut s, "c1", &rs).unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].address.to_string(), "10.22.0.2/24");
    assert_eq!(a[0].gateway, Some(ip("10.22.0.1")));
    assert_eq!(alloc(&mut s, "c1", &rs).unwrap(), a);
    // Also from a fresh handle (another process).
    assert_eq!(alloc(&mut open(d.path()), "c1", &rs).unwrap(), a);
    assert_eq!(s.leases().unwrap().len(), 1);
    assert_eq!(s.check("c1", "eth0").unwrap(), a);
    assert!(s.check("c2", "eth0").unwrap().is_empty());
}

#[test]
fn dual_stack_gets_one_address_per_set_in_order() {
    let d = temp_dir("dual");
    let rs = crate::config::IpamConfig::ranges_from_json(&serde_json::json!([
        [{"subnet": "10.1.0.0/24"}],
        [{"subnet": "fd01::/64"}]
    ]))
    .unwrap();
    let mut s = open(d.path());
    let a = alloc(&mut s, "c1", &rs).unwrap();
    assert_eq!(a[0].address.to_string(), "10.1.0.2/24");
    assert_eq!(a[1].address.to_string(), "fd01::2/64");
    assert_eq!(a[1].gateway, Some(ip("fd01::1")));
    assert_eq!(s.check("c1", "eth0").unwrap(), a);
}

#[test]
fn exhaustion_is_clear_and_allocates_nothing() {
    let d = temp_dir("exh");
    let rs = sets("10.22.0.0/29"); // .2 .. .6
    let mut s = open(d.path());
    for i in 0..5 {
        alloc(&mut s, &format!("c{i}"), &rs).unwrap();
    }
    let e = alloc(&mut s, "c5", &rs).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exhausted);
    assert_eq!(e.to_string(), "no free address in 10.22.0.0/29 (5 in use)");
    assert!(s.check("c5", "eth0").unwrap().is_empty());
    assert_eq!(s.leases().unwrap().len(), 5);
    let e = s.status(&rs).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exhausted);
    // Dual-stack: a full second set means nothing is taken from the first either.
    let mut both = sets("10.30.0.0/24");
    both.extend(rs.clone());
    assert_eq!(
        alloc(&mut s, "c6", &both).unwrap_err().kind(),
        ErrorKind::Exhausted
    );
    assert!(s.check("c6", "eth0").unwrap().is_empty());
    // Freeing one makes STATUS ok again.
    s.release("c0", "eth0").unwrap();
    s.status(&rs).unwrap();
}

#[test]
fn release_of_unknown_key_is_ok_and_round_robin_does_not_reuse_at_once() {
    let (d, rs, mut s) = fresh_store();
    s.release("nobody", "eth0").unwrap();
    let a = alloc(&mut s, "c1", &rs).unwrap();
    s.release("c1", "eth0").unwrap();
    let b = alloc(&mut s, "c2", &rs).unwrap();
    assert_ne!(
        a[0].address, b[0].address,
        "freed address handed out again at once"
    );
    assert_eq!(b[0].address.to_string(), "10.22.0.3/24");
    // The round-robin position survives a reload.
    let c = alloc(&mut open(d.path()), "c3", &rs).unwrap();
    assert_eq!(c[0].address.to_string(), "10.22.0.4/24");
}

#[test]
fn requested_address_honoured_or_refused() {
    let (_dir, rs, mut s) = fresh_store();
    let mut r = req("net1", "c1", &rs);
    r.requested = vec![ip("10.22.0.9")];
    assert_eq!(
        alloc_req(&mut s, &r).unwrap()[0].address.to_string(),
        "10.22.0.9/24"
    );
    // Same key, same request: idempotent. Different address for the same key: refused.
    assert_eq!(
        alloc_req(&mut s, &r).unwrap()[0].address.to_string(),
        "10.22.0.9/24"
    );
    r.requested = vec![ip("10.22.0.10")];
    assert_eq!(
        alloc_req(&mut s, &r).unwrap_err().kind(),
        ErrorKind::Conflict
    );

    let mut r2 = req("net1", "abc", &rs);
    r2.requested = vec![ip("10.22.0.9")];
    let e = alloc_req(&mut s, &r2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert_eq!(
        e.to_string(),
        "requested address 10.22.0.9 is held by container c1/eth0"
    );
    for (bad, why) in [
        ("10.23.0.9", "is not in any range set"),
        ("10.22.0.1", "is the gateway of 10.22.0.0/24"),
        ("10.22.0.255", "is not in any range set"),
    ] {
        r2.requested = vec![ip(bad)];
        let e = alloc_req(&mut s, &r2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert!(e.to_string().contains(why), "{bad}: {e}");
    }
    r2.requested = vec![ip("10.22.0.20"), ip("10.22.0.21")];
    assert!(alloc_req(&mut s, &r2)
        .unwrap_err()
        .to_string()
        .contains("at most one address per range set"));
    assert!(s.check("abc", "eth0").unwrap().is_empty());
    // Requested address after round-robin: next automatic allocation continues after it.
    let a = alloc(&mut s, "c2", &rs).unwrap();
    assert_eq!(a[0].address.to_string(), "10.22.0.10/24");
}

#[test]
fn gc_frees_everything_not_in_the_valid_list() {
    let (d, rs, mut s) = fresh_store();
    for c in ["a", "b", "c", "d"] {
        alloc(&mut s, c, &rs).unwrap();
    }
    let valid = vec![
        Attachment::new("net1", "a", "eth0"),
        Attachment::new("net1", "c", "eth0"),
        Attachment::new("net1", "d", "eth1"),
    ];
    let freed = s.gc(&valid).unwrap();
    assert_eq!(freed, 2);
    let left: Vec<String> = open(d.path())
        .leases()
        .unwrap()
        .into_iter()
        .map(|l| l.container_id)
        .collect();
    assert_eq!(left, vec!["a", "c"]);
    assert_eq!(s.gc(&valid).unwrap(), 0);
}

#[test]
fn bad_network_names_refused() {
    let d = temp_dir("name");
    for bad in ["../etc", "..", ".hidden", "a/b", "/abs", "", "net 1"] {
        let e = Store::open(d.path(), bad, opts("b")).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
    }
    assert!(!d.path().join("etc").exists());
    Store::open(d.path(), "my-net_1.v2", opts("b")).unwrap();
}

/// Journal bytes of the network, and the offset where its last record starts.
fn journal_with_last_record_offset(dir: &Path) -> (Vec<u8>, usize) {
    let bytes = std::fs::read(dir.join("net1/journal")).unwrap();
    let out = journal::decode(&bytes[HEADER_LEN as usize..], HEADER_LEN).unwrap();
    assert_eq!(out.torn_bytes, 0);
    let mut offset = HEADER_LEN as usize;
    let mut last_start = offset;
    for r in &out.records {
        last_start = offset;
        offset += journal::encode(r).unwrap().len();
    }
    (bytes, last_start)
}

#[test]
fn torn_tail_at_every_offset_of_the_last_record() {
    let d = temp_dir("torn");
    let rs = sets("10.22.0.0/24");
    {
        let mut s = open(d.path());
        for c in ["a", "b", "c"] {
            alloc(&mut s, c, &rs).unwrap();
        }
        s.release("a", "eth0").unwrap();
        alloc(&mut s, "last", &rs).unwrap();
    }
    let (bytes, last_start) = journal_with_last_record_offset(d.path());
    let complete = vec![ip("10.22.0.3"), ip("10.22.0.4")];
    for cut in last_start..=bytes.len() {
        let t = temp_dir("torncase");
        std::fs::create_dir_all(t.path().join("net1")).unwrap();
        std::fs::write(t.path().join("net1/journal"), &bytes[..cut]).unwrap();
        let mut s = open(t.path());
        let got = addrs(&mut s);
        if cut == bytes.len() {
            assert_eq!(got, vec![ip("10.22.0.3"), ip("10.22.0.4"), ip("10.22.0.5")]);
            continue;
        }
        assert_eq!(got, complete, "cut at {cut}");
        // The torn bytes are gone, and the store keeps working after them.
        assert_eq!(
            std::fs::metadata(t.path().join("net1/journal"))
                .unwrap()
                .len(),
            last_start as u64
        );
        let a = alloc(&mut s, "after", &rs).unwrap();
        assert_eq!(a[0].address.to_string(), "10.22.0.5/24", "cut at {cut}");
        assert_eq!(addrs(&mut open(t.path())).len(), 3, "cut at {cut}");
    }
}

#[test]
fn compaction_reload_gives_the_same_state() {
    let d = temp_dir("compact");
    let rs = sets("10.22.0.0/24");
    let mut o = opts("boot-a");
    o.compact_threshold = 600; // a few records
    let mut s = Store::open(d.path(), "net1", o).unwrap();
    for i in 0..40 {
        alloc(&mut s, &format!("c{i}"), &rs).unwrap();
        if i % 3 == 0 {
            s.release(&format!("c{}", i / 2), "eth0").unwrap();
        }
    }
    let gen = s.loaded.as_ref().unwrap().generation;
    assert!(gen > 3, "compaction never ran (generation {gen})");
    let snap = crate::snapshot::read(&d.path().join("net1/snapshot"))
        .unwrap()
        .0
        .unwrap();
    assert_eq!(snap.generation, gen);
    let mut fresh = open(d.path());
    fresh.leases().unwrap();
    assert_eq!(fresh.state, s.state);
    // Round-robin position carried through the snapshot.
    let a = alloc(&mut fresh, "next", &rs).unwrap();
    let b = alloc(&mut s, "next2", &rs).unwrap();
    assert_ne!(a, b);

    // A crash between the snapshot's rename and the journal's leaves an older journal
    // whose records are all in the snapshot: it must be skipped, not replayed twice.
    let d2 = temp_dir("compact-crash");
    let mut s2 = open(d2.path());
    alloc(&mut s2, "x", &rs).unwrap();
    s2.release("x", "eth0").unwrap();
    alloc(&mut s2, "y", &rs).unwrap();
    let old_journal = std::fs::read(d2.path().join("net1/journal")).unwrap();
    s2.locked(|st| st.compact()).unwrap();
    std::fs::write(d2.path().join("net1/journal"), &old_journal).unwrap();
    let mut again = open(d2.path());
    assert_eq!(addrs(&mut again), vec![ip("10.22.0.3")]);
    assert_eq!(again.state, s2.state);
}

#[test]
fn another_handle_sees_appends_and_compactions() {
    let d = temp_dir("incr");
    let rs = sets("10.22.0.0/24");
    let mut a = open(d.path());
    let mut b = open(d.path());
    alloc(&mut a, "c1", &rs).unwrap();
    assert_eq!(
        alloc(&mut b, "c2", &rs).unwrap()[0].address.to_string(),
        "10.22.0.3/24"
    );
    assert_eq!(addrs(&mut a).len(), 2);
    a.locked(|st| st.compact()).unwrap();
    assert_eq!(
        alloc(&mut b, "c3", &rs).unwrap()[0].address.to_string(),
        "10.22.0.4/24"
    );
    b.release("c1", "eth0").unwrap();
    assert_eq!(addrs(&mut a), vec![ip("10.22.0.3"), ip("10.22.0.4")]);
    assert_eq!(a.state, b.state);
}

#[test]
fn previous_boot_leases_reclaimed() {
    let (d, rs) = filled_by_previous_boot();
    let mut new = Store::open(d.path(), "net1", opts("boot-b")).unwrap();
    let e = alloc(&mut new, "fresh", &rs).unwrap_err();
    assert!(
        e.to_string()
            .contains("5 of them were leased before the last reboot"),
        "{e}"
    );
    let freed = new.reclaim_previous_boots().unwrap();
    assert_eq!(freed, 5);
    let a = alloc(&mut new, "fresh", &rs).unwrap();
    let freed = new.reclaim_previous_boots().unwrap();
    assert_eq!(freed, 0, "this boot's lease must survive");
    assert_eq!(new.check("fresh", "eth0").unwrap(), a);
    let info = new.leases().unwrap();
    assert_eq!(info[0].boot_id, "boot-b");
}

#[test]
fn separate_handles_allocating_concurrently_get_unique_addresses() {
    let d = temp_dir("conc");
    let rs = Arc::new(sets("10.22.0.0/24"));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let dir = d.path().to_path_buf();
            let rs = Arc::clone(&rs);
            std::thread::spawn(move || {
                // Each thread has its own handle: its own lock fd, like another process.
                let mut s = Store::open(&dir, "net1", opts("boot-a")).unwrap();
                (0..60)
                    .map(|i| {
                        alloc(&mut s, &format!("t{t}-{i}"), &rs).unwrap()[0]
                            .address
                            .addr()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), 240, "duplicate addresses handed out");
    assert_eq!(open(d.path()).leases().unwrap().len(), 240);
    // 253 usable: 13 left, then exhausted.
    let mut s = open(d.path());
    for i in 0..13 {
        alloc(&mut s, &format!("fill{i}"), &rs).unwrap();
    }
    assert_eq!(
        alloc(&mut s, "one-too-many", &rs).unwrap_err().kind(),
        ErrorKind::Exhausted
    );
}

#[test]
fn lock_timeout_is_a_clear_error() {
    let d = temp_dir("locktime");
    let mut o = opts("boot-a");
    o.lock_timeout = Duration::from_millis(50);
    let mut s = Store::open(d.path(), "net1", o).unwrap();
    let holder = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path().join("net1/lock"))
        .unwrap();
    holder.lock().unwrap();
    let e = s.leases().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("waiting for the lock"), "{e}");
    holder.unlock().unwrap();
    s.leases().unwrap();
}

#[test]
fn bad_journal_header_is_refused_not_guessed() {
    let d = temp_dir("hdr");
    std::fs::create_dir_all(d.path().join("net1")).unwrap();
    std::fs::write(d.path().join("net1/journal"), b"garbage-garbage-garbage").unwrap();
    let e = open(d.path()).leases().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Internal);
}

#[test]
fn full_pool_reclaims_previous_boot_leases_when_allowed() {
    let (d, rs) = filled_by_previous_boot();
    let reclaiming = StoreOptions {
        reclaim_when_full: true,
        ..opts("boot-b")
    };
    let mut new = Store::open(d.path(), "net1", reclaiming).unwrap();
    // A lease of this boot survives the reclaim; the full pool makes room.
    let a = alloc(&mut new, "fresh", &rs).unwrap();
    assert_eq!(
        new.leases().unwrap().len(),
        1,
        "only this boot's lease is left"
    );
    assert_eq!(new.check("fresh", "eth0").unwrap(), a);
    // Full again with this boot's leases only: a plain exhaustion error.
    for i in 0..4 {
        alloc(&mut new, &format!("n{i}"), &rs).unwrap();
    }
    let e = alloc(&mut new, "more", &rs).unwrap_err();
    assert!(e.to_string().contains("no free address"), "{e}");
    assert!(!e.to_string().contains("reboot"), "{e}");
}
