//! Our ptp against the reference /usr/lib/cni/ptp (Debian's 1.1.1): the
//! same config must print results of the same shape and leave the same
//! kernel state, in the pod and on the host.

use super::*;

/// Kernel state of one attachment, in comparable form: whole `ip -j`
/// objects, with the host end's name taken out.
#[derive(Debug, PartialEq)]
struct KernelView {
    cont_addrs: BTreeSet<String>,
    /// `ip -j route` (IPv4, IPv6) in the pod: every field (protocol, scope,
    /// prefsrc, metric, flags), without the link-local and multicast routes.
    cont_routes: Vec<Value>,
    cont_mtu: Value,
    cont_up: bool,
    host_addrs: BTreeSet<String>,
    /// `ip -j route show dev <host end>`, both families, same filter.
    host_routes: Vec<Value>,
    host_mtu: Value,
    host_up: bool,
}

/// `ip -j [-n NS] FAMILY route show [dev DEV]`, sorted, without IPv6
/// link-local and multicast routes (the reference's v4-only host end keeps a
/// link-local address and its route; cnikit's has no IPv6, see the docs).
fn route_objects(ns: Option<&str>, dev: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    for family in ["-4", "-6"] {
        let mut args = vec!["-j", "-d"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        args.extend([family, "route", "show"]);
        if let Some(dev) = dev {
            args.extend(["dev", dev]);
        }
        let text = ip(&args);
        let list: Vec<Value> = match text.trim() {
            "" => Vec::new(),
            t => serde_json::from_str(t).expect("ip -j route"),
        };
        out.extend(list.into_iter().filter(|r| {
            let dst = r["dst"].as_str().unwrap_or("");
            !dst.starts_with("fe80:") && !dst.starts_with("ff00:") && r["type"] != "multicast"
        }));
    }
    out.sort_by_key(|r| r.to_string());
    out
}

fn kernel_view(ns: &Netns, veth: &str) -> KernelView {
    let cont = link(Some(&ns.name), "eth0").expect("eth0");
    let host = link(None, veth).expect("host end");
    KernelView {
        cont_addrs: addrs(Some(&ns.name), "eth0"),
        cont_routes: route_objects(Some(&ns.name), None),
        cont_mtu: cont["mtu"].clone(),
        cont_up: has_flag(&cont, "UP"),
        host_addrs: addrs(None, veth),
        host_routes: route_objects(None, Some(veth)),
        host_mtu: host["mtu"].clone(),
        host_up: has_flag(&host, "UP"),
    }
}

/// One run of the reference or ours over `nets` on a fresh IPAM state (so
/// both get the same first addresses): its result and kernel view, after
/// pings to the node; then CHECK, and DEL twice removes both ends.
fn run(
    env: &TestEnv,
    reference: bool,
    nets: &Subnets,
    dual: bool,
    ns: &Netns,
) -> (Value, KernelView) {
    let ipam = ipam_over(env, Ipam::HostLocal, nets, dual);
    let c = merged(conf("1.0.0", "ptpdiff", &ipam), json!({"mtu": 1400}));
    let id = cid("diff");
    let call = |verb: &str| {
        plugin_or_reference(env, "ptp", reference)
            .attach(verb, &id, ns, "eth0")
            .conf(&c)
    };
    let r = call("ADD").run().result();
    wait_ipv6_ready(Some(&ns.name));
    // The reference leaves DAD on for the host end's gateway address.
    wait_ipv6_ready(None);
    assert_ping(&ns.name, &nets.v4_addr(1));
    if dual {
        assert_ping(&ns.name, &nets.v6_addr(1));
    }
    let view = kernel_view(ns, host_veth(&r));
    call("CHECK").conf(&with_prev(&c, &r)).run().ok_silent();
    call("DEL").run().ok_silent();
    call("DEL").run().ok_silent();
    assert!(link(Some(&ns.name), "eth0").is_none());
    assert!(link(None, host_veth(&r)).is_none());
    (r, view)
}

/// Proves: for the same config (host-local, mtu, IPAM default routes; dual
/// stack and IPv4 only) our ptp and the reference print results of the
/// same shape and leave the same kernel state: the pod's addresses and every
/// field of its routes (the subnet via the gateway with the address as
/// source, the gateway on-link, no kernel subnet route), and on the host
/// end the gateway addresses and the host routes to the pod.
#[test]
fn differential_against_reference_ptp() {
    let env = TestEnv::new("differential_against_reference_ptp");
    let ns = env.netns();
    for dual in [true, false] {
        let nets = env.subnets();
        let (theirs, their_view) = run(&env, true, &nets, dual, &ns);
        let (ours, our_view) = run(&env, false, &nets, dual, &ns);
        eprintln!("dual stack {dual}\nreference result: {theirs}\nour result:       {ours}");
        eprintln!("reference kernel state: {their_view:#?}\nour kernel state: {our_view:#?}");
        assert_same_result_shape(&ours, &theirs, 0);
        assert_eq!(
            our_view, their_view,
            "kernel state (left: ours, right: reference)"
        );
    }
}
