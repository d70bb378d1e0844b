//! The version matrix: every result layout from 0.1.0 to 1.1.0, with
//! host-local and ipamd, dual stack, real traffic pod to pod and pod to node
//! both ways, the kernel layout, CHECK, DEL, DEL again.

use super::*;

/// `r` is in the layout of `version` and carries what a ptp attachment in
/// `nets` carries: [host veth, container] and every address on the container.
fn check_layout(version: &str, r: &Value, nets: &Subnets, ns: &Netns) {
    assert_eq!(r["cniVersion"], version, "{r}");
    let (gw4, gw6) = (nets.v4_addr(1), nets.v6_addr(1));
    if !has_interfaces(version) {
        for key in keys(r) {
            assert!(
                ["cniVersion", "ip4", "ip6", "dns"].contains(&key.as_str()),
                "{version} layout has no {key}: {r}"
            );
        }
        for (block, gw, default) in [("ip4", &gw4, "0.0.0.0/0"), ("ip6", &gw6, "::/0")] {
            assert_eq!(r[block]["gateway"], gw.as_str(), "{r}");
            let routes = r[block]["routes"].as_array().cloned().unwrap_or_default();
            assert!(
                routes.iter().any(|x| x["dst"] == default),
                "{block}.routes has IPAM's default route: {r}"
            );
        }
        return;
    }
    let ifs = r["interfaces"].as_array().expect("interfaces");
    assert_eq!(ifs.len(), 2, "interfaces are [host veth, container]: {r}");
    let host = &ifs[0];
    assert!(
        host["name"].as_str().is_some_and(|n| n.starts_with("veth")),
        "{r}"
    );
    assert!(host.get("sandbox").is_none(), "{r}");
    assert_eq!(ifs[1]["name"], "eth0", "{r}");
    assert_eq!(ifs[1]["sandbox"], ns.path, "{r}");
    for i in ifs {
        assert_eq!(i["mac"].as_str().unwrap_or("").len(), 17, "MAC: {r}");
    }
    let ips = r["ips"].as_array().expect("ips");
    assert_eq!(ips.len(), 2, "{r}");
    for ip in ips {
        let v6 = ip["address"].as_str().unwrap().contains(':');
        assert_eq!(ip["interface"], 1, "every address is the container's: {r}");
        assert_eq!(ip["gateway"], if v6 { &gw6 } else { &gw4 }.as_str(), "{r}");
        let tagged = matches!(version, "0.3.0" | "0.3.1" | "0.4.0");
        assert_eq!(ip.get("version").is_some(), tagged, "ips[].version: {r}");
    }
    // IPAM's routes, as IPAM gave them: ptp's own routes are not reported.
    assert_eq!(
        r["routes"],
        json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]),
        "{r}"
    );
}

/// The bare address of one family the result gives the container.
fn addr_of(version: &str, r: &Value, v6: bool) -> String {
    if has_interfaces(version) {
        return first_addr(r, v6);
    }
    let block = if v6 { "ip6" } else { "ip4" };
    bare(r[block]["ip"].as_str().expect("legacy ip")).to_string()
}

fn matrix(version: &str, kind: Ipam) {
    let env = TestEnv::new(&format!("ptp_matrix_{version}_{kind:?}"));
    let net = net_name();
    let (ipam, nets) = ipam(&env, kind, true);
    let [a, b] = env.pair("ptp", &conf(version, &net, &ipam));
    let ra = a.add();
    let rb = b.add();
    check_layout(version, &ra, &nets, &a.ns);
    check_layout(version, &rb, &nets, &b.ns);
    assert_eq!(env.lease_count(&ipam, &net), 4, "two pods × (v4 + v6)");

    let mut veths = Vec::new();
    for (att, r) in [(&a, &ra), (&b, &rb)] {
        let veth = host_veth_of(&net, &att.id).expect("host veth named by its alias");
        if has_interfaces(version) {
            assert_eq!(veth, host_veth(r), "{r}");
            let l = link(Some(&att.ns.name), "eth0").expect("eth0");
            assert_eq!(l["address"], r["interfaces"][1]["mac"], "container MAC");
            let h = link(None, &veth).expect("host veth");
            assert_eq!(h["address"], r["interfaces"][0]["mac"], "host MAC");
        }
        let (v4, v6) = (addr_of(version, r, false), addr_of(version, r, true));
        assert_ptp_layout(&att.ns, &veth, &nets, &v4, &v6);
        veths.push(veth);
    }

    // Real traffic: pod to pod both ways, pod to node, node to pod.
    wait_ipv6_ready(None);
    for gw in [nets.v4_addr(1), nets.v6_addr(1)] {
        assert_ping(&a.ns.name, &gw);
        assert_ping(&b.ns.name, &gw);
    }
    for v6 in [false, true] {
        assert_host_pings(&addr_of(version, &ra, v6));
    }
    assert_pods_ping_each_other_and_check(version, [(&a, &ra), (&b, &rb)], |r, v6| {
        addr_of(version, r, v6)
    });

    a.del_twice();
    assert!(link(Some(&a.ns.name), "eth0").is_none(), "DEL removes eth0");
    assert!(link(None, &veths[0]).is_none(), "DEL removes the host end");
    assert!(
        !routes(None, "-4").contains(&format!(
            "{} dev {}",
            addr_of(version, &ra, false),
            veths[0]
        )),
        "the host route went with the veth"
    );
    assert_eq!(
        env.lease_count(&ipam, &net),
        2,
        "DEL releases A's leases only"
    );
    assert_ping(&b.ns.name, &nets.v4_addr(1));
    assert_ping(&b.ns.name, &nets.v6_addr(1));
    b.del_twice();
    assert!(link(None, &veths[1]).is_none());
    assert_eq!(env.lease_count(&ipam, &net), 0, "all leases released");
    assert_daemon_served_both(kind, &ipam);
}

matrix_cells! {
    matrix;
    /// Proves: ptp at 0.1.0 (ip4/ip6 layout) with ipamd.
    matrix_0_1_0_ipamd: "0.1.0", Ipamd;
}

common_matrix_cells!(matrix);
