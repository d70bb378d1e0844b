//! The plugin without a daemon on a store that has been compacted: calls go through the
//! snapshot's index, a store without one (as the previous release leaves it) keeps
//! working and gets one, and a daemon on the same files sees the same leases.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// ADDs until the journal has been compacted at least once (the in-process path compacts
/// past 64 KiB), keeping `keep` attachments; their (container ID, address).
fn churn_until_compacted(fix: &Fix, conf: &Value, keep: usize) -> Vec<(String, IpAddr)> {
    let kept: Vec<(String, IpAddr)> = (0..keep)
        .map(|i| {
            let cid = format!("kept{i}");
            let a = only_addr(&fix.add(&cid, conf).result());
            (cid, a)
        })
        .collect();
    let snapshot = fix.data.join(NET).join("snapshot");
    for i in 0..2000 {
        if snapshot.exists() {
            return kept;
        }
        let cid = format!("churn{i}");
        fix.add(&cid, conf).result();
        fix.del(&cid, conf).ok();
    }
    panic!("the journal was never compacted");
}

#[test]
fn in_process_calls_use_the_index_and_a_store_without_one_gets_it() {
    let mut fix = Fix::new("ipamd_index", Mode::InProcess);
    let conf = fix.conf_24();
    let kept = churn_until_compacted(&fix, &conf, 40);
    let index = fix.data.join(NET).join("index");
    let mode = std::fs::metadata(&index)
        .expect("an index")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // The previous release's store: the same snapshot and journal, no index.
    std::fs::remove_file(&index).unwrap();
    // A repeated ADD finds the lease in the snapshot: the same address.
    assert_eq!(only_addr(&fix.add("kept3", &conf).result()), kept[3].1);
    assert!(index.exists(), "the index was not written again");
    let fresh = only_addr(&fix.add("fresh", &conf).result());
    assert!(
        kept.iter().all(|k| k.1 != fresh),
        "{fresh} handed out twice"
    );
    fix.del("kept5", &conf).ok();

    // A stale index (of an older snapshot) is not believed.
    let stale = std::fs::read(&index).unwrap();
    let more = churn_until_recompacted(&fix, &conf);
    std::fs::write(&index, &stale).unwrap();
    let after = only_addr(&fix.add("after-stale", &conf).result());
    assert_ne!(after, more, "{after} handed out twice");

    let mut want: Vec<IpAddr> = kept
        .iter()
        .filter(|k| k.0 != "kept5")
        .map(|k| k.1)
        .chain([fresh, more, after])
        .collect();
    want.sort();
    let got = |fix: &Fix| {
        let mut v: Vec<IpAddr> = fix.leases().iter().map(|l| l.addr).collect();
        v.sort();
        v
    };
    assert_eq!(got(&fix), want);
    // The daemon reads the same files the whole way and sees the same leases.
    fix.start_daemon(&[], &[]);
    assert_eq!(got(&fix), want);
}

/// One more lease, then ADD/DEL until the snapshot changes; that lease's address.
fn churn_until_recompacted(fix: &Fix, conf: &Value) -> IpAddr {
    let snapshot = fix.data.join(NET).join("snapshot");
    let before = std::fs::read(&snapshot).unwrap();
    let a = only_addr(&fix.add("more", conf).result());
    for i in 0..2000 {
        if std::fs::read(&snapshot).unwrap() != before {
            return a;
        }
        let cid = format!("again{i}");
        fix.add(&cid, conf).result();
        fix.del(&cid, conf).ok();
    }
    panic!("the journal was never compacted again");
}
