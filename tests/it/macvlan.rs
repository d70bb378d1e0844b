//! macvlan plugin on the kernel. The master is one end of a veth pair in the
//! test host namespace (both ends up, so it has carrier); containers on the
//! same master in bridge mode reach each other through the macvlan switch.

pub(crate) mod announce;

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const NET: &str = "mvnet";

fn conf(version: &str, master: &str, ipam: Option<Value>) -> Value {
    let mut c = json!({
        "cniVersion": version,
        "name": NET,
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
    });
    if let Some(ipam) = ipam {
        c["ipam"] = ipam;
    }
    c
}

/// A 1.0.0 config on a new master (one end of a veth pair), without IPAM,
/// with the `extra` keys.
fn l2_conf(env: &TestEnv, extra: Value) -> Value {
    let (master, _) = env.veth_pair();
    merged(conf("1.0.0", &master, None), extra)
}

/// `ip -d link` of eth0 in the netns must be a macvlan in `mode`.
fn assert_macvlan(ns: &Netns, mode: &str) -> Value {
    let l = link(Some(&ns.name), "eth0").unwrap_or_else(|| panic!("no eth0 in {}", ns.name));
    assert_eq!(link_kind(&l), Some("macvlan"), "{l}");
    assert_eq!(l["linkinfo"]["info_data"]["mode"], mode, "{l}");
    l
}

/// Check the single-interface result layout of `version`.
fn check_layout(version: &str, r: &Value, ns: &Netns, families: usize) {
    assert_eq!(r["cniVersion"], version, "{r}");
    let ifs = r["interfaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no interfaces: {r}"));
    assert_eq!(ifs.len(), 1, "{r}");
    assert_eq!(ifs[0]["name"], "eth0", "{r}");
    assert_eq!(ifs[0]["sandbox"], ns.path, "{r}");
    assert_eq!(ifs[0]["mac"].as_str().map(str::len), Some(17), "{r}");
    let ips = r["ips"].as_array().unwrap_or_else(|| panic!("no ips: {r}"));
    assert_eq!(ips.len(), families, "{r}");
    for ip in ips {
        assert_eq!(ip["interface"], 0, "{r}");
        let v6 = ip["address"].as_str().unwrap().contains(':');
        if matches!(version, "0.3.0" | "0.3.1" | "0.4.0") {
            assert_eq!(ip["version"], if v6 { "6" } else { "4" }, "{r}");
        } else {
            assert!(ip.get("version").is_none(), "{r}");
        }
    }
}

/// ADD both, then each pings the other's address of every family in `v6s`.
fn add_and_ping_each_other(pair: &[Attachment; 2], v6s: &[bool]) -> [Value; 2] {
    let results = [pair[0].add(), pair[1].add()];
    if v6s.contains(&true) {
        for att in pair {
            wait_ipv6_ready(Some(&att.ns.name));
        }
    }
    for (from, to) in [(&pair[0], &results[1]), (&pair[1], &results[0])] {
        for &v6 in v6s {
            assert_ping(&from.ns.name, &first_addr(to, v6));
        }
    }
    results
}

/// The version matrix body: two containers on one master (bridge mode),
/// dual-stack ipamd, layout, kernel state, ping v4+v6 both ways, CHECK
/// (≥ 0.4.0), DEL, DEL again.
fn matrix(version: &str) {
    let env = TestEnv::new(&format!("macvlan_matrix_{version}"));
    let (master, _) = env.veth_pair();
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.dual_ranges());
    let pair = env.pair("macvlan", &conf(version, &master, Some(ipam.clone())));
    let results = add_and_ping_each_other(&pair, &[false, true]);
    for (att, r) in pair.iter().zip(&results) {
        check_layout(version, r, &att.ns, 2);
        let l = assert_macvlan(&att.ns, "bridge");
        assert_eq!(l["address"], r["interfaces"][0]["mac"]);
        let want: BTreeSet<String> = result_addresses(r).into_iter().collect();
        assert_eq!(addrs(Some(&att.ns.name), "eth0"), want);
    }
    assert_eq!(env.lease_count(&ipam, NET), 4);
    if version != "0.3.1" {
        for (att, r) in pair.iter().zip(&results) {
            att.check(r);
        }
    }
    for att in &pair {
        att.del_twice();
        assert!(
            link(Some(&att.ns.name), "eth0").is_none(),
            "DEL removes eth0"
        );
    }
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: macvlan matrix cell 0.3.1.
#[test]
fn matrix_0_3_1() {
    matrix("0.3.1");
}
/// Proves: macvlan matrix cell 0.4.0 (with CHECK).
#[test]
fn matrix_0_4_0() {
    matrix("0.4.0");
}
/// Proves: macvlan matrix cell 1.0.0.
#[test]
fn matrix_1_0_0() {
    matrix("1.0.0");
}
/// Proves: macvlan matrix cell 1.1.0.
#[test]
fn matrix_1_1_0() {
    matrix("1.1.0");
}

/// Proves: two containers on the same master in bridge mode ping each other
/// (IPv4) with the reference host-local IPAM as well as with ipamd, both
/// in-process and served by its daemon; with no IPv6 address, their interfaces have
/// none at all (no link-local: `addrgenmode none`, set with the create).
#[test]
fn two_containers_ping_v4_both_ipams() {
    let env = TestEnv::new("two_containers_ping_v4_both_ipams");
    for kind in [Ipam::HostLocal, Ipam::Ipamd, Ipam::IpamdDaemon] {
        let (master, _) = env.veth_pair();
        let nets = env.subnets();
        let ipam = env.ipam(kind, nets.v4_ranges());
        let pair = env.pair("macvlan", &conf("1.0.0", &master, Some(ipam.clone())));
        add_and_ping_each_other(&pair, &[false]);
        for att in &pair {
            let ns = Some(att.ns.name.as_str());
            let v6 = crate::bridge::ipv6::ipv6_lines(ns, "eth0");
            assert!(v6.is_empty(), "{kind:?}: {v6:?}");
            assert!(crate::bridge::ipv6::addrgenmode_none(ns, "eth0"));
        }
        assert_eq!(env.lease_count(&ipam, NET), 2, "{kind:?}");
        for att in &pair {
            att.del();
        }
        assert_eq!(env.lease_count(&ipam, NET), 0, "{kind:?}");
        if kind == Ipam::IpamdDaemon {
            assert!(
                ipamd_daemon_allocations(&ipam) >= 2,
                "the daemon served the ADDs"
            );
        }
    }
}

/// Proves: every mode (bridge, private, vepa, passthru, and the default)
/// creates a macvlan of that mode; CHECK accepts it; DEL removes it.
#[test]
fn every_mode_creates_that_mode() {
    let env = TestEnv::new("every_mode_creates_that_mode");
    for (mode, want) in [
        (Some("bridge"), "bridge"),
        (Some("private"), "private"),
        (Some("vepa"), "vepa"),
        (Some("passthru"), "passthru"),
        (None, "bridge"),
    ] {
        let mut c = l2_conf(&env, json!({}));
        match mode {
            Some(m) => c["mode"] = json!(m),
            None => {
                c.as_object_mut().unwrap().remove("mode");
            }
        }
        let att = env.new_attachment("macvlan", "mode", &c);
        let r = att.add();
        assert_macvlan(&att.ns, want);
        att.check(&r);
        att.del();
        assert!(link(Some(&att.ns.name), "eth0").is_none());
    }
}

/// Proves: without ipam the attachment is L2 only: an interface that is up,
/// reported in the result, with no IP addresses but the kernel's IPv6 link-local one
/// (for the pod's own SLAAC or DHCP: only interfaces the plugin addresses go without).
#[test]
fn l2_only_without_ipam() {
    let env = TestEnv::new("l2_only_without_ipam");
    let att = env.new_attachment("macvlan", "l2", &l2_conf(&env, json!({})));
    let r = att.add();
    assert_eq!(r["interfaces"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["interfaces"][0]["name"], "eth0", "{r}");
    assert!(
        r.get("ips")
            .is_none_or(|ips| ips.as_array().is_some_and(Vec::is_empty)),
        "no IPs: {r}"
    );
    let l = assert_macvlan(&att.ns, "bridge");
    assert!(has_flag(&l, "UP"), "{l}");
    assert!(
        addrs(Some(&att.ns.name), "eth0").is_empty(),
        "no addresses besides link-local"
    );
    let mac = r["interfaces"][0]["mac"].as_str().expect("MAC");
    let want = vec![crate::bridge::ipv6::eui64_link_local(mac)];
    eventually(
        "the kernel gives the L2-only pod its link-local address",
        || crate::bridge::ipv6::link_locals(Some(&att.ns.name), "eth0") == want,
    );
    att.check(&r);
    att.del();
}

/// A 1.0.0 macvlan over v4 ipamd on a new master, attached as `ctr-TAG-…`
/// and ADDed: the attachment, the master and the ipam object.
fn add_v4<'e>(env: &'e TestEnv, tag: &str) -> (Attachment<'e>, String, Value) {
    let (master, _) = env.veth_pair();
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let att = env.new_attachment("macvlan", tag, &conf("1.0.0", &master, Some(ipam.clone())));
    att.add();
    (att, master, ipam)
}

/// Proves: DEL never needs the master: it succeeds (twice) after the master
/// was deleted, and releases the leases (plugins#953).
#[test]
fn del_when_master_is_gone() {
    let env = TestEnv::new("del_when_master_is_gone");
    let (att, master, ipam) = add_v4(&env, "nomaster");
    ip(&["link", "del", &master]);
    att.del_twice();
    assert!(link(Some(&att.ns.name), "eth0").is_none());
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: DEL succeeds (twice) when the netns is gone, and with an empty
/// CNI_NETNS, releasing the leases.
#[test]
fn del_when_netns_is_gone() {
    let env = TestEnv::new("del_when_netns_is_gone");
    let (att, _, ipam) = add_v4(&env, "nons");
    env.del_netns(&att.ns);
    att.del_twice();
    assert_eq!(env.lease_count(&ipam, NET), 0);

    let att2 = env.new_attachment("macvlan", "emptyns", &att.conf);
    att2.add();
    att2.del_with_empty_netns();
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: mtu and a requested mac are honoured; an mtu above the master's is code 7.
#[test]
fn mtu_and_mac() {
    let env = TestEnv::new("mtu_and_mac");
    let mut c = l2_conf(&env, json!({"mtu": 1280, "mac": "0a:58:0a:0b:0c:0d"}));
    let att = env.new_attachment("macvlan", "mtu", &c);
    let r = att.add();
    let l = assert_macvlan(&att.ns, "bridge");
    assert_eq!(l["mtu"], 1280);
    assert_eq!(l["address"], "0a:58:0a:0b:0c:0d");
    assert_eq!(r["interfaces"][0]["mac"], "0a:58:0a:0b:0c:0d", "{r}");
    att.del();

    c["mtu"] = json!(9000);
    env.attachment("macvlan", &cid("bigmtu"), &att.ns, &c)
        .try_add()
        .expect_err(7, &["mtu", "9000"]);
    assert_only_lo(&att.ns, "refused ADD");
}

/// Proves: a missing master is code 7 naming it: a named one, or none where
/// the netns it is looked up in (the pod's, with linkInContainer) has no
/// default route to pick one from.
#[test]
fn missing_master() {
    let (env, ns) = TestEnv::with_netns("missing_master");
    let ghost = ifname_with("ghost");
    env.attachment("macvlan", &cid("ghost"), &ns, &conf("1.0.0", &ghost, None))
        .try_add()
        .expect_err(7, &[&ghost]);
    let mut c = conf("1.0.0", "x", None);
    c.as_object_mut().unwrap().remove("master");
    c["linkInContainer"] = json!(true);
    env.attachment("macvlan", &cid("nomaster"), &ns, &c)
        .try_add()
        .expect_err(7, &["master", "default route"]);
    assert_only_lo(&ns, "refused ADD");
}

/// Proves: with no master, the host's default-route link (its own eth0, as
/// on a node) is the master of each pod's eth0; the pods reach each other,
/// and the host's eth0 keeps its index, kind and address throughout.
#[test]
fn no_master_uses_the_hosts_eth0() {
    let env = TestEnv::new("no_master_uses_the_hosts_eth0");
    let host = link(None, HOST_IF).expect("the test host has an eth0");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let mut c = conf("1.0.0", "x", Some(ipam.clone()));
    c.as_object_mut().unwrap().remove("master");
    let pair = env.pair("macvlan", &c);
    add_and_ping_each_other(&pair, &[false]);
    for att in &pair {
        let l = assert_macvlan(&att.ns, "bridge");
        assert_eq!(l["link_index"], host["ifindex"], "on the host's eth0: {l}");
    }
    for att in &pair {
        att.del();
    }
    assert_eq!(env.lease_count(&ipam, NET), 0);
    let after = link(None, HOST_IF).expect("the host's eth0 is still there");
    assert_eq!(after["ifindex"], host["ifindex"]);
    assert_eq!(link_kind(&after), Some("veth"));
    assert!(addrs(None, HOST_IF).contains(&format!("{HOST_V4}/24")));
}

/// Proves: empty strings are unset values, as for the reference: `"master":
/// ""` puts the pod on the default route's link (the host's eth0), and an
/// empty `mac`, `runtimeConfig.mac` and `CNI_ARGS MAC=` leave the kernel's
/// MAC; a MAC in Go's dashed or dotted form is taken, lower-cased with colons.
#[test]
fn empty_master_and_macs_are_unset() {
    let env = TestEnv::new("empty_master_and_macs");
    let host = link(None, HOST_IF).expect("the test host has an eth0");
    let c = merged(
        conf("1.0.0", "", None),
        json!({"mac": "", "runtimeConfig": {"mac": ""}}),
    );
    let att = env.new_attachment("macvlan", "empty", &c);
    let r = att.call("ADD").cni_args("MAC=").run().result();
    let l = assert_macvlan(&att.ns, "bridge");
    assert_eq!(l["link_index"], host["ifindex"], "on the host's eth0: {l}");
    assert_eq!(r["interfaces"][0]["mac"], l["address"], "{r}");
    att.del();
    for (mac, args) in [("0A-58-0A-0B-0C-0E", "MAC="), ("", "MAC=0a58.0a0b.0c0f")] {
        let att = env.new_attachment("macvlan", "dash", &merged(c.clone(), json!({"mac": mac})));
        let r = att.call("ADD").cni_args(args).run().result();
        let want = if mac.is_empty() {
            "0a:58:0a:0b:0c:0f"
        } else {
            "0a:58:0a:0b:0c:0e"
        };
        assert_eq!(assert_macvlan(&att.ns, "bridge")["address"], want);
        assert_eq!(r["interfaces"][0]["mac"], want, "{r}");
        att.del();
    }
}

/// Proves: a failed ADD leaves no macvlan and no lease: ifname taken (102),
/// and IPAM exhausted (the macvlan created before IPAM is removed again).
#[test]
fn failed_add_leaves_nothing() {
    let env = TestEnv::new("failed_add_leaves_nothing");
    let (master, _) = env.veth_pair();
    let nets = env.subnets();
    // A /30 without gateway: host-local semantics give .1 as gateway, so one address.
    let ipam = env.ipam(Ipam::Ipamd, json!([[{"subnet": nets.v4_slash30(0)}]]));
    let c = conf("1.0.0", &master, Some(ipam.clone()));

    let ns = env.netns_with_foreign_eth0();
    env.attachment("macvlan", &cid("dup"), &ns, &c)
        .try_add()
        .expect_err(102, &["eth0"]);
    assert_eq!(env.lease_count(&ipam, NET), 0);
    assert_eq!(
        link_kind(&link(Some(&ns.name), "eth0").unwrap()),
        Some("veth"),
        "existing eth0 untouched"
    );

    let [one, two] = [
        env.new_attachment("macvlan", "one", &c),
        env.new_attachment("macvlan", "two", &c),
    ];
    one.add();
    let e = two.try_add().err();
    assert_eq!(e.code, 103, "{e:?}");
    assert_only_lo(&two.ns, "the macvlan is removed again");
    assert_eq!(env.lease_count(&ipam, NET), 1);
    one.del();
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: `bcqueuelen` sets the macvlan broadcast queue length
/// (IFLA_MACVLAN_BC_QUEUE_LEN), as in the reference, not the tx queue.
#[test]
fn bcqueuelen_sets_the_broadcast_queue() {
    let env = TestEnv::new("bcqueuelen_sets_the_broadcast_queue");
    let att = env.new_attachment("macvlan", "bcq", &l2_conf(&env, json!({"bcqueuelen": 321})));
    att.add();
    let l = assert_macvlan(&att.ns, "bridge");
    assert_eq!(l["linkinfo"]["info_data"]["bcqueuelen"], 321, "{l}");
    att.del();
}

/// Proves: a second attachment whose IPAM routes include a default route via
/// its own gateway gets that route installed beside the first attachment's
/// (as the reference does), so the result never reports a route the kernel
/// lacks, and CHECK right after ADD agrees (Multus, `cnitool check`).
#[test]
fn a_second_attachments_default_route_is_installed_and_checks() {
    let env = TestEnv::new("second_default_route");
    let ns = env.netns();
    let mut atts = Vec::new();
    for ifname in ["eth0", "mv0"] {
        let (master, _) = env.veth_pair();
        let mut ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
        ipam["routes"] = json!([{"dst": "0.0.0.0/0"}]);
        let att = env
            .attachment(
                "macvlan",
                "ctr-2nd-route",
                &ns,
                &conf("1.0.0", &master, Some(ipam)),
            )
            .with_ifname(ifname);
        let r = att.add();
        let gw = r["ips"][0]["gateway"]
            .as_str()
            .expect("gateway")
            .to_string();
        assert!(
            routes(Some(&ns.name), "-4").contains(&format!("default via {gw} dev {ifname}")),
            "{ifname}: {:?}",
            routes(Some(&ns.name), "-4")
        );
        att.check(&r);
        atts.push(att);
    }
    for att in atts.iter().rev() {
        att.del();
    }
}
