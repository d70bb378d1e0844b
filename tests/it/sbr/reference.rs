//! cnikit's sbr against Debian's reference sbr 1.1.1 (/usr/lib/cni/sbr) on two pods set up
//! alike by hand: the same rules, the same tables, the same result; each DEL undoes the
//! other's ADD. (1.1.1 has no `table` key; its table choice, rules and route moves are
//! v1.9.1's.)

use super::*;

/// A pod whose `net1` is a veth (its peer up on the test host), set up by hand: two IPv4
/// addresses and one IPv6 address of one subnet each, a default route per family, a route
/// via a gateway of the subnet and a gateway-less one with a metric.
fn hand_made_pod(env: &TestEnv, nets: &Subnets) -> Netns {
    let ns = env.netns();
    let host_end = env.link_name("sbh");
    let n = ns.name.as_str();
    ip(&[
        "link", "add", &host_end, "type", "veth", "peer", "name", "net1", "netns", n,
    ]);
    ip(&["link", "set", &host_end, "up"]);
    let v4 = |h: u8| format!("{}/24", nets.v4_addr(h));
    for cmd in [
        vec!["link", "set", "net1", "up"],
        vec!["addr", "add", &v4(5), "dev", "net1"],
        vec!["addr", "add", &v4(6), "dev", "net1"],
        vec![
            "route",
            "add",
            "default",
            "via",
            &nets.v4_addr(1),
            "dev",
            "net1",
        ],
        vec!["route", "add", "192.168.50.0/24", "via", &nets.v4_addr(254)],
        vec![
            "route",
            "add",
            "172.16.0.0/16",
            "dev",
            "net1",
            "metric",
            "50",
        ],
    ] {
        ip(&[&["-n", n][..], &cmd[..]].concat());
    }
    let v6 = format!("{}/64", nets.v6_addr(5));
    ip(&["-n", n, "-6", "addr", "add", &v6, "dev", "net1", "nodad"]);
    let gw6 = nets.v6_addr(1);
    ip(&[
        "-n", n, "-6", "route", "add", "default", "via", &gw6, "dev", "net1",
    ]);
    ns
}

/// What an interface plugin would have printed for [`hand_made_pod`]'s `net1`.
fn prev_of(nets: &Subnets, ns: &Netns) -> Value {
    json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": "net1", "sandbox": ns.path}],
        "ips": [
            {"address": format!("{}/24", nets.v4_addr(5)), "gateway": nets.v4_addr(1), "interface": 0},
            {"address": format!("{}/64", nets.v6_addr(5)), "gateway": nets.v6_addr(1), "interface": 0},
            {"address": format!("{}/24", nets.v4_addr(6)), "interface": 0}]})
}

fn call(env: &TestEnv, reference: bool, verb: &str, id: &str, ns: &Netns, conf: &Value) -> Call {
    let plugin = match reference {
        true => env.ref_plugin("sbr"),
        false => env.plugin("sbr"),
    };
    plugin.attach(verb, id, ns, "net1").conf(conf)
}

/// Proves: on identical pods, cnikit's ADD leaves exactly the rules (priorities
/// included) and routes of every table but local that the reference's does — three
/// addresses, three tables 100–102, the IPv6 one and the routes of the other family's
/// tables included — and prints the same result; each one's DEL removes what the other's
/// ADD made, leaving the same state.
#[test]
fn same_rules_and_tables_as_the_reference() {
    let env = TestEnv::new("sbr_reference");
    let nets = env.subnets();
    let pods = [hand_made_pod(&env, &nets), hand_made_pod(&env, &nets)];
    assert_eq!(
        policy(&pods[0]),
        policy(&pods[1]),
        "the pods differ before sbr"
    );
    let id = cid("ref");
    let confs = pods
        .each_ref()
        .map(|ns| sbr_conf("1.0.0", &prev_of(&nets, ns), json!({})));
    let added = [false, true].map(|reference| {
        let i = usize::from(reference);
        call(&env, reference, "ADD", &id, &pods[i], &confs[i])
            .run()
            .result()
    });
    let mut ours = added[0].clone();
    ours["interfaces"][0]["sandbox"] = added[1]["interfaces"][0]["sandbox"].clone();
    assert_eq!(ours, added[1], "results differ");
    let after = pods.each_ref().map(policy);
    assert_eq!(after[0], after[1], "rules or routes differ");
    let tables: Vec<String> = source_rules(&pods[0]).into_iter().map(|(_, t)| t).collect();
    assert_eq!(tables, ["100", "102", "101"], "{:#}", after[0]);
    assert!(table(&pods[0], "-4", "main").is_empty());
    // Each DEL removes the other's rules: the reference's DEL on our pod, ours on its.
    for (i, reference) in [(0, true), (1, false)] {
        call(&env, reference, "DEL", &id, &pods[i], &confs[i])
            .run()
            .ok();
    }
    assert_eq!(policy(&pods[0]), policy(&pods[1]), "after DEL");
    assert!(source_rules(&pods[0]).is_empty());
}

/// Proves: a second sbr ADD on the pod (another address of the interface, say) takes the
/// next free tables, as the reference's does, and DEL removes the rules of both.
#[test]
fn a_second_add_takes_the_next_free_tables_as_the_reference() {
    let env = TestEnv::new("sbr_reference_second");
    let nets = env.subnets();
    let pods = [hand_made_pod(&env, &nets), hand_made_pod(&env, &nets)];
    let id = cid("ref2");
    for (i, reference) in [(0, false), (1, true)] {
        let ns = &pods[i];
        let first = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "net1"}],
            "ips": [{"address": format!("{}/24", nets.v4_addr(5)), "gateway": nets.v4_addr(1)}]});
        let c = sbr_conf("1.0.0", &first, json!({}));
        call(&env, reference, "ADD", &id, ns, &c).run().result();
        // No gateway: the first ADD took the subnet route out of main, so a default
        // route via the gateway could not be added (in either plugin).
        let second = json!({"cniVersion": "1.0.0",
            "ips": [{"address": format!("{}/24", nets.v4_addr(6))}]});
        let c = sbr_conf("1.0.0", &second, json!({}));
        call(&env, reference, "ADD", &id, ns, &c).run().result();
    }
    assert_eq!(policy(&pods[0]), policy(&pods[1]));
    let rules = source_rules(&pods[0]);
    assert_eq!(
        rules.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(),
        ["100", "101"]
    );
    for (i, reference) in [(0, false), (1, true)] {
        let c = sbr_conf("1.0.0", &json!(null), json!({}));
        call(&env, reference, "DEL", &id, &pods[i], &c).run().ok();
    }
    assert_eq!(policy(&pods[0]), policy(&pods[1]), "after DEL");
    assert!(source_rules(&pods[0]).is_empty());
}
