//! A pod that comes back with the same address and a new MAC announces it as its
//! interface comes up (arp_notify, and for IPv6 ndisc_notify, as the reference sets
//! them): a peer that talked to the old pod holds the new MAC right after ADD, before
//! the pod sends anything else, and its first ping gets through. The helpers here also
//! serve bridge's test of the same (`bridge::announce`).

use crate::support::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The MAC `ns`'s neighbour table holds for `addr` (`ip -j neigh`), None without an entry.
pub(crate) fn neigh_mac(ns: &str, addr: &str) -> Option<String> {
    let out = ip(&["-n", ns, "-j", "neigh", "show", "to", addr]);
    let entries: Vec<Value> = match out.trim() {
        "" => Vec::new(),
        text => serde_json::from_str(text).unwrap_or_else(|e| panic!("ip -j neigh ({e}): {text}")),
    };
    entries
        .iter()
        .find(|n| n["dst"] == addr)
        .and_then(|n| n["lladdr"].as_str())
        .map(str::to_string)
}

/// Until (at most 2 s) `peer`'s entry for `addr` holds `mac`: the announcement went out
/// with the link going up, so it arrives at once; a peer left with the old MAC waits
/// for its neighbour probes (5 s and more) instead.
pub(crate) fn assert_announced(peer: &str, addr: &str, mac: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let have = neigh_mac(peer, addr);
        if have.as_deref() == Some(mac) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "netns {peer} still has {have:?} for {addr}, not the re-added pod's MAC {mac}: {}",
            ip(&["-n", peer, "neigh"])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One echo with a 1 s wait, no retry: the first packet must reach the pod.
pub(crate) fn assert_first_ping(ns: &str, addr: &str) {
    let (ok, out, _) = sh("ip", &["netns", "exec", ns, "ping", "-c1", "-W1", addr]);
    assert!(
        ok,
        "the first ping from {ns} to {addr} got no answer: {out}"
    );
}

/// `/proc/sys/<key>` as the pod's netns shows it.
pub(crate) fn pod_sysctl(ns: &Netns, key: &str) -> String {
    let path = format!("/proc/sys/{key}");
    let (ok, out, err) = sh("ip", &["netns", "exec", &ns.name, "cat", &path]);
    assert!(ok, "read {path} in {}: {err}", ns.name);
    out.trim().to_string()
}

/// The MAC of interface `i` of a result.
pub(crate) fn result_mac(r: &Value, i: usize) -> String {
    let mac = r["interfaces"][i]["mac"].as_str();
    mac.unwrap_or_else(|| panic!("no MAC of interface {i}: {r}"))
        .to_string()
}

/// Proves: a macvlan pod DELeted and ADDed again with the same static addresses (v4 and
/// v6) and so a new MAC is announced: a peer macvlan on the same master, which pinged the
/// old pod, holds the new MAC for both addresses right after ADD, and its first ping of
/// each gets an answer; arp_notify and ndisc_notify read 1 in the pod, whose link-local
/// address is the EUI-64 one of its new MAC.
#[test]
fn readded_pod_announces_its_new_mac() {
    let env = TestEnv::new("macvlan_readded_pod_announces");
    let (master, _) = env.veth_pair();
    let nets = env.subnets();
    let peer = env.netns();
    let peer_link = env.link_name("mvp");
    ip(&[
        "link", "add", &peer_link, "link", &master, "type", "macvlan", "mode", "bridge",
    ]);
    ip(&["link", "set", &peer_link, "netns", &peer.name]);
    let p = |args: &[&str]| ip(&[&["-n", peer.name.as_str()], args].concat());
    p(&[
        "addr",
        "add",
        &format!("{}/24", nets.v4_addr(1)),
        "dev",
        &peer_link,
    ]);
    let v6 = format!("{}/64", nets.v6_addr(1));
    p(&["addr", "add", &v6, "dev", &peer_link, "nodad"]);
    p(&["link", "set", &peer_link, "up"]);

    let addrs = [nets.v4_addr(2), nets.v6_addr(2)];
    let ipam = json!({"type": "static", "addresses": [
        {"address": format!("{}/24", addrs[0])}, {"address": format!("{}/64", addrs[1])},
    ]});
    let conf = json!({"cniVersion": "1.0.0", "name": "mvannounce", "type": "macvlan",
                      "master": master, "mode": "bridge", "ipam": ipam});
    let pod = env.new_attachment("macvlan", "announce", &conf);
    let old = result_mac(&pod.add(), 0);
    wait_ipv6_ready(Some(&pod.ns.name));
    for addr in &addrs {
        assert_ping(&peer.name, addr);
        assert_eq!(neigh_mac(&peer.name, addr).as_deref(), Some(old.as_str()));
    }

    pod.del();
    let new = result_mac(&pod.add(), 0);
    assert_ne!(new, old, "a new macvlan has a new MAC");
    for addr in &addrs {
        assert_announced(&peer.name, addr, &new);
        assert_first_ping(&peer.name, addr);
    }
    assert_eq!(pod_sysctl(&pod.ns, "net/ipv4/conf/eth0/arp_notify"), "1");
    assert_eq!(pod_sysctl(&pod.ns, "net/ipv6/conf/eth0/ndisc_notify"), "1");
    // Its link-local address is the plugin's (the kernel's EUI-64 one, without DAD).
    let ll = crate::bridge::ipv6::link_locals(Some(&pod.ns.name), "eth0");
    assert_eq!(ll, [crate::bridge::ipv6::eui64_link_local(&new)]);
    pod.del();
}
