//! GC as runtimes send it: CRI-O sends GC at every start to each plugin of the
//! list at 1.1.0, with the live pods under both `cni.dev/valid-attachments`
//! and `cni.dev/attachments`, and libcni marshals a node with no pod left as
//! `null` for both.

use super::*;

/// GC `plugin` of network `net` with `valid` under both keys, as libcni writes it.
fn runtime_gc(env: &TestEnv, plugin: &Value, valid: &Value) {
    let mut conf = plugin.clone();
    conf["cniVersion"] = json!("1.1.0");
    conf["cni.dev/valid-attachments"] = valid.clone();
    conf["cni.dev/attachments"] = valid.clone();
    let name = conf["type"].as_str().expect("type").to_string();
    env.plugin(&name)
        .command("GC")
        .conf(&conf)
        .run()
        .ok_silent();
}

/// Proves: GC of a bridge (ipMasq) + ipamd + portmap list with the pods the
/// runtime still has removes a forgotten pod's veth from the bridge (while its
/// netns is still pinned, so its interface would otherwise go on holding the
/// address), its lease, its masquerade and port mapping; the valid pod keeps
/// all of its. Then GC with `null` lists (no pod left) frees the last one's
/// too, and the runtime's DELs that may still come succeed.
#[test]
fn gc_with_the_runtimes_lists_removes_forgotten_pods_veths_and_null_means_none() {
    let env = TestEnv::new("portmap-runtime-gc");
    let (net, mut bridge, _) = network(&env, false);
    bridge["ipMasq"] = json!(true);
    bridge["cniVersion"] = json!("1.1.0");
    let pods = env.pair("bridge", &bridge);
    let mut results = Vec::new();
    for pod in &pods {
        let r = pod.add();
        let m = json!([{"hostPort": host_port(), "containerPort": CTR_TCP}]);
        let pm = portmap_conf(&net, m, Some(&r));
        pod.chained("portmap", &pm).call("ADD").run().result();
        results.push(r);
    }
    let veth = |i: usize| results[i]["interfaces"][1]["name"].as_str().unwrap();
    let br = bridge["bridge"].as_str().unwrap();
    assert_eq!(
        bridge_ports(br),
        [veth(0), veth(1)].iter().map(|s| s.to_string()).collect(),
        "both pods are ports of {br}"
    );
    let portmap = json!({"name": net, "type": "portmap"});
    let both = [&bridge, &portmap];

    // The runtime still has pod 0 only.
    let valid = json!([{"containerID": pods[0].id, "ifname": "eth0"}]);
    for plugin in both {
        runtime_gc(&env, plugin, &valid);
    }
    assert!(
        link(None, veth(1)).is_none(),
        "GC kept the forgotten pod's veth"
    );
    assert!(
        link(Some(&pods[1].ns.name), "eth0").is_none(),
        "the forgotten pod kept its interface"
    );
    assert!(
        link(None, veth(0)).is_some(),
        "GC removed a valid pod's veth"
    );
    assert_eq!(env.lease_count(&bridge["ipam"], &net), 1);
    assert_no_trace("after GC", &traces(&pods[1].id, &results[1]));
    assert!(
        ruleset_json().contains(&pods[0].id),
        "GC removed a valid pod's rules"
    );

    // No pod left: libcni sends null for both lists.
    for plugin in both {
        runtime_gc(&env, plugin, &Value::Null);
    }
    assert!(
        link(None, veth(0)).is_none(),
        "GC with null lists kept a veth"
    );
    assert_eq!(
        env.lease_count(&bridge["ipam"], &net),
        0,
        "GC with null lists kept a lease"
    );
    assert_no_trace(
        "after GC with null lists",
        &traces(&pods[0].id, &results[0]),
    );
    assert!(bridge_ports(br).is_empty(), "{br} still has ports");
    for pod in &pods {
        pod.del();
    }
}
