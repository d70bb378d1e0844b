//! DEL when the pod is gone or the config is unusable, GC of a forgotten
//! pod, failed ADDs that leave nothing, STATUS, and ipMasq with real traffic.

use super::*;

/// Proves: after the netns is deleted, DEL succeeds with its (dead) path,
/// with an empty CNI_NETNS and with none, each twice; the leases are
/// released and the host end goes with the pod.
#[test]
fn del_after_the_netns_is_gone() {
    let env = TestEnv::new("ptp_del_after_netns_gone");
    for kind in Ipam::BOTH {
        let (c, _) = network(&env, kind, json!({}));
        let pod = env.pod("ptp", &c);
        let veth = host_veth(&pod.result).to_string();
        env.del_netns(&pod.ns);
        pod.del_twice();
        pod.del_with_empty_netns();
        pod.del_with_empty_netns();
        pod.del_without_netns();
        assert_eq!(env.lease_count(&c["ipam"], c["name"].as_str().unwrap()), 0);
        eventually("the host end is gone", || link(None, &veth).is_none());
    }
}

/// Proves: DEL with an empty CNI_NETNS while the pod still exists releases
/// the leases (as the reference, it cannot find the veth); GC then removes
/// the veth, whose attachment the runtime no longer lists.
#[test]
fn del_with_empty_netns_then_gc() {
    let env = TestEnv::new("ptp_del_empty_netns");
    let (c, _) = network(&env, Ipam::Ipamd, json!({}));
    let pod = env.pod("ptp", &c);
    pod.del_with_empty_netns();
    assert_eq!(env.lease_count(&c["ipam"], c["name"].as_str().unwrap()), 0);
    gc(&env, &c, Value::Null);
    assert!(link(None, host_veth(&pod.result)).is_none());
    assert!(link(Some(&pod.ns.name), "eth0").is_none());
}

/// Proves: DEL never fails on a config it cannot use (a bad `mtu`, no IPAM):
/// it still removes the veth, and with IPAM configured releases the leases.
#[test]
fn del_with_an_unusable_config_still_cleans_up() {
    let env = TestEnv::new("ptp_del_bad_conf");
    let (c, _) = network(&env, Ipam::HostLocal, json!({}));
    let net = c["name"].as_str().unwrap().to_string();
    for bad in [json!({"mtu": "big"}), json!({"ipam": null})] {
        let pod = env.pod("ptp", &c);
        let veth = host_veth(&pod.result).to_string();
        pod.att
            .chained("ptp", &merged(c.clone(), bad.clone()))
            .del();
        assert!(link(None, &veth).is_none(), "{bad}: the veth is gone");
        assert!(link(Some(&pod.ns.name), "eth0").is_none(), "{bad}");
        pod.del();
    }
    assert_eq!(env.lease_count(&c["ipam"], &net), 0);
}

/// GC as libcni sends it: both keys, `null` for a node with no pods.
fn gc(env: &TestEnv, c: &Value, valid: Value) {
    let mut g = c.clone();
    g["cni.dev/valid-attachments"] = valid.clone();
    g["cni.dev/attachments"] = valid;
    env.plugin("ptp").command("GC").conf(&g).run().ok_silent();
}

/// Proves: GC removes the veth (both ends, its routes) and the leases of a
/// pod the runtime forgot while keeping the valid pod working; with `null`
/// (no pods left) it removes everything of the network; DEL afterwards is
/// still fine.
#[test]
fn gc_removes_a_forgotten_pods_veth_and_leases() {
    let env = TestEnv::new("ptp_gc");
    for kind in [Ipam::Ipamd, Ipam::HostLocal] {
        let (c, nets) = network(&env, kind, json!({}));
        let net = c["name"].as_str().unwrap().to_string();
        let (a, b) = (env.pod("ptp", &c), env.pod("ptp", &c));
        let (va, vb) = (host_veth(&a.result), host_veth(&b.result));
        gc(&env, &c, json!([{"containerID": a.id, "ifname": "eth0"}]));
        assert!(link(None, vb).is_none(), "{kind:?}: B's host end is gone");
        assert!(
            link(Some(&b.ns.name), "eth0").is_none(),
            "{kind:?}: and its pod end"
        );
        assert!(link(None, va).is_some(), "{kind:?}: A's veth stays");
        assert_eq!(
            env.lease_count(&c["ipam"], &net),
            2,
            "{kind:?}: A's leases stay"
        );
        assert_ping(&a.ns.name, &nets.v4_addr(1));
        assert_ping(&a.ns.name, &nets.v6_addr(1));
        gc(&env, &c, Value::Null);
        assert!(
            link(None, va).is_none(),
            "{kind:?}: no pods: A's veth goes too"
        );
        assert_eq!(env.lease_count(&c["ipam"], &net), 0);
        a.del();
        b.del();
    }
}

/// Proves: an ADD that fails after the veth and the addresses exist (an
/// IPAM route via a gateway no route reaches) leaves no link in the netns
/// or on the host and no lease; and an ADD onto a taken CNI_IFNAME fails
/// with 102 and leaves no lease or host end.
#[test]
fn failed_adds_leave_nothing() {
    let env = TestEnv::new("ptp_failed_add");
    for kind in Ipam::BOTH {
        let (mut c, _) = network(&env, kind, json!({}));
        c["ipam"]["routes"] = json!([{"dst": "198.51.100.0/24", "gw": "203.0.113.1"}]);
        let net = c["name"].as_str().unwrap().to_string();
        let att = env.new_attachment("ptp", "fail", &c);
        let e = att.try_add().err();
        assert!(e.msg.contains("198.51.100.0/24"), "{kind:?}: {e:?}");
        assert_only_lo(&att.ns, &format!("{kind:?}: failed ADD"));
        assert_eq!(host_veth_of(&net, &att.id), None, "{kind:?}: host end left");
        assert_eq!(env.lease_count(&c["ipam"], &net), 0, "{kind:?}: lease left");
        att.del();

        let taken = env.attachment("ptp", &cid("taken"), &env.netns_with_foreign_eth0(), &c);
        taken.try_add().expect_err(102, &["eth0"]);
        assert_eq!(env.lease_count(&c["ipam"], &net), 0);
        assert_eq!(host_veth_of(&net, &taken.id), None);
    }
}

/// Proves: STATUS asks IPAM, and a config without IPAM is refused.
#[test]
fn status_is_ipams() {
    let env = TestEnv::new("ptp_status");
    let (c, _) = network(&env, Ipam::Ipamd, json!({}));
    let status = |c: &Value| env.plugin("ptp").command("STATUS").conf(c).run();
    status(&c).ok_silent();
    status(&merged(c.clone(), json!({"ipam": null}))).expect_err(7, &["IPAM"]);
}

/// Proves: with ipMasq a pod reaches the outside, which sees the host's
/// address; another pod of the network sees the pod's own address; CHECK
/// passes, and fails once the pod's masquerade entry is gone; DEL (also
/// after the netns is gone) leaves no masquerade entry.
#[test]
fn ip_masq_outside_sees_the_host_address() {
    let env = TestEnv::new("ptp_ipmasq");
    let (o, uplink) = crate::firewall::outside(&env);
    let _outside = Servers::start(&o.path, "O", 9000, 9001);
    let (c, _) = network(&env, Ipam::Ipamd, json!({"ipMasq": true}));
    let a = env.pod("ptp", &c);
    let b = env.pod("ptp", &c);
    let _b_servers = Servers::start(&b.ns.path, "B", 9000, 9001);
    let a_ns = Some(a.ns.path.as_str());
    for (far, host_end) in [
        (uplink.v4_addr(2), uplink.v4_addr(1)),
        (uplink.v6_addr(2), uplink.v6_addr(1)),
    ] {
        let seen = eventually_answers(|| tcp_ask(a_ns, &sock(&far, 9000)));
        assert_eq!(seen, Some(format!("O {host_end}")), "outside sees the host");
    }
    for v6 in [false, true] {
        let peer = first_addr(&b.result, v6);
        let seen = eventually_answers(|| tcp_ask(a_ns, &sock(&peer, 9000)));
        assert_eq!(seen, Some(format!("B {}", first_addr(&a.result, v6))));
    }
    a.check(&a.result);
    // CHECK verifies the masquerade: without the pod's entry it fails, naming it.
    let v4 = first_addr(&a.result, false);
    let (set, tag) = crate::firewall::masq_entry(&v4);
    let elem = format!("{{ {v4} comment \"{tag}\" }}");
    let (ok, out) = nft(&["delete", "element", "inet", "cnikit", &set, &elem]);
    assert!(ok, "{out}");
    let check = a.call("CHECK").conf(&with_prev(&a.conf, &a.result)).run();
    check.expect_err(100, &[&format!("set {set} has no entry for {v4}")]);
    a.del();
    assert_no_trace("after DEL", &traces(&a.id, &a.result));
    env.del_netns(&b.ns);
    b.del_without_netns();
    assert_no_trace("after DEL without netns", &traces(&b.id, &b.result));
}

/// Proves: a gateway outside the pods' subnet (a link-local one, as some
/// setups give every node) works: ptp makes it on-link before IPAM's default
/// route goes in via it (the reference's ADD fails there). Two pods reach
/// each other and the gateway.
#[test]
fn a_gateway_outside_the_subnet_is_made_on_link() {
    let env = TestEnv::new("ptp_outside_gateway");
    for kind in Ipam::BOTH {
        let nets = env.subnets();
        let ranges = json!([[{"subnet": nets.v4, "gateway": "169.254.1.1"}]]);
        let mut ipam = env.ipam(kind, ranges);
        ipam["routes"] = json!([{"dst": "0.0.0.0/0"}]);
        let c = conf("1.1.0", &net_name(), &ipam);
        let (a, b) = (env.pod("ptp", &c), env.pod("ptp", &c));
        let a4 = first_addr(&a.result, false);
        assert_eq!(
            routes(Some(&a.ns.name), "-4"),
            pod_routes(&nets.v4, "169.254.1.1", "default"),
            "{kind:?}"
        );
        assert!(addrs(None, host_veth(&a.result)).contains("169.254.1.1/32"));
        assert_ping(&a.ns.name, "169.254.1.1");
        assert_ping(&b.ns.name, &a4);
        a.check(&a.result);
        a.del();
        b.del();
    }
}

/// Proves: the config's `dns`, when it sets anything, is the result's (the
/// reference's rule; Podman writes it into the pod's resolv.conf).
#[test]
fn dns_from_the_config_is_the_results() {
    let env = TestEnv::new("ptp_dns");
    let dns = json!({"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]});
    let (c, _) = network(&env, Ipam::Ipamd, json!({"dns": dns}));
    let pod = env.pod("ptp", &c);
    assert_eq!(pod.result["dns"], dns, "{}", pod.result);
    pod.del();
}
