//! Which attachment owns a mapping: collisions, DEL without netns,
//! prevResult or mappings, GC, CHECK, and the configuration keys.

use super::*;

without_and_with_daemon!(collision: collision_is_refused_and_changes_nothing, collision_is_refused_and_changes_nothing_via_daemon);

/// A host port held by another attachment is refused (105, naming the
/// owner) with nothing changed; through the daemon the error keeps its CNI
/// code and message.
fn collision(daemon: bool) {
    let env = TestEnv::new("portmap-collision");
    // Every conf below gets the daemon socket (null: none).
    let socket = daemon_socket(&env, daemon);
    let net = net_name();
    let nets = env.subnets();
    let (p1, p2) = (host_port(), host_port());
    let prev_a = fake_prev(&nets.v4_addr(10), &nets.v6_addr(10));
    let prev_b = fake_prev(&nets.v4_addr(11), &nets.v6_addr(11));
    let (a, b) = (cid("a"), cid("b"));
    let conf = |mappings: Value, prev: &Value| {
        with_socket(portmap_conf(&net, mappings, Some(prev)), &socket)
    };
    let conf_a = conf(json!([{"hostPort": p1, "containerPort": 80}]), &prev_a);
    pm_call(&env, "ADD", &a, &conf_a).result();
    // Our own mapping again is fine.
    pm_call(&env, "ADD", &a, &conf_a).result();

    // B asks for a free port and A's port: refused as a whole.
    let map_b = json!([
        {"hostPort": p2, "containerPort": 80},
        {"hostPort": p1, "containerPort": 81},
    ]);
    let e =
        pm_call(&env, "ADD", &b, &conf(map_b, &prev_b)).expect_err(105, &[&format!("{p1}"), &a]);
    assert!(e.msg.contains("nothing was changed"), "{}", e.msg);
    assert_no_trace("after the refused ADD", std::slice::from_ref(&b));
    // A's mapping is intact.
    pm_call(&env, "CHECK", &a, &conf_a).ok_silent();
    // The same port on another hostIP is another mapping.
    let map_c = json!([{"hostPort": p1, "containerPort": 80, "hostIP": "127.0.0.1"}]);
    let conf_c = conf(map_c, &prev_b);
    pm_call(&env, "ADD", &b, &conf_c).result();
    for (id, conf) in [(&a, &conf_a), (&b, &conf_c)] {
        pm_call(&env, "DEL", id, conf).ok_silent();
    }
    assert_no_trace("after DEL", &[a, b]);
    assert_fw_ops(
        daemon.then_some(&socket),
        &[("portmap-add", 3), ("portmap-del-keys", 2)],
    );
}

/// A pod on a dual-stack bridge of a new network with a tcp and a udp
/// mapping: the network, the pod, the mappings and its traces.
fn mapped_pod(env: &TestEnv) -> (String, Pod<'_>, Value, Vec<String>) {
    let (net, bridge, _) = network(env, true);
    let mappings = two_mappings(host_port(), host_port());
    let a = attach(env, &net, &bridge, Some(&mappings));
    let trace = traces(&a.id, &a.result);
    (net, a, mappings, trace)
}

#[test]
fn del_without_prev_result_after_netns_gone_and_twice() {
    let env = TestEnv::new("portmap-del");
    let (net, a, mappings, trace) = mapped_pod(&env);
    env.del_netns(&a.ns);
    // What a runtime sends once the container is gone: no netns, no prevResult.
    let pm = a.chained("portmap", &portmap_conf(&net, mappings.clone(), None));
    pm.del_without_netns();
    pm.del_without_netns();
    assert_no_trace("after DEL without netns and prevResult", &trace);
    a.del_without_netns();
}

/// Proves: a DEL whose runtime did not pass `runtimeConfig.portMappings`
/// again (cnitool/libcni 1.1.2 does this) still removes the attachment's
/// mappings, found by the marker its ADD left; and a DEL of an attachment
/// that never had mappings stays a no-op.
#[test]
fn del_without_mappings_still_removes_what_add_mapped() {
    let env = TestEnv::new("portmap-del-nomap");
    let (net, a, _, trace) = mapped_pod(&env);
    a.chained("portmap", &portmap_conf(&net, json!(null), None))
        .del_without_netns();
    assert_no_trace("after DEL without portMappings", &trace);
    a.del();
}

without_and_with_daemon!(gc_valid_list: gc_removes_attachments_not_in_the_valid_list, gc_removes_attachments_not_in_the_valid_list_via_daemon);

/// GC removes the mappings of the network's attachments not in the list.
fn gc_valid_list(daemon: bool) {
    let env = TestEnv::new("portmap-gc");
    let socket = daemon_socket(&env, daemon);
    let net = net_name();
    let other_net = net_name();
    let nets = env.subnets();
    let ids: Vec<String> = (0..3).map(|i| cid(&format!("g{i}"))).collect();
    for (i, id) in ids.iter().enumerate() {
        let prev = fake_prev(&nets.v4_addr(20 + i as u8), &nets.v6_addr(20 + i as u16));
        let m = json!([{"hostPort": host_port(), "containerPort": 80}]);
        let name = if i == 2 { &other_net } else { &net };
        let conf = with_socket(portmap_conf(name, m, Some(&prev)), &socket);
        pm_call(&env, "ADD", id, &conf).result();
    }
    let gc = |valid: Value| {
        let conf = json!({
            "cniVersion": "1.1.0", "name": net, "type": "portmap",
            "cni.dev/valid-attachments": valid,
            "daemonSocket": socket,
        });
        env.plugin("portmap")
            .command("GC")
            .conf(&conf)
            .run()
            .ok_silent();
    };
    assert_eq!(
        markers_of(&ids),
        ids.iter().collect::<Vec<_>>(),
        "ADD leaves a marker per attachment"
    );
    gc(json!([{"containerID": ids[0], "ifname": "eth0"}]));
    let rules = ruleset_json();
    assert!(rules.contains(&ids[0]), "GC removed a valid attachment");
    assert!(!rules.contains(&ids[1]), "GC kept an invalid attachment");
    assert!(rules.contains(&ids[2]), "GC touched another network");
    assert_eq!(
        markers_of(&ids),
        [&ids[0], &ids[2]],
        "GC removes the markers it removes entries of"
    );
    gc(json!([]));
    assert_no_trace("after GC with an empty list", &ids[..2]);
    assert_eq!(markers_of(&ids), [&ids[2]]);
    let m = json!([{"hostPort": 1, "containerPort": 80}]);
    let conf = with_socket(portmap_conf(&other_net, m, None), &socket);
    pm_call(&env, "DEL", &ids[2], &conf).ok_silent();
    assert_no_trace("after DEL", &ids);
    assert_fw_ops(daemon.then_some(&socket), &[("portmap-gc", 2)]);
}

/// In a netns of its own: the ipamd daemons of other tests put back what
/// is deleted of their host's table (`cnikit firewall restore`'s repair).
#[test]
fn check_detects_a_deleted_map_entry() {
    let (env, ns) = TestEnv::with_netns("portmap-check");
    let net = net_name();
    let nets = env.subnets();
    let id = cid("c");
    let p = host_port();
    let prev = fake_prev(&nets.v4_addr(30), &nets.v6_addr(30));
    let conf = portmap_conf(
        &net,
        json!([{"hostPort": p, "containerPort": 80}]),
        Some(&prev),
    );
    let call = |cmd: &str| {
        env.plugin("portmap")
            .attach_at(cmd, &id, "/run/netns/fake")
            .conf(&conf)
            .exec_in(&ns)
            .run()
    };
    let nft_here = |args: &str| {
        let mut full = vec!["netns", "exec", &ns.name, "nft"];
        full.extend(args.split(' '));
        sh("ip", &full)
    };
    call("ADD").result();
    call("CHECK").ok_silent();
    let (ok, _, err) = nft_here(&format!(
        "delete element inet cnikit pm4-any {{ tcp . {p} }}"
    ));
    assert!(ok, "{err}");
    call("CHECK").expect_err(100, &["CHECK", &format!("tcp/{p}"), "missing"]);
    call("DEL").ok_silent();
    let (_, table, _) = nft_here("list table inet cnikit");
    assert!(!table.contains(&format!("{p}")), "after DEL:\n{table}");
}

#[test]
fn config_keys() {
    let env = TestEnv::new("portmap-keys");
    let prev = fake_prev("10.254.0.2", "fd00:254::2");
    let base = portmap_conf(
        &net_name(),
        json!([{"hostPort": host_port(), "containerPort": 80}]),
        Some(&prev),
    );
    let with = |k: &str, v: Value| merged(base.clone(), json!({ k: v }));
    let id = cid("k");
    let add = |conf: &Value| pm_call(&env, "ADD", &id, conf);
    add(&with("conditionsV4", json!(["-s", "1.2.3.4"])))
        .expect_err(2, &["conditionsV4", "1.2.3.4"]);
    add(&with("conditionsV6", json!(["-s", "::1"]))).expect_err(2, &["conditionsV6"]);
    add(&with("markMasqBit", json!(32))).expect_err(7, &["markMasqBit"]);
    add(&with("backend", json!("ebpf"))).expect_err(7, &["backend"]);
    let mut bad_map = base.clone();
    bad_map["runtimeConfig"]["portMappings"] = json!([{"hostPort": 0, "containerPort": 80}]);
    add(&bad_map).expect_err(7, &["hostPort"]);
    let o = add(&with("backend", json!("iptables")));
    o.result();
    assert!(o.stderr.contains("nftables"), "{}", o.stderr);
    pm_call(&env, "DEL", &id, &base).ok_silent();

    // No mappings: prevResult passes through, DEL is a no-op.
    let mut none = base.clone();
    none["runtimeConfig"] = json!({});
    assert_eq!(add(&none).result()["ips"], prev["ips"]);
    none.as_object_mut().unwrap().remove("prevResult");
    pm_call(&env, "DEL", &id, &none).ok_silent();
}

/// The container IDs among `ids` that have a portmap marker file.
fn markers_of(ids: &[String]) -> Vec<&String> {
    let marked = portmap_marker_ids();
    ids.iter().filter(|id| marked.contains(*id)).collect()
}
