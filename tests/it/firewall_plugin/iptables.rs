//! In the node's iptables-nft tables: traffic through a drop policy, the
//! listing, counters, CHECK and DEL; side by side with the reference; every
//! failure point of an ADD.

use super::*;

/// Proves: on a node whose iptables FORWARD policy is drop, a pod on a
/// bridge cannot reach the outside; after our firewall ADD it can (IPv4 and
/// IPv6), while new connections from outside to the pod stay dropped;
/// `iptables -S` and `ip6tables -S` still work and list the reference's
/// layout (the jump at the top of FORWARD, CNI-FORWARD with the admin jump
/// and the pod's two rules per address, with our comment); `iptables -L -v`
/// counts the pod's packets on them; CHECK passes, and fails (100) once a
/// rule is deleted by hand; DEL leaves nothing of the pod and traffic is
/// dropped again; other software's rules are untouched throughout.
#[test]
fn pod_traffic_passes_a_drop_policy_only_with_the_plugin() {
    let w = World::new("fwp-drop", true);
    let (net, bridge) = w.network("fwp");
    let (id, pod, result) = w.pod(&bridge);
    let before = listing(&w, "iptables-nft");
    w.assert_dropped(&pod, "before the firewall's ADD");

    let conf = fw_conf(&net, json!({"backend": ""}), &result);
    let out = w.call(false, "firewall", "ADD", &id, &pod, &conf).result();
    assert_eq!(out, result, "firewall passes prevResult through");
    w.assert_passes(&pod);
    let (v4, v6) = (first_addr(&result, false), first_addr(&result, true));
    let in_pod = Servers::start(&pod.path, "pod", TCP_PORT, TCP_PORT);
    let back = tcp_ask(Some(&w.outside.path), &sock(&v4, TCP_PORT));
    assert!(
        back.is_none(),
        "a new connection from outside reached the pod"
    );
    drop(in_pod);

    let s = listing(&w, "iptables-nft");
    let tag = format!("cnikit {net}/{id}/eth0");
    let want = [
        "-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD".to_string(),
        "-A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN".to_string(),
        format!("-A CNI-FORWARD -d {v4}/32 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment \"{tag}\" -j ACCEPT"),
        format!("-A CNI-FORWARD -s {v4}/32 -m comment --comment \"{tag}\" -j ACCEPT"),
    ];
    for line in &want {
        assert!(
            s.lines().any(|l| l == line),
            "iptables -S lacks {line:?}:\n{s}"
        );
    }
    let first_forward = s.lines().find(|l| l.starts_with("-A FORWARD")).unwrap();
    assert_eq!(first_forward, want[0], "the jump must come first:\n{s}");
    for line in before.lines() {
        assert!(
            s.contains(line),
            "other software's rule {line:?} is gone:\n{s}"
        );
    }
    let s6 = listing(&w, "ip6tables-nft");
    assert!(
        s6.contains(&format!(
            "-s {v6}/128 -m comment --comment \"{tag}\" -j ACCEPT"
        )),
        "{s6}"
    );
    let counted = w.iptables(&["-L", "CNI-FORWARD", "-v", "-n", "-x"]);
    let pkts: u64 = counted
        .lines()
        .filter(|l| l.contains(&v4) && l.contains("cnikit"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert!(
        pkts > 0,
        "iptables -L -v counts nothing for the pod:\n{counted}"
    );

    w.firewall(false, "CHECK", &net, &id, &pod, &result)
        .ok_silent();
    let rules = w.iptables(&["-S", "CNI-FORWARD"]);
    let number = rules
        .lines()
        .filter(|l| l.starts_with("-A"))
        .position(|l| l == want[3])
        .expect("the pod's rule")
        + 1;
    w.iptables(&["-D", "CNI-FORWARD", &number.to_string()]);
    w.firewall(false, "CHECK", &net, &id, &pod, &result)
        .expect_err(100, &["CHECK", &v4]);

    let mut bare = conf.clone();
    bare.as_object_mut().unwrap().remove("prevResult");
    for _ in 0..2 {
        w.call(false, "firewall", "DEL", &id, &pod, &bare)
            .ok_silent();
    }
    for cmd in ["iptables-nft", "ip6tables-nft"] {
        let s = listing(&w, cmd);
        assert!(
            !s.contains(&id) && !s.contains(&v4) && !s.contains(&v6),
            "{cmd} after DEL:\n{s}"
        );
    }
    w.assert_dropped(&pod, "after the firewall's DEL");
    let after = listing(&w, "iptables-nft");
    for line in before.lines() {
        assert!(after.contains(line), "{line:?} is gone after DEL");
    }
    w.call(false, "bridge", "DEL", &id, &pod, &bridge)
        .ok_silent();
}

/// Proves: a config written for the reference with `"backend": "nftables"`
/// (v1.9.1 makes its automatic choice for any value but "iptables" and
/// "firewalld") lets the pod through the drop policy as an empty backend
/// does, with the same rules, and DEL takes them back.
#[test]
fn backend_nftables_opens_the_pod_as_the_automatic_choice() {
    let w = World::new("fwp-nftb", true);
    let (net, bridge) = w.network("fwn");
    let (id, pod, result) = w.pod(&bridge);
    w.assert_dropped(&pod, "before the firewall's ADD");
    let conf = fw_conf(&net, json!({"backend": "nftables"}), &result);
    let out = w.call(false, "firewall", "ADD", &id, &pod, &conf);
    assert_eq!(out.result(), result, "firewall passes prevResult through");
    assert!(
        out.stderr.contains("choosing automatically"),
        "{}",
        out.stderr
    );
    w.assert_passes(&pod);
    let v4 = first_addr(&result, false);
    assert!(
        listing(&w, "iptables-nft").contains(&format!("-s {v4}/32 -m comment")),
        "the pod's rule is not where the automatic choice puts it"
    );
    w.call(false, "firewall", "DEL", &id, &pod, &conf)
        .ok_silent();
    w.assert_dropped(&pod, "after the firewall's DEL");
    w.call(false, "bridge", "DEL", &id, &pod, &bridge)
        .ok_silent();
}

/// Proves: the reference plugin (Debian's 1.1.1, through iptables) lets
/// the pod through the same drop policy, and both plugins side by side
/// share one FORWARD jump and one CNI-FORWARD chain: no duplicates whichever
/// runs first, each DEL removes only its own pod's rules, GC only ours, and
/// `iptables -S` keeps working. Our DEL with a prevResult also removes the
/// reference's rules of a pod it added (a node switching plugins).
#[test]
fn reference_and_cnikit_share_the_layout() {
    let w = World::new("fwp-reference", true);
    let (net, bridge) = w.network("fwr");
    let (id_a, pod_a, res_a) = w.pod(&bridge);
    let (id_b, pod_b, res_b) = w.pod(&bridge);
    // Ours first, then the reference's: it must find our jump.
    w.firewall(false, "ADD", &net, &id_b, &pod_b, &res_b)
        .result();
    w.firewall(true, "ADD", &net, &id_a, &pod_a, &res_a)
        .result();
    assert!(
        w.reaches_outside(&pod_a, false),
        "the reference's pod is dropped"
    );
    assert!(w.reaches_outside(&pod_b, false), "our pod is dropped");
    let s = listing(&w, "iptables-nft");
    let count = |needle: &str| s.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("-j CNI-FORWARD"), 1, "{s}");
    assert_eq!(count("-j CNI-ADMIN"), 1, "{s}");
    let a4 = first_addr(&res_a, false);
    assert!(
        s.contains(&format!("-A CNI-FORWARD -s {a4}/32 -j ACCEPT")),
        "{s}"
    );

    // GC with no valid attachment takes our pod's rules, never the reference's.
    w.gc(&json!({"cniVersion": "1.1.0", "name": net, "type": "firewall", "cni.dev/valid-attachments": []}));
    let s = listing(&w, "iptables-nft");
    assert!(
        !s.contains(&first_addr(&res_b, false)) && s.contains(&a4),
        "{s}"
    );
    assert!(
        w.reaches_outside(&pod_a, false),
        "GC took the reference's rules"
    );
    w.firewall(false, "ADD", &net, &id_b, &pod_b, &res_b)
        .result();
    w.firewall(true, "DEL", &net, &id_a, &pod_a, &res_a)
        .ok_silent();
    assert!(!w.reaches_outside(&pod_a, false));
    assert!(
        w.reaches_outside(&pod_b, false),
        "the reference's DEL took our pod's rules"
    );
    w.firewall(false, "DEL", &net, &id_b, &pod_b, &res_b)
        .ok_silent();
    let s = listing(&w, "iptables-nft");
    assert!(
        !s.contains(&first_addr(&res_b, false)) && !s.contains(&a4),
        "{s}"
    );
    // A pod the reference added (before the node switched to cnikit): our
    // DEL with its prevResult removes the reference's untagged rules too.
    w.firewall(true, "ADD", &net, &id_a, &pod_a, &res_a)
        .result();
    assert!(listing(&w, "iptables-nft").contains(&a4));
    w.firewall(false, "DEL", &net, &id_a, &pod_a, &res_a)
        .ok_silent();
    let s = listing(&w, "iptables-nft");
    assert!(!s.contains(&a4), "the reference's rules of {a4} stay:\n{s}");
    for (id, ns) in [(&id_a, &pod_a), (&id_b, &pod_b)] {
        w.call(false, "bridge", "DEL", id, ns, &bridge).ok_silent();
    }
}

/// Proves: whichever kernel request of a firewall ADD fails (fault
/// injection walks every one), the ADD reports it and the node's iptables
/// and nftables rulesets are exactly as before; the runtime's DEL succeeds.
#[cfg(feature = "fault-injection")]
#[test]
fn every_failure_point_of_an_add_leaves_the_rulesets_as_they_were() {
    let w = World::new("fwp-fault", true);
    let (net, bridge) = w.network("fwf");
    let (id, pod, result) = w.pod(&bridge);
    let conf = fw_conf(&net, json!({"ingressPolicy": "same-bridge"}), &result);
    let rulesets = || {
        (
            listing(&w, "iptables-nft"),
            listing(&w, "ip6tables-nft"),
            must(&w.node, "nft", &["list", "ruleset"]),
        )
    };
    let before = rulesets();
    for n in 1..100 {
        let out = w
            .env
            .plugin("firewall")
            .attach("ADD", &id, &pod, "eth0")
            .env("CNIKIT_FAULT_NETLINK", &n.to_string())
            .conf(&conf)
            .exec_in(&w.node)
            .run();
        if out.success() {
            assert!(n > 3, "only {} failure points", n - 1);
            eprintln!("firewall ADD: {} failure points, each failed once", n - 1);
            w.call(false, "firewall", "DEL", &id, &pod, &conf)
                .ok_silent();
            w.call(false, "bridge", "DEL", &id, &pod, &bridge)
                .ok_silent();
            return;
        }
        let e = out.err();
        assert!(e.msg.contains("injected failure"), "at {n}: {e:?}");
        assert!(rulesets() == before, "at {n}: the rulesets changed");
        w.call(false, "firewall", "DEL", &id, &pod, &conf)
            .ok_silent();
    }
    panic!("firewall ADD still failing after 100 injected failures");
}
