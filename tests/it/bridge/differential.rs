//! Our bridge against the reference /usr/lib/cni/bridge: the same config
//! must print results of the same shape and leave the same kernel state.

use super::*;

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
        cont_up: has_flag(&cont, "UP"),
        bridge_addrs: addrs(None, br),
        bridge_mtu: link(None, br).expect("bridge")["mtu"].clone(),
        port_flags: port_flags(&port),
        port_mtu: port["mtu"].clone(),
    }
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
        let c = merged(
            conf("1.0.0", &br, env.ipam(Ipam::HostLocal, nets.dual_ranges())),
            json!({"hairpinMode": true, "mtu": 1450}),
        );
        let call = |verb: &str| {
            plugin_or_reference(&env, "bridge", reference)
                .attach(verb, &id, &ns, "eth0")
                .conf(&c)
        };
        let r = call("ADD").run().result();
        wait_ipv6_ready(Some(&ns.name));
        wait_ipv6_ready(None);
        assert_ping(&ns.name, &nets.v4_addr(1));
        assert_ping(&ns.name, &nets.v6_addr(1));
        views.push(kernel_view(&ns, &br, host_veth(&r)));
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
    assert_same_result_shape(ours, theirs, 1);
    assert_eq!(
        views[1], views[0],
        "kernel state (left: ours, right: reference)"
    );
}
