//! bridge plugin, end to end on the kernel: the version matrix with real
//! traffic (IPv4 and IPv6) for both IPAMs, DEL robustness, rollback of failed
//! ADDs, port flags / MTU / MAC, and a differential run against the reference
//! /usr/lib/cni/bridge.

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const NET: &str = "itnet";

/// A gateway bridge config: isGateway + isDefaultGateway on `bridge`.
fn conf(version: &str, bridge: &str, ipam: Value) -> Value {
    json!({
        "cniVersion": version,
        "name": NET,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "isDefaultGateway": true,
        "ipam": ipam,
    })
}

fn with(mut c: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().expect("object") {
        c[k] = v.clone();
    }
    c
}

fn cid(tag: &str) -> String {
    format!("ctr-{tag}-{}", short_hash())
}

/// Wait (up to 5 s) until `cond` holds; the kernel tears a netns down asynchronously.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The interface-carrying layouts (0.3.0 and later).
fn has_interfaces(version: &str) -> bool {
    !matches!(version, "0.1.0" | "0.2.0")
}

/// Check that `r` is printed in the layout of `version` and carries what a
/// gateway bridge attachment in `nets` must carry.
fn check_layout(version: &str, r: &Value, nets: &Subnets, bridge: &str, ns: &Netns) {
    assert_eq!(r["cniVersion"], version, "{r}");
    let gw4 = nets.v4_addr(1);
    let gw6 = nets.v6_addr(1);
    if !has_interfaces(version) {
        let k = keys(r);
        for key in &k {
            assert!(
                ["cniVersion", "ip4", "ip6", "dns"].contains(&key.as_str()),
                "0.2.0 layout has no {key}: {r}"
            );
        }
        let ip4 = r["ip4"]["ip"]
            .as_str()
            .unwrap_or_else(|| panic!("no ip4.ip: {r}"));
        assert!(
            ip4.starts_with(nets.v4.trim_end_matches("0/24")) && ip4.ends_with("/24"),
            "{r}"
        );
        assert_eq!(r["ip4"]["gateway"], gw4, "{r}");
        assert!(
            r["ip4"]["routes"]
                .as_array()
                .is_some_and(|a| a.contains(&json!({"dst": "0.0.0.0/0", "gw": gw4}))),
            "ip4.routes needs the default route: {r}"
        );
        let ip6 = r["ip6"]["ip"]
            .as_str()
            .unwrap_or_else(|| panic!("no ip6.ip: {r}"));
        assert!(ip6.ends_with("/64"), "{r}");
        assert_eq!(r["ip6"]["gateway"], gw6, "{r}");
        assert!(
            r["ip6"]["routes"]
                .as_array()
                .is_some_and(|a| a.contains(&json!({"dst": "::/0", "gw": gw6}))),
            "ip6.routes needs the default route: {r}"
        );
        return;
    }
    assert!(
        r.get("ip4").is_none() && r.get("ip6").is_none(),
        "no legacy blocks after 0.2.0: {r}"
    );
    let ifs = r["interfaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no interfaces: {r}"));
    assert_eq!(
        ifs.len(),
        3,
        "interfaces must be [bridge, host veth, container]: {r}"
    );
    assert_eq!(ifs[0]["name"], bridge, "{r}");
    assert!(ifs[0].get("sandbox").is_none(), "{r}");
    assert!(
        ifs[1]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("veth")),
        "{r}"
    );
    assert!(ifs[1].get("sandbox").is_none(), "{r}");
    assert_eq!(ifs[2]["name"], "eth0", "{r}");
    assert_eq!(ifs[2]["sandbox"], ns.path, "{r}");
    for i in ifs {
        let mac = i["mac"].as_str().unwrap_or("");
        assert_eq!(mac.len(), 17, "interface MAC missing: {r}");
    }
    let ips = r["ips"].as_array().unwrap_or_else(|| panic!("no ips: {r}"));
    assert_eq!(ips.len(), 2, "one IPv4 and one IPv6 address: {r}");
    for ip in ips {
        let addr = ip["address"].as_str().unwrap();
        let v6 = addr.contains(':');
        assert_eq!(
            ip["interface"], 2,
            "ips point at the container interface: {r}"
        );
        assert_eq!(ip["gateway"], if v6 { &gw6 } else { &gw4 }.as_str(), "{r}");
        if matches!(version, "0.3.0" | "0.3.1" | "0.4.0") {
            assert_eq!(
                ip["version"],
                if v6 { "6" } else { "4" },
                "0.3.x/0.4.0 tag ips[].version: {r}"
            );
            assert_eq!(keys(ip).len(), 4, "{r}");
            let first = serde_json::to_string(ip).unwrap();
            assert!(
                first.starts_with("{\"version\""),
                "version comes first: {first}"
            );
        } else {
            assert!(ip.get("version").is_none(), "1.x has no ips[].version: {r}");
        }
    }
    let routes = r["routes"]
        .as_array()
        .unwrap_or_else(|| panic!("no routes: {r}"));
    assert!(
        routes.contains(&json!({"dst": "0.0.0.0/0", "gw": gw4})),
        "{r}"
    );
    assert!(routes.contains(&json!({"dst": "::/0", "gw": gw6})), "{r}");
    assert!(r["dns"].is_object(), "{r}");
}

/// Addresses (addr/prefix) the result gives the container, in any layout.
fn addresses_of(version: &str, r: &Value) -> BTreeSet<String> {
    if has_interfaces(version) {
        result_addresses(r).into_iter().collect()
    } else {
        ["ip4", "ip6"]
            .iter()
            .filter_map(|k| r[k]["ip"].as_str().map(str::to_string))
            .collect()
    }
}

fn bare(a: &str) -> String {
    a.split('/').next().unwrap().to_string()
}

/// The version matrix body: two containers on one bridge, layout, kernel
/// state, pings v4/v6 (each other and the gateway), CHECK, DEL, DEL again.
fn matrix(version: &str, kind: Ipam) {
    let env = TestEnv::new(&format!("bridge_matrix_{version}_{kind:?}"));
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let ipam = env.ipam(kind, nets.dual_ranges());
    let c = conf(version, &br, ipam.clone());
    let (a, b) = (env.netns(), env.netns());
    let (ida, idb) = (cid("a"), cid("b"));

    if version == "1.1.0" && kind == Ipam::HostLocal {
        // Debian's host-local (plugins 1.1.1) speaks up to 1.0.0: the delegate's
        // own error must come through unchanged, and nothing may be left.
        let e = env
            .plugin("bridge")
            .attach("ADD", &ida, &a, "eth0")
            .conf(&c)
            .run()
            .err();
        assert_eq!(
            e.code, 1,
            "host-local's incompatible-version error passes through: {e:?}"
        );
        assert!(
            e.msg.contains("host-local")
                && (e.msg.contains("1.1.0") || e.details.contains("1.1.0")),
            "the message names the delegate and the version: {e:?}"
        );
        assert_eq!(
            link_names(Some(&a.name)),
            ["lo".to_string()].into(),
            "failed ADD left links"
        );
        assert!(
            bridge_ports(&br).is_empty(),
            "failed ADD left a port on the bridge"
        );
        return;
    }

    let ports_before = bridge_ports(&br);
    assert!(ports_before.is_empty());
    let ra = env
        .plugin("bridge")
        .attach("ADD", &ida, &a, "eth0")
        .conf(&c)
        .run()
        .result();
    let ports_a = bridge_ports(&br);
    let rb = env
        .plugin("bridge")
        .attach("ADD", &idb, &b, "eth0")
        .conf(&c)
        .run()
        .result();
    let ports_ab = bridge_ports(&br);
    check_layout(version, &ra, &nets, &br, &a);
    check_layout(version, &rb, &nets, &br, &b);
    assert_eq!(ports_a.len(), 1, "one port per attachment");
    assert_eq!(ports_ab.len(), 2, "one port per attachment");
    if has_interfaces(version) {
        assert!(
            ports_a.contains(ra["interfaces"][1]["name"].as_str().unwrap()),
            "host veth of A is a bridge port"
        );
        assert!(
            ports_ab.contains(rb["interfaces"][1]["name"].as_str().unwrap()),
            "host veth of B is a bridge port"
        );
    }
    assert_eq!(
        env.lease_count(&ipam, NET),
        4,
        "two containers × (v4 + v6) leases"
    );

    // Kernel state matches the results.
    for (ns, r) in [(&a, &ra), (&b, &rb)] {
        let l = link(Some(&ns.name), "eth0").expect("eth0 in the container");
        assert_eq!(link_kind(&l), Some("veth"));
        assert!(
            l["flags"].as_array().unwrap().contains(&json!("UP")),
            "eth0 is up"
        );
        if has_interfaces(version) {
            assert_eq!(
                l["address"], r["interfaces"][2]["mac"],
                "container MAC as reported"
            );
        }
        assert_eq!(
            addrs(Some(&ns.name), "eth0"),
            addresses_of(version, r),
            "container addresses"
        );
        assert!(routes(Some(&ns.name), "-4")
            .contains(&format!("default via {} dev eth0", nets.v4_addr(1))));
        assert!(routes(Some(&ns.name), "-6")
            .contains(&format!("default via {} dev eth0", nets.v6_addr(1))));
    }
    let gw_addrs = addrs(None, &br);
    assert!(
        gw_addrs.contains(&format!("{}/24", nets.v4_addr(1))),
        "gateway on the bridge: {gw_addrs:?}"
    );
    assert!(
        gw_addrs.contains(&format!("{}/64", nets.v6_addr(1))),
        "gateway on the bridge: {gw_addrs:?}"
    );

    // Real traffic, both families, both directions, and the gateway.
    wait_ipv6_ready(Some(&a.name));
    wait_ipv6_ready(Some(&b.name));
    wait_ipv6_ready(None);
    let a4 = bare(
        addresses_of(version, &ra)
            .iter()
            .find(|x| !x.contains(':'))
            .unwrap(),
    );
    let a6 = bare(
        addresses_of(version, &ra)
            .iter()
            .find(|x| x.contains(':'))
            .unwrap(),
    );
    let b4 = bare(
        addresses_of(version, &rb)
            .iter()
            .find(|x| !x.contains(':'))
            .unwrap(),
    );
    let b6 = bare(
        addresses_of(version, &rb)
            .iter()
            .find(|x| x.contains(':'))
            .unwrap(),
    );
    assert_ping(&a.name, &b4);
    assert_ping(&a.name, &b6);
    assert_ping(&b.name, &a4);
    assert_ping(&b.name, &a6);
    assert_ping(&a.name, &nets.v4_addr(1));
    assert_ping(&a.name, &nets.v6_addr(1));

    // CHECK exists from 0.4.0 on.
    if !matches!(version, "0.2.0" | "0.3.1") {
        for (id, ns, r) in [(&ida, &a, &ra), (&idb, &b, &rb)] {
            env.plugin("bridge")
                .attach("CHECK", id, ns, "eth0")
                .conf(&with_prev(&c, r))
                .run()
                .ok_silent();
        }
    }

    // DEL, DEL again; the veth is gone from the netns and from the bridge.
    for _ in 0..2 {
        env.plugin("bridge")
            .attach("DEL", &ida, &a, "eth0")
            .conf(&c)
            .run()
            .ok_silent();
    }
    assert!(link(Some(&a.name), "eth0").is_none(), "DEL removes eth0");
    assert_eq!(bridge_ports(&br).len(), 1, "DEL removes A's host veth");
    assert_eq!(
        env.lease_count(&ipam, NET),
        2,
        "DEL releases A's leases only"
    );
    assert_ping(&b.name, &nets.v4_addr(1));
    for _ in 0..2 {
        env.plugin("bridge")
            .attach("DEL", &idb, &b, "eth0")
            .conf(&c)
            .run()
            .ok_silent();
    }
    assert!(link(Some(&b.name), "eth0").is_none());
    assert!(bridge_ports(&br).is_empty(), "no veth left on the bridge");
    for p in ports_ab {
        assert!(link(None, &p).is_none(), "host veth {p} still exists");
    }
    assert_eq!(env.lease_count(&ipam, NET), 0, "all leases released");
    if kind == Ipam::IpamdDaemon {
        assert!(
            ipamd_daemon_allocations(&ipam) >= 2,
            "the daemon, not the in-process fallback, served the ADDs"
        );
    }
}

/// Proves: bridge with ipamd served by its daemon (0.4.0: CHECK too).
#[test]
fn matrix_0_4_0_ipamd_daemon() {
    matrix("0.4.0", Ipam::IpamdDaemon);
}
/// Proves: bridge with ipamd served by its daemon, 1.1.0 layout.
#[test]
fn matrix_1_1_0_ipamd_daemon() {
    matrix("1.1.0", Ipam::IpamdDaemon);
}

// One test per cell, so a failure names its version and IPAM.

/// Proves: matrix cell 0.2.0 × host-local (legacy ip4/ip6 layout).
#[test]
fn matrix_0_2_0_host_local() {
    matrix("0.2.0", Ipam::HostLocal);
}
/// Proves: matrix cell 0.2.0 × ipamd.
#[test]
fn matrix_0_2_0_ipamd() {
    matrix("0.2.0", Ipam::Ipamd);
}
/// Proves: matrix cell 0.3.1 × host-local (ips[].version layout, no CHECK).
#[test]
fn matrix_0_3_1_host_local() {
    matrix("0.3.1", Ipam::HostLocal);
}
/// Proves: matrix cell 0.3.1 × ipamd.
#[test]
fn matrix_0_3_1_ipamd() {
    matrix("0.3.1", Ipam::Ipamd);
}
/// Proves: matrix cell 0.4.0 × host-local (with CHECK).
#[test]
fn matrix_0_4_0_host_local() {
    matrix("0.4.0", Ipam::HostLocal);
}
/// Proves: matrix cell 0.4.0 × ipamd.
#[test]
fn matrix_0_4_0_ipamd() {
    matrix("0.4.0", Ipam::Ipamd);
}
/// Proves: matrix cell 1.0.0 × host-local.
#[test]
fn matrix_1_0_0_host_local() {
    matrix("1.0.0", Ipam::HostLocal);
}
/// Proves: matrix cell 1.0.0 × ipamd.
#[test]
fn matrix_1_0_0_ipamd() {
    matrix("1.0.0", Ipam::Ipamd);
}
/// Proves: 1.1.0 × host-local: the reference host-local refuses 1.1.0 and
/// its error (code 1) reaches the runtime, with nothing left behind.
#[test]
fn matrix_1_1_0_host_local() {
    matrix("1.1.0", Ipam::HostLocal);
}
/// Proves: matrix cell 1.1.0 × ipamd.
#[test]
fn matrix_1_1_0_ipamd() {
    matrix("1.1.0", Ipam::Ipamd);
}

// ------------------------------------------------------------------ DEL robustness

/// ADD one container; returns (conf, ipam, netns, container id, result).
fn add_one(env: &TestEnv, kind: Ipam, br: &str) -> (Value, Value, Netns, String, Value) {
    let nets = env.subnets();
    let ipam = env.ipam(kind, nets.dual_ranges());
    let c = conf("1.0.0", br, ipam.clone());
    let ns = env.netns();
    let id = cid("del");
    let r = env
        .plugin("bridge")
        .attach("ADD", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .result();
    assert_eq!(env.lease_count(&ipam, NET), 2);
    (c, ipam, ns, id, r)
}

/// Proves: DEL succeeds (twice) after the netns was deleted, releases the
/// leases, and the host veth disappears.
#[test]
fn del_after_netns_deleted() {
    let env = TestEnv::new("del_after_netns_deleted");
    for kind in Ipam::BOTH {
        let br = env.link_name("cbr");
        let (c, ipam, ns, id, r) = add_one(&env, kind, &br);
        env.del_netns(&ns);
        for _ in 0..2 {
            env.plugin("bridge")
                .attach("DEL", &id, &ns, "eth0")
                .conf(&c)
                .run()
                .ok_silent();
        }
        assert_eq!(env.lease_count(&ipam, NET), 0, "{kind:?}: leases released");
        let veth = r["interfaces"][1]["name"].as_str().unwrap().to_string();
        eventually("the host veth is gone", || link(None, &veth).is_none());
    }
}

/// Proves: DEL succeeds (twice) after the bridge was deleted, and still
/// removes the container interface and the leases.
#[test]
fn del_after_bridge_deleted() {
    let env = TestEnv::new("del_after_bridge_deleted");
    for kind in Ipam::BOTH {
        let br = env.link_name("cbr");
        let (c, ipam, ns, id, _) = add_one(&env, kind, &br);
        ip(&["link", "del", &br]);
        for _ in 0..2 {
            env.plugin("bridge")
                .attach("DEL", &id, &ns, "eth0")
                .conf(&c)
                .run()
                .ok_silent();
        }
        assert!(
            link(Some(&ns.name), "eth0").is_none(),
            "{kind:?}: eth0 removed"
        );
        assert_eq!(env.lease_count(&ipam, NET), 0, "{kind:?}: leases released");
    }
}

/// Proves: DEL with an empty (or absent) CNI_NETNS succeeds and releases the
/// leases (the spec makes CNI_NETNS optional for DEL).
#[test]
fn del_with_empty_netns() {
    let env = TestEnv::new("del_with_empty_netns");
    for kind in Ipam::BOTH {
        let br = env.link_name("cbr");
        let (c, ipam, _ns, id, _) = add_one(&env, kind, &br);
        env.plugin("bridge")
            .command("DEL")
            .container(&id)
            .ifname("eth0")
            .netns_path("")
            .conf(&c)
            .run()
            .ok_silent();
        assert_eq!(env.lease_count(&ipam, NET), 0, "{kind:?}: leases released");
        env.plugin("bridge")
            .command("DEL")
            .container(&id)
            .ifname("eth0")
            .conf(&c)
            .run()
            .ok_silent();
    }
}

/// Proves: DEL of an attachment that never existed succeeds.
#[test]
fn del_of_unknown_attachment() {
    let env = TestEnv::new("del_of_unknown_attachment");
    let ns = env.netns();
    for kind in Ipam::BOTH {
        let nets = env.subnets();
        let c = conf(
            "1.0.0",
            &env.link_name("cbr"),
            env.ipam(kind, nets.dual_ranges()),
        );
        env.plugin("bridge")
            .attach("DEL", &cid("never"), &ns, "eth0")
            .conf(&c)
            .run()
            .ok_silent();
        env.plugin("bridge")
            .attach(
                "DEL",
                &cid("never"),
                &Netns {
                    name: "x".into(),
                    path: "/run/netns/nonexistent".into(),
                },
                "eth0",
            )
            .conf(&c)
            .run()
            .ok_silent();
    }
}

// ------------------------------------------------------------------ failed ADD

/// Proves: when IPAM is exhausted (/30 with a gateway: one usable address),
/// the second ADD fails, leaves no veth (neither in its netns nor on the
/// bridge) and no reservation; after DEL of the first, the address is free again.
#[test]
fn failed_add_pool_exhausted_leaves_nothing() {
    let env = TestEnv::new("failed_add_pool_exhausted_leaves_nothing");
    for kind in Ipam::BOTH {
        let nets = env.subnets();
        let br = env.link_name("cbr");
        let ipam = env.ipam(kind, json!([[{"subnet": nets.v4_slash30(0)}]]));
        let c = conf("1.0.0", &br, ipam.clone());
        let (n1, n2) = (env.netns(), env.netns());
        let (id1, id2) = (cid("one"), cid("two"));
        let r1 = env
            .plugin("bridge")
            .attach("ADD", &id1, &n1, "eth0")
            .conf(&c)
            .run()
            .result();
        assert_eq!(
            first_addr(&r1, false),
            nets.v4_addr(2),
            "{kind:?}: the only usable address"
        );
        let ports = bridge_ports(&br);
        let leases = env.lease_count(&ipam, NET);
        assert_eq!(leases, 1);

        let e = env
            .plugin("bridge")
            .attach("ADD", &id2, &n2, "eth0")
            .conf(&c)
            .run()
            .err();
        eprintln!("{kind:?}: exhausted ADD failed with {e:?}");
        if kind == Ipam::Ipamd {
            assert_eq!(
                e.code, 103,
                "ipamd exhaustion is 'address unavailable': {e:?}"
            );
        }
        assert_eq!(
            link_names(Some(&n2.name)),
            ["lo".to_string()].into(),
            "{kind:?}: no veth left in the netns"
        );
        assert_eq!(
            bridge_ports(&br),
            ports,
            "{kind:?}: no veth left on the bridge"
        );
        assert_eq!(
            env.lease_count(&ipam, NET),
            leases,
            "{kind:?}: no reservation left"
        );

        env.plugin("bridge")
            .attach("DEL", &id1, &n1, "eth0")
            .conf(&c)
            .run()
            .ok_silent();
        assert_eq!(env.lease_count(&ipam, NET), 0);
        let r2 = env
            .plugin("bridge")
            .attach("ADD", &id2, &n2, "eth0")
            .conf(&c)
            .run()
            .result();
        assert_eq!(
            first_addr(&r2, false),
            nets.v4_addr(2),
            "{kind:?}: the address is free again"
        );
        env.plugin("bridge")
            .attach("DEL", &id2, &n2, "eth0")
            .conf(&c)
            .run()
            .ok_silent();
    }
}

/// Proves: ADD of an ifname already present in the netns fails with 102
/// naming the interface, takes no lease, adds no bridge port, and leaves the
/// existing interface alone.
#[test]
fn failed_add_ifname_exists() {
    let env = TestEnv::new("failed_add_ifname_exists");
    for kind in Ipam::BOTH {
        let nets = env.subnets();
        let br = env.link_name("cbr");
        let ipam = env.ipam(kind, nets.dual_ranges());
        let c = conf("1.0.0", &br, ipam.clone());
        let ns = env.netns();
        // An eth0 that is not ours: one end of a veth pair moved into the netns.
        let (_host_end, peer) = env.veth_pair();
        ip(&["link", "set", &peer, "netns", &ns.name]);
        ip(&["-n", &ns.name, "link", "set", &peer, "name", "eth0"]);
        let before = link(Some(&ns.name), "eth0").unwrap();

        env.plugin("bridge")
            .attach("ADD", &cid("dup"), &ns, "eth0")
            .conf(&c)
            .run()
            .expect_err(102, &["eth0", "exists"]);
        assert_eq!(env.lease_count(&ipam, NET), 0, "{kind:?}: no lease taken");
        assert!(bridge_ports(&br).is_empty(), "{kind:?}: no port added");
        let after = link(Some(&ns.name), "eth0").expect("the existing eth0 survives");
        assert_eq!(before["ifindex"], after["ifindex"]);
        assert_eq!(before["address"], after["address"]);
    }
}

/// Proves: a failing IPAM delegate (a plugin that is not in CNI_PATH) makes
/// ADD fail cleanly with no veth left behind.
#[test]
fn failed_add_missing_ipam_plugin() {
    let env = TestEnv::new("failed_add_missing_ipam_plugin");
    let br = env.link_name("cbr");
    let ns = env.netns();
    let c = conf(
        "1.0.0",
        &br,
        json!({"type": "no-such-ipam", "subnet": "10.0.0.0/24"}),
    );
    env.plugin("bridge")
        .attach("ADD", &cid("noipam"), &ns, "eth0")
        .conf(&c)
        .run()
        .expect_err(104, &["no-such-ipam"]);
    assert_eq!(link_names(Some(&ns.name)), ["lo".to_string()].into());
    assert!(bridge_ports(&br).is_empty());
}

// ------------------------------------------------------------------ CHECK

/// Proves: CHECK notices a missing address, a missing route, and a missing
/// interface, and fails without prevResult.
#[test]
fn check_detects_drift() {
    let env = TestEnv::new("check_detects_drift");
    let br = env.link_name("cbr");
    let (c, _ipam, ns, id, r) = add_one(&env, Ipam::Ipamd, &br);
    let check = || env.plugin("bridge").attach("CHECK", &id, &ns, "eth0");
    check().conf(&with_prev(&c, &r)).run().ok_silent();
    check().conf(&c).run().err();

    let v4 = result_addresses(&r)
        .into_iter()
        .find(|a| !a.contains(':'))
        .unwrap();
    ip(&["-n", &ns.name, "route", "del", "default"]);
    let e = check().conf(&with_prev(&c, &r)).run().err();
    assert!(e.msg.contains("route"), "{e:?}");
    ip(&["-n", &ns.name, "addr", "del", &v4, "dev", "eth0"]);
    let e = check().conf(&with_prev(&c, &r)).run().err();
    assert!(e.msg.contains(&bare(&v4)), "{e:?}");
    ip(&["-n", &ns.name, "link", "del", "eth0"]);
    let e = check().conf(&with_prev(&c, &r)).run().err();
    assert!(e.msg.contains("eth0"), "{e:?}");
    env.plugin("bridge")
        .attach("DEL", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .ok_silent();
}

// ------------------------------------------------------------------ options

/// Proves: hairpinMode shows up as hairpin on the host port; without it, off.
#[test]
fn hairpin_mode_sets_port_flag() {
    let env = TestEnv::new("hairpin_mode_sets_port_flag");
    for hairpin in [true, false] {
        let nets = env.subnets();
        let br = env.link_name("cbr");
        let c = with(
            conf("1.0.0", &br, env.ipam(Ipam::Ipamd, nets.v4_ranges())),
            json!({"hairpinMode": hairpin}),
        );
        let ns = env.netns();
        let id = cid("hp");
        let r = env
            .plugin("bridge")
            .attach("ADD", &id, &ns, "eth0")
            .conf(&c)
            .run()
            .result();
        let veth = r["interfaces"][1]["name"].as_str().unwrap();
        let l = link(None, veth).expect("host veth");
        assert_eq!(l["master"], br.as_str());
        assert_eq!(l["linkinfo"]["info_slave_data"]["hairpin"], hairpin, "{l}");
        env.plugin("bridge")
            .attach("DEL", &id, &ns, "eth0")
            .conf(&c)
            .run()
            .ok_silent();
    }
}

/// Proves: promiscMode puts the bridge in promiscuous mode.
#[test]
fn promisc_mode_sets_bridge_promisc() {
    let env = TestEnv::new("promisc_mode_sets_bridge_promisc");
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let c = with(
        conf("1.0.0", &br, env.ipam(Ipam::Ipamd, nets.v4_ranges())),
        json!({"promiscMode": true}),
    );
    let ns = env.netns();
    let id = cid("pm");
    env.plugin("bridge")
        .attach("ADD", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .result();
    let l = link(None, &br).expect("bridge");
    assert!(
        l["promiscuity"].as_u64().unwrap_or(0) >= 1
            || l["flags"].as_array().unwrap().contains(&json!("PROMISC")),
        "{l}"
    );
    env.plugin("bridge")
        .attach("DEL", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .ok_silent();
}

/// Proves: mtu is honoured on the container interface and the host veth
/// (and traffic still flows).
#[test]
fn mtu_is_honoured() {
    let env = TestEnv::new("mtu_is_honoured");
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let c = with(
        conf("1.0.0", &br, env.ipam(Ipam::Ipamd, nets.v4_ranges())),
        json!({"mtu": 1400}),
    );
    let ns = env.netns();
    let id = cid("mtu");
    let r = env
        .plugin("bridge")
        .attach("ADD", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .result();
    assert_eq!(link(Some(&ns.name), "eth0").unwrap()["mtu"], 1400);
    assert_eq!(
        link(None, r["interfaces"][1]["name"].as_str().unwrap()).unwrap()["mtu"],
        1400
    );
    assert_ping(&ns.name, &nets.v4_addr(1));
    env.plugin("bridge")
        .attach("DEL", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .ok_silent();
}

/// Proves: a requested MAC is honoured, from runtimeConfig.mac (capability),
/// args.cni.mac and CNI_ARGS MAC=, and is reported in the result.
#[test]
fn requested_mac_is_honoured() {
    let env = TestEnv::new("requested_mac_is_honoured");
    let cases: [(&str, &str); 3] = [
        ("runtimeConfig", "0a:58:0a:01:02:03"),
        ("args", "0A:58:0A:01:02:04"),
        ("CNI_ARGS", "0a:58:0a:01:02:05"),
    ];
    for (how, mac) in cases {
        let nets = env.subnets();
        let br = env.link_name("cbr");
        let mut c = conf("1.0.0", &br, env.ipam(Ipam::Ipamd, nets.v4_ranges()));
        let ns = env.netns();
        let id = cid("mac");
        let mut call = env.plugin("bridge").attach("ADD", &id, &ns, "eth0");
        match how {
            "runtimeConfig" => {
                c["capabilities"] = json!({"mac": true});
                c["runtimeConfig"] = json!({"mac": mac});
            }
            "args" => c["args"] = json!({"cni": {"mac": mac}}),
            _ => call = call.cni_args(&format!("MAC={mac}")),
        }
        let r = call.conf(&c).run().result();
        let want = mac.to_ascii_lowercase();
        assert_eq!(r["interfaces"][2]["mac"], want.as_str(), "{how}: {r}");
        assert_eq!(
            link(Some(&ns.name), "eth0").unwrap()["address"],
            want.as_str(),
            "{how}"
        );
        let check = env.plugin("bridge").attach("CHECK", &id, &ns, "eth0");
        let check = if how == "CNI_ARGS" {
            check.cni_args(&format!("MAC={mac}"))
        } else {
            check
        };
        check.conf(&with_prev(&c, &r)).run().ok_silent();
        env.plugin("bridge")
            .attach("DEL", &id, &ns, "eth0")
            .conf(&c)
            .run()
            .ok_silent();
    }
}

/// Proves: the reference's vlanTrunk keys (id, minID, maxID) are accepted
/// (this kernel may lack VLAN filtering: then a kernel error, never code 7).
#[test]
fn vlan_trunk_keys_are_the_reference_ones() {
    let env = TestEnv::new("vlan_trunk_keys_are_the_reference_ones");
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let c = with(
        conf("1.0.0", &br, env.ipam(Ipam::Ipamd, nets.v4_ranges())),
        json!({"vlanTrunk": [{"id": 20}, {"minID": 30, "maxID": 32}]}),
    );
    let ns = env.netns();
    let id = cid("vlan");
    let o = env
        .plugin("bridge")
        .attach("ADD", &id, &ns, "eth0")
        .conf(&c)
        .run();
    if !o.success() {
        let e = o.err();
        assert_ne!(
            e.code, 7,
            "vlanTrunk with minID/maxID is a valid config: {e:?}"
        );
        eprintln!("vlanTrunk ADD failed on this kernel (accepted): {e:?}");
        assert_eq!(link_names(Some(&ns.name)), ["lo".to_string()].into());
    }
    env.plugin("bridge")
        .attach("DEL", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .ok_silent();
}

/// Proves: concurrent first ADDs on a new gateway bridge all succeed (no
/// "file exists" race on the bridge or its address, plugins#366) and get
/// distinct addresses.
#[test]
fn concurrent_first_adds() {
    let env = TestEnv::new("concurrent_first_adds");
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let c = conf("1.0.0", &br, env.ipam(Ipam::Ipamd, nets.dual_ranges()));
    let attachments: Vec<(Netns, String)> = (0..8).map(|_| (env.netns(), cid("race"))).collect();
    let results: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = attachments
            .iter()
            .map(|(ns, id)| {
                let call = env.plugin("bridge").attach("ADD", id, ns, "eth0").conf(&c);
                s.spawn(move || call.run().result())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let mut seen = BTreeSet::new();
    for r in &results {
        for a in result_addresses(r) {
            assert!(seen.insert(a.clone()), "address {a} handed out twice");
        }
    }
    assert_eq!(seen.len(), 16);
    assert_eq!(bridge_ports(&br).len(), 8);
    wait_ipv6_ready(None);
    assert_ping(&attachments[0].0.name, &first_addr(&results[7], false));
    for (ns, id) in &attachments {
        env.plugin("bridge")
            .attach("DEL", id, ns, "eth0")
            .conf(&c)
            .run()
            .ok_silent();
    }
    assert!(bridge_ports(&br).is_empty());
}

/// Proves: the bridge (gateway) MAC is its own and stays put while ports come
/// and go, and the result reports the bridge's real MAC. The reference bridge
/// behaves so; a bridge that inherits its lowest port's MAC changes the
/// gateway MAC under every container when that port leaves.
#[test]
fn bridge_mac_is_stable_when_ports_come_and_go() {
    let env = TestEnv::new("bridge_mac_is_stable_when_ports_come_and_go");
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let c = conf("1.0.0", &br, env.ipam(Ipam::Ipamd, nets.v4_ranges()));
    let (a, b) = (env.netns(), env.netns());
    let (ida, idb) = (cid("a"), cid("b"));
    let kernel_mac = || link(None, &br).expect("bridge")["address"].clone();
    let ra = env
        .plugin("bridge")
        .attach("ADD", &ida, &a, "eth0")
        .conf(&c)
        .run()
        .result();
    let mac = kernel_mac();
    assert_eq!(
        ra["interfaces"][0]["mac"], mac,
        "result reports the bridge's MAC"
    );
    let rb = env
        .plugin("bridge")
        .attach("ADD", &idb, &b, "eth0")
        .conf(&c)
        .run()
        .result();
    assert_eq!(rb["interfaces"][0]["mac"], mac, "{rb}");
    assert_eq!(kernel_mac(), mac, "second port changed the bridge MAC");
    env.plugin("bridge")
        .attach("DEL", &ida, &a, "eth0")
        .conf(&c)
        .run()
        .ok_silent();
    assert_eq!(
        kernel_mac(),
        mac,
        "the gateway MAC changed when the first container left (bridge inherits a port MAC; \
         first host veth MAC was {})",
        ra["interfaces"][1]["mac"]
    );
    env.plugin("bridge")
        .attach("DEL", &idb, &b, "eth0")
        .conf(&c)
        .run()
        .ok_silent();
}

// ------------------------------------------------------------------ differential

/// Kernel state of one attachment, in comparable form.
#[derive(Debug, PartialEq)]
struct KernelView {
    cont_addrs: BTreeSet<String>,
    cont_routes4: BTreeSet<String>,
    cont_routes6: BTreeSet<String>,
    cont_mtu: Value,
    cont_up: bool,
    bridge_addrs: BTreeSet<String>,
    bridge_mtu: Value,
    port_flags: Value,
    port_mtu: Value,
}

/// Bridge port flags without ids and timers (which differ by construction).
fn port_flags(l: &Value) -> Value {
    let mut d = l["linkinfo"]["info_slave_data"].clone();
    if let Some(o) = d.as_object_mut() {
        o.retain(|k, _| {
            !(k.contains("id")
                || k.contains("timer")
                || k == "no"
                || k.starts_with("designated")
                || k == "topology_change_ack"
                || k == "config_pending"
                || k == "state")
        });
    }
    d
}

fn kernel_view(ns: &Netns, br: &str, host_veth: &str) -> KernelView {
    let cont = link(Some(&ns.name), "eth0").expect("eth0");
    let port = link(None, host_veth).expect("host veth");
    KernelView {
        cont_addrs: addrs(Some(&ns.name), "eth0"),
        cont_routes4: routes(Some(&ns.name), "-4"),
        cont_routes6: routes(Some(&ns.name), "-6"),
        cont_mtu: cont["mtu"].clone(),
        cont_up: cont["flags"].as_array().unwrap().contains(&json!("UP")),
        bridge_addrs: addrs(None, br),
        bridge_mtu: link(None, br).expect("bridge")["mtu"].clone(),
        port_flags: port_flags(&port),
        port_mtu: port["mtu"].clone(),
    }
}

/// A result with MACs and the random host veth name blanked out.
fn shape(r: &Value) -> Value {
    let mut r = r.clone();
    if let Some(ifs) = r["interfaces"].as_array_mut() {
        for i in ifs.iter_mut() {
            if i.get("mac").is_some() {
                i["mac"] = json!("<mac>");
            }
        }
        ifs[1]["name"] = json!("<veth>");
    }
    r
}

/// Proves: for the same config our bridge and the reference bridge (both
/// with host-local) print results of the same shape (same interfaces order
/// and fields, same ips/routes/dns) and leave the same kernel state
/// (container addresses and routes, bridge addresses, port flags, MTUs).
#[test]
fn differential_against_reference_bridge() {
    let env = TestEnv::new("differential_against_reference_bridge");
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let ns = env.netns();
    let id = cid("diff");
    let mut views = Vec::new();
    let mut results = Vec::new();
    for reference in [true, false] {
        // Fresh host-local state each time: both get the same first address.
        let c = with(
            conf("1.0.0", &br, env.ipam(Ipam::HostLocal, nets.dual_ranges())),
            json!({"hairpinMode": true, "mtu": 1450}),
        );
        let call = |verb: &str| {
            let p = if reference {
                env.ref_plugin("bridge")
            } else {
                env.plugin("bridge")
            };
            p.attach(verb, &id, &ns, "eth0").conf(&c)
        };
        let r = call("ADD").run().result();
        wait_ipv6_ready(Some(&ns.name));
        wait_ipv6_ready(None);
        assert_ping(&ns.name, &nets.v4_addr(1));
        assert_ping(&ns.name, &nets.v6_addr(1));
        views.push(kernel_view(
            &ns,
            &br,
            r["interfaces"][1]["name"].as_str().expect("host veth"),
        ));
        call("CHECK").conf(&with_prev(&c, &r)).run().ok_silent();
        call("DEL").run().ok_silent();
        assert!(link(Some(&ns.name), "eth0").is_none());
        ip(&["link", "del", &br]);
        results.push(r);
    }
    let (theirs, ours) = (&results[0], &results[1]);
    eprintln!("reference result: {theirs}\nour result:       {ours}");
    eprintln!(
        "reference kernel state: {:#?}\nour kernel state: {:#?}",
        views[0], views[1]
    );
    assert_eq!(
        keys(ours),
        keys(theirs),
        "top-level keys\nref:  {theirs}\nours: {ours}"
    );
    for (i, (a, b)) in theirs["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .zip(ours["interfaces"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(
            keys(a),
            keys(b),
            "interfaces[{i}] fields\nref:  {theirs}\nours: {ours}"
        );
    }
    assert_eq!(
        shape(ours),
        shape(theirs),
        "result shape\nref:  {theirs}\nours: {ours}"
    );
    assert_eq!(
        views[1], views[0],
        "kernel state (left: ours, right: reference)"
    );
}

/// Proves: `"mtu": 0` and `"vlan": 0` mean "not set", as in the reference
/// (configs generated from Go structs send them); ADD, CHECK-free DEL work.
#[test]
fn zero_mtu_and_vlan_mean_unset() {
    let env = TestEnv::new("zero_mtu_and_vlan_mean_unset");
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let c = with(
        conf("1.0.0", &br, env.ipam(Ipam::Ipamd, nets.v4_ranges())),
        json!({"mtu": 0, "vlan": 0}),
    );
    let ns = env.netns();
    let id = cid("zero");
    env.plugin("bridge")
        .attach("ADD", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .result();
    assert_eq!(link(Some(&ns.name), "eth0").unwrap()["mtu"], 1500);
    assert_ping(&ns.name, &nets.v4_addr(1));
    env.plugin("bridge")
        .attach("DEL", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .ok_silent();
}

/// Proves: disableContainerInterface with IPAM is refused (code 7, as the
/// reference does: a down interface would lose the addresses and routes the
/// result claims), before anything is created or leased.
#[test]
fn disable_container_interface_with_ipam_is_invalid() {
    let env = TestEnv::new("disable_container_interface_with_ipam_is_invalid");
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let c = with(
        conf("1.0.0", &br, ipam.clone()),
        json!({"disableContainerInterface": true}),
    );
    let ns = env.netns();
    env.plugin("bridge")
        .attach("ADD", &cid("dci"), &ns, "eth0")
        .conf(&c)
        .run()
        .expect_err(7, &["disableContainerInterface"]);
    assert_eq!(link_names(Some(&ns.name)), ["lo".to_string()].into());
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: a DEL whose IPAM step fails still removes the container's veth
/// (every DEL step runs; the first error is reported).
#[test]
fn del_removes_the_veth_even_when_ipam_fails() {
    let env = TestEnv::new("del_removes_the_veth_even_when_ipam_fails");
    let br = env.link_name("cbr");
    let (c, _ipam, ns, id, _r) = add_one(&env, Ipam::Ipamd, &br);
    let mut broken = c.clone();
    broken["ipam"]["type"] = json!("no-such-ipam");
    env.plugin("bridge")
        .attach("DEL", &id, &ns, "eth0")
        .conf(&broken)
        .run()
        .expect_err(104, &["no-such-ipam"]);
    assert!(
        link(Some(&ns.name), "eth0").is_none(),
        "the veth must be gone"
    );
    assert!(bridge_ports(&br).is_empty(), "no port left on the bridge");
    env.plugin("bridge")
        .attach("DEL", &id, &ns, "eth0")
        .conf(&c)
        .run()
        .ok_silent();
}
