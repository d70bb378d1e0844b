//! Without iptables, in cnikit's own table; and through the ipamd daemon.

use super::isolation::isolation;
use super::*;

/// Proves: on a node without iptables the plugin uses cnikit's own table:
/// pods reach the outside, `same-bridge` isolates bridges there too, CHECK
/// passes, and DEL and GC (of a pod whose DEL never came) leave no element
/// of theirs; GC also drops the isolation of bridges that are gone.
#[test]
fn own_table_without_iptables() {
    let w = World::new("fwp-own", false);
    assert_eq!(isolation(&w, "same-bridge"), (true, false, true));
    let net = format!("fwo-{}", short_hash());
    let (bridge, br) = w.bridge(&net);
    let pods = [w.pod(&bridge), w.pod(&bridge)];
    let conf = |res: &Value| {
        fw_conf(
            &net,
            json!({"ingressPolicy": "same-bridge", "cniVersion": "1.1.0"}),
            res,
        )
    };
    for (id, ns, res) in &pods {
        w.call(false, "firewall", "ADD", id, ns, &conf(res))
            .result();
    }
    let table = w.own_table();
    assert!(
        table.contains("fw-forward") && table.contains(&pods[0].0),
        "{table}"
    );
    assert!(!in_ns(&w.node, "iptables-nft", &["-S"])
        .1
        .contains("CNI-FORWARD"));
    // GC with only the first pod valid: the second's entries go.
    let gc = json!({
        "cniVersion": "1.1.0", "name": net, "type": "firewall",
        "cni.dev/valid-attachments": [{"containerID": pods[0].0, "ifname": "eth0"}],
    });
    w.gc(&gc);
    let table = w.own_table();
    assert!(
        table.contains(&pods[0].0) && !table.contains(&pods[1].0),
        "{table}"
    );
    let (id, ns, res) = &pods[0];
    w.call(false, "firewall", "DEL", id, ns, &conf(res))
        .ok_silent();
    for (id, ns, _) in &pods {
        w.call(false, "bridge", "DEL", id, ns, &bridge).ok_silent();
    }
    let table = w.own_table();
    assert!(!table.contains(&pods[0].0), "{table}");
    assert!(
        table.contains(&format!("\"{br}\"")),
        "the bridge's isolation stays:\n{table}"
    );
    ip(&["-n", &w.node.name, "link", "del", &br]);
    w.gc(&gc);
    let table = w.own_table();
    assert!(
        !table.contains(&format!("\"{br}\"")),
        "GC kept a gone bridge's isolation:\n{table}"
    );
}

/// Everything that may hold a pod's firewall entries in the test host:
/// iptables' and ip6tables' rules (with their comments) and the nftables
/// ruleset.
fn host_rules() -> String {
    let mut out = String::new();
    for cmd in ["iptables-save", "ip6tables-save"] {
        out += &sh(cmd, &[]).1;
    }
    out + &ruleset_json()
}

/// Proves: with the ipamd daemon running beside the plugins (the test host's
/// namespace), the plugin hands ADD, CHECK and DEL to the daemon's firewall
/// service, which applies them (its metrics count each), and after DEL
/// nothing of the pod is left wherever the host keeps it.
#[test]
fn requests_go_through_the_daemon() {
    let env = TestEnv::new("fwp-daemon");
    let ipam = env.ipam(Ipam::IpamdDaemon, env.subnets().v4_ranges());
    let net = format!("fwd-{}", short_hash());
    let mut bridge = json!({
        "cniVersion": "1.0.0", "name": net, "type": "bridge", "bridge": env.link_name("fwdb"),
        "isGateway": true, "ipam": ipam,
    });
    let socket = use_daemon(&mut bridge, &ipam);
    let pod = env.pod("bridge", &bridge);
    let mut conf = fw_conf(&net, json!({}), &pod.result);
    conf["daemonSocket"] = socket.clone();
    let fw = pod.chained("firewall", &conf);
    assert_eq!(fw.add(), pod.result);
    fw.check(&pod.result);
    let tag = format!("{net}/{}/eth0", pod.id);
    assert!(host_rules().contains(&tag), "no entry tagged {tag}");
    fw.del();
    assert!(
        !host_rules().contains(&tag),
        "DEL left an entry tagged {tag}"
    );
    assert_fw_ops(
        Some(&socket),
        &[("forward-add", 1), ("forward-check", 1), ("forward-del", 1)],
    );
    pod.del();
}
