//! `ingressPolicy` `same-bridge` and `isolated` in iptables' tables (and,
//! through [`isolation`], in cnikit's own table).

use super::*;

/// Two bridges, a pod on each plus a second pod on the first; every pod's
/// firewall uses `policy`. Returns whether (pod 1 → pod 2 on the same bridge,
/// pod 1 → pod 3 on the other bridge, pod 1 → outside) pass.
pub(super) fn isolation(w: &World, policy: &str) -> (bool, bool, bool) {
    let net = format!("fwi-{}", short_hash());
    let (b1, _) = w.bridge(&net);
    let (b2, _) = w.bridge(&format!("{net}x"));
    let pods = [w.pod(&b1), w.pod(&b1), w.pod(&b2)];
    // Each pod's firewall config, on its bridge's network.
    let conf = |res: &Value, b: &Value| {
        fw_conf(
            b["name"].as_str().unwrap(),
            json!({"ingressPolicy": policy}),
            res,
        )
    };
    for ((id, ns, res), b) in pods.iter().zip([&b1, &b1, &b2]) {
        let conf = conf(res, b);
        w.call(false, "firewall", "ADD", id, ns, &conf).result();
        w.call(false, "firewall", "CHECK", id, ns, &conf)
            .ok_silent();
    }
    let _servers: Vec<Servers> = pods[1..]
        .iter()
        .map(|(_, ns, _)| Servers::start(&ns.path, "pod", TCP_PORT, TCP_PORT))
        .collect();
    let to = |i: usize| {
        let addr = sock(&first_addr(&pods[i].2, false), TCP_PORT);
        tcp_ask(Some(&pods[0].1.path), &addr).is_some()
    };
    let verdicts = (to(1), to(2), w.reaches_outside(&pods[0].1, false));
    for ((id, ns, res), b) in pods.iter().zip([&b1, &b1, &b2]) {
        w.call(false, "firewall", "DEL", id, ns, &conf(res, b))
            .ok_silent();
        w.call(false, "bridge", "DEL", id, ns, b).ok_silent();
    }
    verdicts
}

/// Proves: with iptables, `open` lets a pod reach another bridge's pod (its
/// own rule accepts what it sends); `same-bridge` stops that but keeps its
/// bridge and the outside reachable; `isolated` also cuts the pods of one
/// bridge apart. `iptables -S` lists the reference's isolation chains.
#[test]
fn same_bridge_isolation_with_iptables() {
    let w = World::new("fwp-iso", true);
    assert_eq!(isolation(&w, "open"), (true, true, true), "open");
    assert_eq!(
        isolation(&w, "same-bridge"),
        (true, false, true),
        "same-bridge"
    );
    let s = listing(&w, "iptables-nft");
    assert!(s.contains("-A FORWARD -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j CNI-ISOLATION-STAGE-1"), "{s}");
    let first = s.lines().find(|l| l.starts_with("-A FORWARD")).unwrap();
    assert!(
        first.ends_with("-j CNI-ISOLATION-STAGE-1"),
        "isolation must come first:\n{s}"
    );
    assert_eq!(isolation(&w, "isolated"), (false, false, true), "isolated");
    // GC drops the isolation of bridges that are gone, whoever made it.
    let bridges: Vec<Value> = serde_json::from_str(&must(
        &w.node,
        "ip",
        &["-j", "link", "show", "type", "bridge"],
    ))
    .unwrap();
    for b in &bridges {
        ip(&[
            "-n",
            &w.node.name,
            "link",
            "del",
            b["ifname"].as_str().unwrap(),
        ]);
    }
    w.gc(&json!({"cniVersion": "1.1.0", "name": "any", "type": "firewall", "cni.dev/valid-attachments": []}));
    let s = listing(&w, "iptables-nft");
    let stage_rules: Vec<&str> = s
        .lines()
        .filter(|l| l.starts_with("-A CNI-ISOLATION"))
        .collect();
    assert_eq!(stage_rules.len(), 2, "only the two RETURN rules stay:\n{s}");
}
