//! The version matrix: every result layout from 0.2.0 to 1.1.0, with
//! host-local and ipamd, real traffic both ways, CHECK, DEL, DEL again.

use super::*;

/// Check that `r` is printed in the layout of `version` and carries what a
/// gateway bridge attachment in `nets` must carry.
fn check_layout(version: &str, r: &Value, nets: &Subnets, bridge: &str, ns: &Netns) {
    assert_eq!(r["cniVersion"], version, "{r}");
    let gw4 = nets.v4_addr(1);
    let gw6 = nets.v6_addr(1);
    if !has_interfaces(version) {
        check_legacy_layout(r, nets, &gw4, &gw6);
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

/// The 0.2.0 layout: only `ip4`/`ip6` blocks (with gateway and default route) and `dns`.
fn check_legacy_layout(r: &Value, nets: &Subnets, gw4: &str, gw6: &str) {
    for key in &keys(r) {
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
    let ip6 = r["ip6"]["ip"]
        .as_str()
        .unwrap_or_else(|| panic!("no ip6.ip: {r}"));
    assert!(ip6.ends_with("/64"), "{r}");
    for (block, gw, default) in [("ip4", gw4, "0.0.0.0/0"), ("ip6", gw6, "::/0")] {
        assert_eq!(r[block]["gateway"], gw, "{r}");
        assert!(
            r[block]["routes"]
                .as_array()
                .is_some_and(|a| a.contains(&json!({"dst": default, "gw": gw}))),
            "{block}.routes needs the default route: {r}"
        );
    }
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

/// The bare address of one family the result gives the container.
fn addr_of(version: &str, r: &Value, v6: bool) -> String {
    let all = addresses_of(version, r);
    let a = all
        .iter()
        .find(|x| x.contains(':') == v6)
        .unwrap_or_else(|| panic!("no address of that family: {r}"));
    bare(a).to_string()
}

/// The version matrix body: two containers on one bridge, layout, kernel
/// state, pings v4/v6 (each other and the gateway), CHECK, DEL, DEL again.
fn matrix(version: &str, kind: Ipam) {
    let env = TestEnv::new(&format!("bridge_matrix_{version}_{kind:?}"));
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let ipam = env.ipam(kind, nets.dual_ranges());
    let [a, b] = env.pair("bridge", &conf(version, &br, ipam.clone()));

    let ports_before = bridge_ports(&br);
    assert!(ports_before.is_empty());
    let ra = a.add();
    let ports_a = bridge_ports(&br);
    let rb = b.add();
    let ports_ab = bridge_ports(&br);
    check_layout(version, &ra, &nets, &br, &a.ns);
    check_layout(version, &rb, &nets, &br, &b.ns);
    assert_eq!(ports_a.len(), 1, "one port per attachment");
    assert_eq!(ports_ab.len(), 2, "one port per attachment");
    if has_interfaces(version) {
        assert!(
            ports_a.contains(host_veth(&ra)),
            "host veth of A is a bridge port"
        );
        assert!(
            ports_ab.contains(host_veth(&rb)),
            "host veth of B is a bridge port"
        );
    }
    assert_eq!(
        env.lease_count(&ipam, NET),
        4,
        "two containers × (v4 + v6) leases"
    );

    // Kernel state matches the results.
    for (att, r) in [(&a, &ra), (&b, &rb)] {
        let ns = &att.ns.name;
        let l = link(Some(ns), "eth0").expect("eth0 in the container");
        assert_eq!(link_kind(&l), Some("veth"));
        assert!(has_flag(&l, "UP"), "eth0 is up");
        if has_interfaces(version) {
            assert_eq!(
                l["address"], r["interfaces"][2]["mac"],
                "container MAC as reported"
            );
        }
        assert_eq!(
            addrs(Some(ns), "eth0"),
            addresses_of(version, r),
            "container addresses"
        );
        assert!(
            routes(Some(ns), "-4").contains(&format!("default via {} dev eth0", nets.v4_addr(1)))
        );
        assert!(
            routes(Some(ns), "-6").contains(&format!("default via {} dev eth0", nets.v6_addr(1)))
        );
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
    wait_ipv6_ready(Some(&a.ns.name));
    wait_ipv6_ready(Some(&b.ns.name));
    wait_ipv6_ready(None);
    assert_ping(&a.ns.name, &nets.v4_addr(1));
    assert_ping(&a.ns.name, &nets.v6_addr(1));
    assert_pods_ping_each_other_and_check(version, [(&a, &ra), (&b, &rb)], |r, v6| {
        addr_of(version, r, v6)
    });

    // DEL, DEL again; the veth is gone from the netns and from the bridge.
    a.del_twice();
    assert!(link(Some(&a.ns.name), "eth0").is_none(), "DEL removes eth0");
    assert_eq!(bridge_ports(&br).len(), 1, "DEL removes A's host veth");
    assert_eq!(
        env.lease_count(&ipam, NET),
        2,
        "DEL releases A's leases only"
    );
    assert_ping(&b.ns.name, &nets.v4_addr(1));
    b.del_twice();
    assert!(link(Some(&b.ns.name), "eth0").is_none());
    assert!(bridge_ports(&br).is_empty(), "no veth left on the bridge");
    for p in ports_ab {
        assert!(link(None, &p).is_none(), "host veth {p} still exists");
    }
    assert_eq!(env.lease_count(&ipam, NET), 0, "all leases released");
    assert_daemon_served_both(kind, &ipam);
}

matrix_cells! {
    matrix;
    /// Proves: bridge with ipamd served by its daemon (0.4.0: CHECK too).
    matrix_0_4_0_ipamd_daemon: "0.4.0", IpamdDaemon;
    /// Proves: matrix cell 0.2.0 × ipamd.
    matrix_0_2_0_ipamd: "0.2.0", Ipamd;
}

common_matrix_cells!(matrix);
