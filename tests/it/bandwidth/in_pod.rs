//! bandwidth on interfaces without a host end, shaped inside the pod's
//! netns: a root TBF on the pod's interface (its egress) and an ingress
//! redirect from it to an ifb in the pod whose root TBF shapes its ingress.
//! Every kind this kernel makes (macvlan, tap, host-device; dummy and vlan
//! when it has them, else the VM suite runs them), CHECK, DEL (twice,
//! without prevResult, with the netns gone), a failed ADD and the fault walk.

use super::*;

/// An interface plugin and its configuration for one pod.
pub(super) struct Kind {
    pub plugin: &'static str,
    pub conf: Value,
}

/// A macvlan pod's configuration on `master`, with `ipam` when given.
pub(super) fn macvlan(net: &str, master: &str, ipam: Option<Value>) -> Kind {
    let mut conf = json!({"cniVersion": "1.0.0", "name": net, "type": "macvlan",
        "master": master, "mode": "bridge"});
    if let Some(ipam) = ipam {
        conf["ipam"] = ipam;
    }
    Kind {
        plugin: "macvlan",
        conf,
    }
}

/// A macvlan pod (no IPAM) on a new master, of a new network named
/// `bw<tag>-…`: the network's name and the pod.
fn macvlan_pod<'e>(env: &'e TestEnv, tag: &str) -> (String, Pod<'e>) {
    let net = format!("bw{tag}-{}", short_hash());
    let (master, _) = env.veth_pair();
    let kind = macvlan(&net, &master, None);
    let pod = env.pod(kind.plugin, &kind.conf);
    (net, pod)
}

/// Every kind without a host end this kernel makes, each on a new network:
/// (network, kind).
fn kinds(env: &TestEnv) -> Vec<(String, Kind)> {
    let net = |k: &str| format!("bw{k}-{}", short_hash());
    let base = |n: &str, plugin: &'static str, extra: Value| Kind {
        plugin,
        conf: merged(
            json!({"cniVersion": "1.0.0", "name": n, "type": plugin}),
            extra,
        ),
    };
    let mut out = Vec::new();
    let (master, _) = env.veth_pair();
    let n = net("mv");
    out.push((n.clone(), macvlan(&n, &master, None)));
    let n = net("tap");
    out.push((n.clone(), base(&n, "tap", json!({}))));
    // host-device of a veth end: a veth whose peer stays on the host, which
    // prevResult does not list, so it is shaped in the pod too.
    let (_, device) = env.veth_pair();
    let n = net("hd");
    out.push((
        n.clone(),
        base(&n, "host-device", json!({"device": device})),
    ));
    if kernel_makes(&["type", "dummy"]) {
        let n = net("dm");
        let ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
        out.push((n.clone(), base(&n, "dummy", json!({"ipam": ipam}))));
    } else {
        eprintln!("this kernel has no dummy links: the VM suite shapes dummy");
    }
    let (vmaster, _) = env.veth_pair();
    if kernel_makes(&["link", &vmaster, "type", "vlan", "id", "5"]) {
        let n = net("vl");
        let keys = json!({"master": vmaster, "vlanId": 100});
        out.push((n.clone(), base(&n, "vlan", keys)));
    } else {
        eprintln!("this kernel has no 802.1q: the VM suite shapes vlan");
    }
    out
}

/// Whether `ip link add PROBE ARGS` works here (the probe is removed again).
fn kernel_makes(args: &[&str]) -> bool {
    let probe = ifname_with("bwk");
    let mut full = vec!["link", "add"];
    let at = if args.first() == Some(&"link") { 2 } else { 0 };
    full.extend_from_slice(&args[..at]);
    full.push(&probe);
    full.extend_from_slice(&args[at..]);
    let (ok, _, _) = sh("ip", &full);
    if ok {
        ip(&["link", "del", &probe]);
    }
    ok
}

/// The ifb a result reports inside the pod's netns: the last interface.
pub(super) fn pod_ifb(result: &Value, ns: &Netns) -> String {
    let ifb = result["interfaces"]
        .as_array()
        .and_then(|i| i.last())
        .expect("interfaces");
    assert_eq!(ifb["sandbox"], ns.path, "{result}");
    assert_eq!(ifb["mac"].as_str().map(str::len), Some(17), "{result}");
    ifb["name"].as_str().expect("ifb name").to_string()
}

/// The rates (bytes/s) of the root TBFs on the pod's `eth0` and on `ifb`,
/// read back with `tc -j qdisc show` in the pod.
pub(super) fn pod_tbf_rates(ns: &Netns, ifb: &str) -> (Value, Value) {
    let rate = |dev: &str| {
        let q = qdiscs_in(Some(&ns.name), dev);
        let tbf = q.iter().find(|q| q["kind"] == "tbf" && q["root"] == true);
        let tbf = tbf.unwrap_or_else(|| panic!("no root TBF on {dev}: {q:?}"));
        tbf["options"]["rate"].clone()
    };
    (rate("eth0"), rate(ifb))
}

/// The pod's `eth0` has an ingress qdisc whose one filter redirects
/// (mirred egress redirect, stolen) to `ifb`.
fn assert_redirected(ns: &Netns, ifb: &str) {
    let kinds: Vec<Value> = qdiscs_in(Some(&ns.name), "eth0")
        .iter()
        .map(|q| q["kind"].clone())
        .collect();
    assert_eq!(kinds, vec![json!("tbf"), json!("ingress")], "{kinds:?}");
    let f = ingress_filters_in(Some(&ns.name), "eth0");
    assert_eq!(f.len(), 1, "{f:?}");
    let action = &f[0]["options"]["actions"][0];
    assert_eq!(action["to_dev"], ifb, "{action}");
    assert_eq!(action["mirred_action"], "redirect", "{action}");
    assert_eq!(action["control_action"]["type"], "stolen", "{action}");
}

/// Nothing of bandwidth is left in the pod: no qdisc of ours on `eth0`, no ifb.
fn assert_unshaped(ns: &Netns, ifb: &str, what: &str) {
    let q = qdiscs_in(Some(&ns.name), "eth0");
    assert!(q.is_empty(), "{what}: {q:?}");
    assert!(link(Some(&ns.name), ifb).is_none(), "{what}: {ifb} is left");
}

/// Proves: on every kind without a host end, ADD shapes inside the pod:
/// a root TBF at the egress rate on `eth0`, an ingress qdisc redirecting to
/// an ifb in the pod (reported with the pod as its sandbox, up, `eth0`'s
/// MTU) whose root TBF has the ingress rate; nothing on the host (no ifb of
/// the reference's name). CHECK passes; DEL twice leaves the pod unshaped
/// and the interface plugin's DEL still works.
#[test]
fn every_kind_without_a_host_end_is_shaped_in_its_pod() {
    let env = TestEnv::new("bw-in-pod-kinds");
    let limits = json!({
        "ingressRate": 16_000_000, "ingressBurst": 160_000,
        "egressRate": 8_000_000, "egressBurst": 80_000,
    });
    for (net, kind) in kinds(&env) {
        let what = kind.plugin;
        let pod = env.pod(kind.plugin, &kind.conf);
        let bw = pod.chained("bandwidth", &bw_conf(&net, limits.clone(), &pod.result));
        let result = bw.add();
        let ifb = pod_ifb(&result, &pod.ns);
        assert_eq!(
            pod_tbf_rates(&pod.ns, &ifb),
            (json!(1_000_000), json!(2_000_000)),
            "{what}"
        );
        assert_redirected(&pod.ns, &ifb);
        let l = link(Some(&pod.ns.name), &ifb).expect("the ifb");
        let eth0 = link(Some(&pod.ns.name), "eth0").expect("eth0");
        assert_eq!(link_kind(&l), Some("ifb"), "{what}: {l}");
        assert!(has_flag(&l, "UP"), "{what}: {l}");
        assert_eq!(l["mtu"], eth0["mtu"], "{what}");
        assert!(link(None, &ifb_name(&net, &pod.id)).is_none(), "{what}");
        bw.check(&result);
        bw.call("DEL")
            .conf(&with_prev(&bw.conf, &result))
            .run()
            .ok_silent();
        assert_unshaped(&pod.ns, &ifb, what);
        bw.del();
        pod.del();
    }
}

/// Proves: CHECK of a pod shaped in its netns fails with code 100 naming
/// what differs (a TBF rate changed by hand on `eth0`, naming it and the
/// netns; the ifb gone, naming it; the redirect gone); DEL without
/// prevResult finds the layout from the pod and removes it all; DEL with the
/// netns gone, or without CNI_NETNS, succeeds, twice.
#[test]
fn check_and_del_of_a_pod_shaped_in_its_netns() {
    let env = TestEnv::new("bw-in-pod-check");
    let (net, pod) = macvlan_pod(&env, "c");
    let ns = pod.ns.name.clone();
    let conf = bw_conf(&net, both_ways(), &pod.result);
    let bw = pod.chained("bandwidth", &conf);
    let result = bw.add();
    let ifb = pod_ifb(&result, &pod.ns);
    let check = || bw.call("CHECK").conf(&with_prev(&conf, &result)).run();
    check().ok_silent();
    tc_ok_in(
        Some(&ns),
        &[
            "qdisc", "change", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "1mbit",
            "burst", "100000", "latency", "25ms",
        ],
    );
    check().expect_err(100, &["rate", "eth0", &pod.ns.path]);
    tc_ok_in(
        Some(&ns),
        &[
            "qdisc", "change", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "8mbit",
            "burst", "100000", "latency", "25ms",
        ],
    );
    check().ok_silent();
    tc_ok_in(Some(&ns), &["filter", "del", "dev", "eth0", "ingress"]);
    check().expect_err(100, &["ingress filter", "eth0", &ifb]);
    ip(&["-n", &ns, "link", "del", &ifb]);
    check().expect_err(100, &[&ifb, "missing"]);

    // DEL without prevResult: the pod's interface is no veth, so the pod is the site.
    bw.call("DEL").run().ok_silent();
    let mut bare = conf.clone();
    bare.as_object_mut().unwrap().remove("prevResult");
    let bare = pod.chained("bandwidth", &bare);
    bw.add();
    bare.del_twice();
    assert_unshaped(&pod.ns, &ifb, "DEL without prevResult");

    bw.add();
    bare.del_without_netns();
    bare.del_with_empty_netns();
    env.del_netns(&pod.ns);
    bare.del_twice();
    bw.del();
    pod.del();
}

/// Proves: GC of the network with no valid attachment leaves a pod shaped
/// in its netns as it is (nothing of it is on the host), and CHECK still
/// passes after it.
#[test]
fn gc_leaves_pods_shaped_in_their_netns() {
    let env = TestEnv::new("bw-in-pod-gc");
    let (net, pod) = macvlan_pod(&env, "g");
    let conf = merged(
        bw_conf(&net, both_ways(), &pod.result),
        json!({"cniVersion": "1.1.0"}),
    );
    let bw = pod.chained("bandwidth", &conf);
    let result = bw.add();
    let ifb = pod_ifb(&result, &pod.ns);
    let gc = json!({"cniVersion": "1.1.0", "name": net, "type": "bandwidth",
        "cni.dev/valid-attachments": []});
    env.plugin("bandwidth")
        .command("GC")
        .conf(&gc)
        .run()
        .ok_silent();
    assert_redirected(&pod.ns, &ifb);
    bw.check(&result);
    bw.del();
    pod.del();
}

/// Proves: an ADD that fails half-way in the pod (its `eth0` already has a
/// root qdisc, so the egress TBF cannot go there after the ingress side was
/// made) reports the kernel's refusal naming `eth0` and the netns, and
/// leaves nothing: no ifb, no ingress qdisc, the foreign qdisc untouched.
#[test]
fn a_failed_add_in_the_pod_leaves_nothing() {
    let env = TestEnv::new("bw-in-pod-failed");
    let (net, pod) = macvlan_pod(&env, "f");
    let ns = Some(pod.ns.name.as_str());
    tc_ok_in(
        ns,
        &[
            "qdisc", "add", "dev", "eth0", "root", "handle", "2:", "pfifo",
        ],
    );
    let bw = pod.chained("bandwidth", &bw_conf(&net, both_ways(), &pod.result));
    bw.try_add().expect_err(100, &["eth0", "tbf"]);
    let kinds: Vec<Value> = qdiscs_in(ns, "eth0")
        .iter()
        .map(|q| q["kind"].clone())
        .collect();
    assert_eq!(kinds, vec![json!("pfifo")]);
    let links = link_names(ns);
    assert_eq!(links.len(), 2, "the failed ADD left a link: {links:?}");
    bw.del();
    pod.del();
}

/// Proves: whichever kernel request of a bandwidth ADD on a macvlan pod
/// fails (fault injection walks every one), the ADD reports it and leaves
/// nothing in the pod: no ifb, no qdisc on `eth0`; the runtime's DEL then
/// succeeds.
#[cfg(feature = "fault-injection")]
#[test]
fn every_failure_point_of_an_add_in_the_pod_leaves_nothing() {
    let env = TestEnv::new("bw-in-pod-fault");
    let (net, pod) = macvlan_pod(&env, "x");
    let ns = Some(pod.ns.name.as_str());
    let bw = pod.chained("bandwidth", &bw_conf(&net, both_ways(), &pod.result));
    walk_add_failures(&bw, "bandwidth ADD in a pod", |n| {
        let q = qdiscs_in(ns, "eth0");
        assert!(q.is_empty(), "at {n}: {q:?}");
        let links = link_names(ns);
        assert_eq!(links.len(), 2, "at {n}: {links:?}");
    });
    pod.del();
}
