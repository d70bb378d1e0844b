//! DEL robustness (the netns, the bridge or CNI_NETNS gone, a failing IPAM),
//! failed ADDs that must leave nothing behind, and CHECK noticing drift.

use super::*;

/// Proves: DEL succeeds (twice) after the netns was deleted, releases the
/// leases, and the host veth disappears.
#[test]
fn del_after_netns_deleted() {
    let env = TestEnv::new("del_after_netns_deleted");
    for kind in Ipam::BOTH {
        let (att, r, _) = add_one(&env, kind);
        env.del_netns(&att.ns);
        att.del_twice();
        assert_eq!(
            env.lease_count(ipam_of(&att), NET),
            0,
            "{kind:?}: leases released"
        );
        let veth = host_veth(&r);
        eventually("the host veth is gone", || link(None, veth).is_none());
    }
}

/// Proves: DEL succeeds (twice) after the bridge was deleted, and still
/// removes the container interface and the leases.
#[test]
fn del_after_bridge_deleted() {
    let env = TestEnv::new("del_after_bridge_deleted");
    for kind in Ipam::BOTH {
        let (att, _, br) = add_one(&env, kind);
        ip(&["link", "del", &br]);
        att.del_twice();
        assert!(
            link(Some(&att.ns.name), "eth0").is_none(),
            "{kind:?}: eth0 removed"
        );
        assert_eq!(
            env.lease_count(ipam_of(&att), NET),
            0,
            "{kind:?}: leases released"
        );
    }
}

/// Proves: DEL with an empty (or absent) CNI_NETNS succeeds and releases the
/// leases (the spec makes CNI_NETNS optional for DEL).
#[test]
fn del_with_empty_netns() {
    let env = TestEnv::new("del_with_empty_netns");
    for kind in Ipam::BOTH {
        let (att, _, _) = add_one(&env, kind);
        att.del_with_empty_netns();
        assert_eq!(
            env.lease_count(ipam_of(&att), NET),
            0,
            "{kind:?}: leases released"
        );
        att.del_without_netns();
    }
}

/// Proves: DEL of an attachment that never existed succeeds.
#[test]
fn del_of_unknown_attachment() {
    let (env, ns) = TestEnv::with_netns("del_of_unknown_attachment");
    let nowhere = Netns {
        name: "x".into(),
        path: "/run/netns/nonexistent".into(),
    };
    for kind in Ipam::BOTH {
        let (c, _, _) = network(&env, kind, Subnets::dual_ranges);
        env.attachment("bridge", &cid("never"), &ns, &c).del();
        env.attachment("bridge", &cid("never"), &nowhere, &c).del();
    }
}

/// Proves: when IPAM is exhausted (/30 with a gateway: one usable address),
/// the second ADD fails, leaves no veth (neither in its netns nor on the
/// bridge) and no reservation; after DEL of the first, the address is free again.
#[test]
fn failed_add_pool_exhausted_leaves_nothing() {
    let env = TestEnv::new("failed_add_pool_exhausted_leaves_nothing");
    for kind in Ipam::BOTH {
        let (c, br, nets) = network(&env, kind, |n| json!([[{"subnet": n.v4_slash30(0)}]]));
        let ipam = &c["ipam"];
        let (one, two) = (
            env.new_attachment("bridge", "one", &c),
            env.new_attachment("bridge", "two", &c),
        );
        let r1 = one.add();
        assert_eq!(
            first_addr(&r1, false),
            nets.v4_addr(2),
            "{kind:?}: the only usable address"
        );
        let ports = bridge_ports(&br);
        let leases = env.lease_count(ipam, NET);
        assert_eq!(leases, 1);

        let e = two.try_add().err();
        eprintln!("{kind:?}: exhausted ADD failed with {e:?}");
        if kind == Ipam::Ipamd {
            assert_eq!(
                e.code, 103,
                "ipamd exhaustion is 'address unavailable': {e:?}"
            );
        }
        assert_only_lo(&two.ns, &format!("{kind:?}: no veth left in the netns"));
        assert_eq!(
            bridge_ports(&br),
            ports,
            "{kind:?}: no veth left on the bridge"
        );
        assert_eq!(
            env.lease_count(ipam, NET),
            leases,
            "{kind:?}: no reservation left"
        );

        one.del();
        assert_eq!(env.lease_count(ipam, NET), 0);
        let r2 = two.add();
        assert_eq!(
            first_addr(&r2, false),
            nets.v4_addr(2),
            "{kind:?}: the address is free again"
        );
        two.del();
    }
}

/// Proves: ADD of an ifname already present in the netns fails with 102
/// naming the interface, takes no lease, adds no bridge port, and leaves the
/// existing interface alone.
#[test]
fn failed_add_ifname_exists() {
    let env = TestEnv::new("failed_add_ifname_exists");
    for kind in Ipam::BOTH {
        let (c, br, _) = network(&env, kind, Subnets::dual_ranges);
        let ns = env.netns_with_foreign_eth0();
        let before = link(Some(&ns.name), "eth0").unwrap();

        env.attachment("bridge", &cid("dup"), &ns, &c)
            .try_add()
            .expect_err(102, &["eth0", "exists"]);
        assert_eq!(
            env.lease_count(&c["ipam"], NET),
            0,
            "{kind:?}: no lease taken"
        );
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
    let c = conf(
        "1.0.0",
        &br,
        json!({"type": "no-such-ipam", "subnet": "10.0.0.0/24"}),
    );
    let att = env.new_attachment("bridge", "noipam", &c);
    att.try_add().expect_err(104, &["no-such-ipam"]);
    assert_only_lo(&att.ns, "failed ADD");
    assert!(bridge_ports(&br).is_empty());
}

/// Proves: a DEL whose IPAM step fails still removes the container's veth
/// (every DEL step runs; the first error is reported).
#[test]
fn del_removes_the_veth_even_when_ipam_fails() {
    let env = TestEnv::new("del_removes_the_veth_even_when_ipam_fails");
    let (att, _, br) = add_one(&env, Ipam::Ipamd);
    let mut broken = att.conf.clone();
    broken["ipam"]["type"] = json!("no-such-ipam");
    att.chained("bridge", &broken)
        .call("DEL")
        .run()
        .expect_err(104, &["no-such-ipam"]);
    assert!(
        link(Some(&att.ns.name), "eth0").is_none(),
        "the veth must be gone"
    );
    assert!(bridge_ports(&br).is_empty(), "no port left on the bridge");
    att.del();
}

/// Proves: CHECK notices a missing address, a missing route, and a missing
/// interface, and fails without prevResult.
#[test]
fn check_detects_drift() {
    let env = TestEnv::new("check_detects_drift");
    let (att, r, _) = add_one(&env, Ipam::Ipamd);
    let ns = &att.ns.name;
    let check = || att.call("CHECK").conf(&with_prev(&att.conf, &r)).run();
    att.check(&r);
    att.call("CHECK").run().err();

    let v4 = result_addresses(&r)
        .into_iter()
        .find(|a| !a.contains(':'))
        .unwrap();
    ip(&["-n", ns, "route", "del", "default"]);
    let e = check().err();
    assert!(e.msg.contains("route"), "{e:?}");
    ip(&["-n", ns, "addr", "del", &v4, "dev", "eth0"]);
    let e = check().err();
    assert!(e.msg.contains(bare(&v4)), "{e:?}");
    ip(&["-n", ns, "link", "del", "eth0"]);
    let e = check().err();
    assert!(e.msg.contains("eth0"), "{e:?}");
    att.del();
}
