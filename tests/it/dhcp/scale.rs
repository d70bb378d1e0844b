//! Many pods at once through one daemon.

use super::*;
use std::collections::BTreeSet;

const PODS: usize = 32;

/// Proves: 32 macvlan pods ADDed at the same time (each its own netns) all get leases,
/// all distinct and each on its pod's eth0, dnsmasq lists all 32 by their client
/// identifiers; DELs at the same time release every one and leave no record. The wall
/// times are printed, not asserted.
#[test]
fn thirty_two_pods_at_once_get_distinct_leases_and_release_them() {
    let lan = Lan::with_dnsmasq("dhcp_scale", &[]);
    let env = &lan.env;
    let flags = [
        "-timeout",
        "2s",
        "-resendmax",
        "4s",
        "-resendtimeout",
        "30s",
    ];
    let daemon = DhcpDaemon::start_with(env, &flags);
    let conf = macvlan_conf("1.0.0", &lan.master, &daemon.socket);
    let pods: Vec<_> = (0..PODS)
        .map(|i| env.new_attachment("macvlan", &format!("s{i}"), &conf))
        .collect();

    let started = Instant::now();
    let results: Vec<(Value, Duration)> = std::thread::scope(|scope| {
        let running: Vec<_> = pods
            .iter()
            .map(|p| {
                scope.spawn(move || {
                    let t = Instant::now();
                    (p.add(), t.elapsed())
                })
            })
            .collect();
        running
            .into_iter()
            .map(|h| h.join().expect("an ADD thread panicked"))
            .collect()
    });
    let add_wall = started.elapsed();
    let slowest = results.iter().map(|(_, d)| *d).max().unwrap_or_default();

    let mut seen = BTreeSet::new();
    for (pod, (r, _)) in pods.iter().zip(&results) {
        let addr = assert_leased(r, &pod.ns);
        assert_eq!(lan.dnsmasq_lease(&pod.id).as_deref(), Some(addr.as_str()));
        assert!(seen.insert(addr.clone()), "{addr} given twice");
    }
    assert_eq!(seen.len(), PODS);
    assert_eq!(daemon.records().len(), PODS);

    let started = Instant::now();
    std::thread::scope(|scope| {
        for p in &pods {
            scope.spawn(move || p.del());
        }
    });
    let del_wall = started.elapsed();
    for pod in &pods {
        lan.wait_dnsmasq_forgets(&pod.id, Duration::from_secs(5));
    }
    daemon.assert_no_records();
    println!(
        "dhcp scale: {PODS} ADDs at once took {add_wall:?} (slowest {slowest:?}), \
         {PODS} DELs at once {del_wall:?}"
    );
}
