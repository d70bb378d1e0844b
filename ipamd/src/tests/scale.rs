//! What the daemon holds does not grow with the number of network names it is asked about.

use crate::server::MAX_OPEN_STORES;
use crate::testutil::{fds_and_threads, in_child, key, req, sets, temp_dir};

use super::daemon::{client, get, start};

#[test]
fn ten_thousand_networks_keep_fds_and_threads_flat() {
    if !in_child("tests::scale::ten_thousand_networks_keep_fds_and_threads_flat") {
        return;
    }
    let d = temp_dir("scale");
    let sock = d.path().join("ipamd.sock");
    let data = d.path().join("data");
    let h = start(d.path());
    let c = client(d.path());
    let rs = sets("10.40.0.0/24");
    c.allocate(&req("warm", "c0", &rs)).unwrap();
    let (fds0, threads0) = fds_and_threads();

    // Reads of names no one allocated in: answered empty, nothing opened or created.
    for i in 0..10_000 {
        let net = format!("unused{i}");
        let (code, body) = get(&sock, &format!("/v1/leases?network={net}"));
        assert_eq!((code, body.as_str()), (200, r#"{"leases":[]}"#));
        if i % 100 == 0 {
            assert!(c.check(&key(&net, "x")).unwrap().is_empty());
            c.status(&net, &rs).unwrap();
            c.release(&key(&net, "x")).unwrap();
            assert_eq!(c.gc(&net, &[]).unwrap(), 0);
        }
    }
    let entries = std::fs::read_dir(&data).unwrap().count();
    assert_eq!(entries, 2, "only .daemon.lock and warm/ exist");
    let (fds1, threads1) = fds_and_threads();
    assert!(fds1 <= fds0 + 2, "fds {fds0} -> {fds1} after 10,000 reads");
    assert!(
        threads1 <= threads0 + 1,
        "threads {threads0} -> {threads1} after 10,000 reads"
    );

    // Allocations in many more networks than may be open at once.
    let mut peak = (0, 0);
    for i in 0..4 * MAX_OPEN_STORES {
        let net = format!("busy{i}");
        let a = c.allocate(&req(&net, "c1", &rs)).unwrap();
        assert_eq!(a[0].address.to_string(), "10.40.0.2/24");
        let (f, t) = fds_and_threads();
        peak = (peak.0.max(f), peak.1.max(t));
    }
    // Each open store is two fds (lock, journal) and one writer thread.
    assert!(
        peak.0 <= fds0 + 2 * MAX_OPEN_STORES + 4,
        "fds {fds0} -> peak {}",
        peak.0
    );
    assert!(
        peak.1 <= threads0 + MAX_OPEN_STORES + 2,
        "threads {threads0} -> peak {}",
        peak.1
    );
    // Every lease is still there once its store was closed and opened again.
    assert_eq!(c.leases(None).unwrap().len(), 4 * MAX_OPEN_STORES + 1);
    h.stop().unwrap();
}
