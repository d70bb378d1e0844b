//! macvlan plugin on the kernel. The master is one end of a veth pair in the
//! test host namespace (both ends up, so it has carrier); containers on the
//! same master in bridge mode reach each other through the macvlan switch.

mod common;

use common::*;
use serde_json::{json, Value};

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

fn cid(tag: &str) -> String {
    format!("ctr-{tag}-{}", short_hash())
}

/// ADD as eth0 into `ns`, which must succeed; the result.
fn add(env: &TestEnv, id: &str, ns: &Netns, c: &Value) -> Value {
    let call = env.plugin("macvlan").attach("ADD", id, ns, "eth0");
    call.conf(c).run().result()
}

/// DEL of eth0 from `ns`, which must succeed.
fn del(env: &TestEnv, id: &str, ns: &Netns, c: &Value) {
    let call = env.plugin("macvlan").attach("DEL", id, ns, "eth0");
    call.conf(c).run().ok_silent();
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

/// The version matrix body: two containers on one master (bridge mode),
/// dual-stack ipamd, layout, kernel state, ping v4+v6 both ways, CHECK
/// (≥ 0.4.0), DEL, DEL again.
fn matrix(version: &str) {
    let env = TestEnv::new(&format!("macvlan_matrix_{version}"));
    let (master, _) = env.veth_pair();
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.dual_ranges());
    let c = conf(version, &master, Some(ipam.clone()));
    let (a, b) = (env.netns(), env.netns());
    let (ida, idb) = (cid("a"), cid("b"));
    let ra = add(&env, &ida, &a, &c);
    let rb = add(&env, &idb, &b, &c);
    for (ns, r) in [(&a, &ra), (&b, &rb)] {
        check_layout(version, r, ns, 2);
        let l = assert_macvlan(ns, "bridge");
        assert_eq!(l["address"], r["interfaces"][0]["mac"]);
        let want: std::collections::BTreeSet<String> = result_addresses(r).into_iter().collect();
        assert_eq!(addrs(Some(&ns.name), "eth0"), want);
    }
    assert_eq!(env.lease_count(&ipam, NET), 4);
    wait_ipv6_ready(Some(&a.name));
    wait_ipv6_ready(Some(&b.name));
    assert_ping(&a.name, &first_addr(&rb, false));
    assert_ping(&a.name, &first_addr(&rb, true));
    assert_ping(&b.name, &first_addr(&ra, false));
    assert_ping(&b.name, &first_addr(&ra, true));
    if version != "0.3.1" {
        for (id, ns, r) in [(&ida, &a, &ra), (&idb, &b, &rb)] {
            env.plugin("macvlan")
                .attach("CHECK", id, ns, "eth0")
                .conf(&with_prev(&c, r))
                .run()
                .ok_silent();
        }
    }
    for (id, ns) in [(&ida, &a), (&idb, &b)] {
        for _ in 0..2 {
            del(&env, id, ns, &c);
        }
        assert!(link(Some(&ns.name), "eth0").is_none(), "DEL removes eth0");
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
/// in-process and served by its daemon.
#[test]
fn two_containers_ping_v4_both_ipams() {
    let env = TestEnv::new("two_containers_ping_v4_both_ipams");
    for kind in [Ipam::HostLocal, Ipam::Ipamd, Ipam::IpamdDaemon] {
        let (master, _) = env.veth_pair();
        let nets = env.subnets();
        let ipam = env.ipam(kind, nets.v4_ranges());
        let c = conf("1.0.0", &master, Some(ipam.clone()));
        let (a, b) = (env.netns(), env.netns());
        let (ida, idb) = (cid("a"), cid("b"));
        let ra = add(&env, &ida, &a, &c);
        let rb = add(&env, &idb, &b, &c);
        assert_ping(&a.name, &first_addr(&rb, false));
        assert_ping(&b.name, &first_addr(&ra, false));
        assert_eq!(env.lease_count(&ipam, NET), 2, "{kind:?}");
        for (id, ns) in [(&ida, &a), (&idb, &b)] {
            del(&env, id, ns, &c);
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
        let (master, _) = env.veth_pair();
        let mut c = conf("1.0.0", &master, None);
        match mode {
            Some(m) => c["mode"] = json!(m),
            None => {
                c.as_object_mut().unwrap().remove("mode");
            }
        }
        let ns = env.netns();
        let id = cid("mode");
        let r = add(&env, &id, &ns, &c);
        assert_macvlan(&ns, want);
        env.plugin("macvlan")
            .attach("CHECK", &id, &ns, "eth0")
            .conf(&with_prev(&c, &r))
            .run()
            .ok_silent();
        del(&env, &id, &ns, &c);
        assert!(link(Some(&ns.name), "eth0").is_none());
    }
}

/// Proves: without ipam the attachment is L2 only: an interface that is up,
/// reported in the result, with no IP addresses.
#[test]
fn l2_only_without_ipam() {
    let env = TestEnv::new("l2_only_without_ipam");
    let (master, _) = env.veth_pair();
    let c = conf("1.0.0", &master, None);
    let ns = env.netns();
    let id = cid("l2");
    let r = add(&env, &id, &ns, &c);
    assert_eq!(r["interfaces"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["interfaces"][0]["name"], "eth0", "{r}");
    assert!(
        r.get("ips")
            .is_none_or(|ips| ips.as_array().is_some_and(Vec::is_empty)),
        "no IPs: {r}"
    );
    let l = assert_macvlan(&ns, "bridge");
    assert!(l["flags"].as_array().unwrap().contains(&json!("UP")), "{l}");
    assert!(
        addrs(Some(&ns.name), "eth0").is_empty(),
        "no addresses besides link-local"
    );
    env.plugin("macvlan")
        .attach("CHECK", &id, &ns, "eth0")
        .conf(&with_prev(&c, &r))
        .run()
        .ok_silent();
    del(&env, &id, &ns, &c);
}

/// Proves: DEL never needs the master: it succeeds (twice) after the master
/// was deleted, and releases the leases (plugins#953).
#[test]
fn del_when_master_is_gone() {
    let env = TestEnv::new("del_when_master_is_gone");
    let (master, _) = env.veth_pair();
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let c = conf("1.0.0", &master, Some(ipam.clone()));
    let ns = env.netns();
    let id = cid("nomaster");
    add(&env, &id, &ns, &c);
    ip(&["link", "del", &master]);
    for _ in 0..2 {
        del(&env, &id, &ns, &c);
    }
    assert!(link(Some(&ns.name), "eth0").is_none());
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: DEL succeeds (twice) when the netns is gone, and with an empty
/// CNI_NETNS, releasing the leases.
#[test]
fn del_when_netns_is_gone() {
    let env = TestEnv::new("del_when_netns_is_gone");
    let (master, _) = env.veth_pair();
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let c = conf("1.0.0", &master, Some(ipam.clone()));
    let ns = env.netns();
    let id = cid("nons");
    add(&env, &id, &ns, &c);
    env.del_netns(&ns);
    for _ in 0..2 {
        del(&env, &id, &ns, &c);
    }
    assert_eq!(env.lease_count(&ipam, NET), 0);

    let ns2 = env.netns();
    let id2 = cid("emptyns");
    add(&env, &id2, &ns2, &c);
    env.plugin("macvlan")
        .command("DEL")
        .container(&id2)
        .ifname("eth0")
        .netns_path("")
        .conf(&c)
        .run()
        .ok_silent();
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: mtu and a requested mac are honoured; an mtu above the master's is code 7.
#[test]
fn mtu_and_mac() {
    let env = TestEnv::new("mtu_and_mac");
    let (master, _) = env.veth_pair();
    let mut c = conf("1.0.0", &master, None);
    c["mtu"] = json!(1280);
    c["mac"] = json!("0a:58:0a:0b:0c:0d");
    let ns = env.netns();
    let id = cid("mtu");
    let r = add(&env, &id, &ns, &c);
    let l = assert_macvlan(&ns, "bridge");
    assert_eq!(l["mtu"], 1280);
    assert_eq!(l["address"], "0a:58:0a:0b:0c:0d");
    assert_eq!(r["interfaces"][0]["mac"], "0a:58:0a:0b:0c:0d", "{r}");
    del(&env, &id, &ns, &c);

    c["mtu"] = json!(9000);
    env.plugin("macvlan")
        .attach("ADD", &cid("bigmtu"), &ns, "eth0")
        .conf(&c)
        .run()
        .expect_err(7, &["mtu", "9000"]);
    assert_eq!(link_names(Some(&ns.name)), ["lo".to_string()].into());
}

/// Proves: a missing master is code 7 naming it: a named one, or none where
/// the netns it is looked up in (the pod's, with linkInContainer) has no
/// default route to pick one from.
#[test]
fn missing_master() {
    let env = TestEnv::new("missing_master");
    let ns = env.netns();
    let ghost = ifname_with("ghost");
    env.plugin("macvlan")
        .attach("ADD", &cid("ghost"), &ns, "eth0")
        .conf(&conf("1.0.0", &ghost, None))
        .run()
        .expect_err(7, &[&ghost]);
    let mut c = conf("1.0.0", "x", None);
    c.as_object_mut().unwrap().remove("master");
    c["linkInContainer"] = json!(true);
    env.plugin("macvlan")
        .attach("ADD", &cid("nomaster"), &ns, "eth0")
        .conf(&c)
        .run()
        .expect_err(7, &["master", "default route"]);
    assert_eq!(link_names(Some(&ns.name)), ["lo".to_string()].into());
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
    let (a, b) = (env.netns(), env.netns());
    let (ida, idb) = (cid("a"), cid("b"));
    let mut results = Vec::new();
    for (id, ns) in [(&ida, &a), (&idb, &b)] {
        let r = add(&env, id, ns, &c);
        let l = assert_macvlan(ns, "bridge");
        assert_eq!(l["link_index"], host["ifindex"], "on the host's eth0: {l}");
        results.push(r);
    }
    assert_ping(&a.name, &first_addr(&results[1], false));
    assert_ping(&b.name, &first_addr(&results[0], false));
    for (id, ns) in [(&ida, &a), (&idb, &b)] {
        del(&env, id, ns, &c);
    }
    assert_eq!(env.lease_count(&ipam, NET), 0);
    let after = link(None, HOST_IF).expect("the host's eth0 is still there");
    assert_eq!(after["ifindex"], host["ifindex"]);
    assert_eq!(link_kind(&after), Some("veth"));
    assert!(addrs(None, HOST_IF).contains(&format!("{HOST_V4}/24")));
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

    let ns = env.netns();
    let (_h, peer) = env.veth_pair();
    ip(&["link", "set", &peer, "netns", &ns.name]);
    ip(&["-n", &ns.name, "link", "set", &peer, "name", "eth0"]);
    env.plugin("macvlan")
        .attach("ADD", &cid("dup"), &ns, "eth0")
        .conf(&c)
        .run()
        .expect_err(102, &["eth0"]);
    assert_eq!(env.lease_count(&ipam, NET), 0);
    assert_eq!(
        link_kind(&link(Some(&ns.name), "eth0").unwrap()),
        Some("veth"),
        "existing eth0 untouched"
    );

    let (n1, n2) = (env.netns(), env.netns());
    let id1 = cid("one");
    add(&env, &id1, &n1, &c);
    let e = env
        .plugin("macvlan")
        .attach("ADD", &cid("two"), &n2, "eth0")
        .conf(&c)
        .run()
        .err();
    assert_eq!(e.code, 103, "{e:?}");
    assert_eq!(
        link_names(Some(&n2.name)),
        ["lo".to_string()].into(),
        "the macvlan is removed again"
    );
    assert_eq!(env.lease_count(&ipam, NET), 1);
    del(&env, &id1, &n1, &c);
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: `bcqueuelen` sets the macvlan broadcast queue length
/// (IFLA_MACVLAN_BC_QUEUE_LEN), as in the reference, not the tx queue.
#[test]
fn bcqueuelen_sets_the_broadcast_queue() {
    let env = TestEnv::new("bcqueuelen_sets_the_broadcast_queue");
    let (master, _) = env.veth_pair();
    let mut c = conf("1.0.0", &master, None);
    c["bcqueuelen"] = json!(321);
    let ns = env.netns();
    let id = cid("bcq");
    add(&env, &id, &ns, &c);
    let l = assert_macvlan(&ns, "bridge");
    assert_eq!(l["linkinfo"]["info_data"]["bcqueuelen"], 321, "{l}");
    del(&env, &id, &ns, &c);
}
