//! The firewall layer on the kernel: batches apply whole or not at all,
//! bridge `ipMasq` (a container reaches an "outside" namespace, which sees
//! the host's address; entries gone after DEL, also with the netns deleted
//! first; GC), bridge `macspoofchk`, and other tables left alone.

use crate::support::*;
use serde_json::{json, Value};

/// A 1.1.0 gateway bridge on a new network over ipamd (served by its daemon,
/// which then also applies the firewall changes, when `daemon`), with
/// `extra` keys: the config, its subnets, and the daemon's socket.
fn network(
    env: &TestEnv,
    daemon: bool,
    dual: bool,
    extra: Value,
) -> (Value, Subnets, Option<Value>) {
    let net = format!("fw-{}", short_hash());
    let nets = env.subnets();
    let br = env.link_name("fwbr");
    let ranges = if dual {
        nets.dual_ranges()
    } else {
        nets.v4_ranges()
    };
    let ipam = env.ipam(Ipam::ipamd(daemon), ranges);
    let mut conf = merged(
        json!({
            "cniVersion": "1.1.0",
            "name": net,
            "type": "bridge",
            "bridge": br,
            "isGateway": true,
            "isDefaultGateway": true,
            "ipam": ipam,
        }),
        extra,
    );
    let socket = daemon.then(|| use_daemon(&mut conf, &ipam));
    (conf, nets, socket)
}

fn assert_pod_gone(what: &str, pod: &Pod) {
    assert_no_trace(what, &traces(&pod.id, &pod.result));
}

// ------------------------------------------------------------------ atomicity

/// A portmap ADD of a synthetic attachment (10.66.0.2) named `name`,
/// mapping tcp 8080 (and udp 5353 when `udp`).
fn synthetic_portmap(name: &str, udp: bool) -> Value {
    let mut mappings = vec![json!({"hostPort": 8080, "containerPort": 80})];
    if udp {
        mappings.push(json!({"hostPort": 5353, "containerPort": 53, "protocol": "udp"}));
    }
    json!({
        "cniVersion": "1.0.0", "name": name, "type": "portmap",
        "runtimeConfig": {"portMappings": mappings},
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/fake"}],
            "ips": [{"address": "10.66.0.2/24", "interface": 0}],
        },
    })
}

/// Run the portmap plugin inside `ns`, which has a ruleset of its own.
fn portmap_in(env: &TestEnv, ns: &Netns, conf: &Value) -> Outcome {
    Call::new(env.bin.join("portmap"))
        .env("CNI_PATH", "/nonexistent")
        .attach_at("ADD", "atomic", "/run/netns/fake")
        .conf(conf)
        .exec_in(ns)
        .run()
}

fn nft_in(ns: &Netns, args: &[&str]) -> String {
    let mut full = vec!["netns", "exec", &ns.name, "nft"];
    full.extend_from_slice(args);
    let (ok, out, err) = sh("ip", &full);
    assert!(ok, "nft {args:?}: {err}");
    out
}

/// The batch of a portmap ADD is: table, sets, chains, rules, then the
/// elements. A full `pm4-masq-all` (a foreign element in a set of size 1)
/// makes one of the last messages fail; nothing before it may be applied: no
/// maps, no chains, no elements, the ruleset exactly as before.
#[test]
fn batch_applies_whole_or_not_at_all() {
    let (env, ns) = TestEnv::with_netns("fw-atomic");
    nft_in(&ns, &["add", "table", "inet", "cnikit"]);
    let set = |what: &str, arg: &str| {
        nft_in(&ns, &["add", what, "inet", "cnikit", "pm4-masq-all", arg]);
    };
    set("set", "{ type ipv4_addr; size 1; }");
    set("element", "{ 192.0.2.99 }");
    let before = nft_in(&ns, &["list", "ruleset"]);

    let mut conf = synthetic_portmap("atomic", true);
    conf["masqAll"] = json!(true);
    let o = portmap_in(&env, &ns, &conf);
    assert!(!o.success(), "ADD must fail on the full set: {}", o.stdout);
    assert!(o.stdout.contains("nothing was changed"), "{}", o.stdout);
    let after = nft_in(&ns, &["list", "ruleset"]);
    assert_eq!(before, after, "a failed batch left changes behind");
    assert!(
        !after.contains("pm4-any") && !after.contains("chain"),
        "{after}"
    );

    // Once the obstacle is gone the same ADD applies in full.
    nft_in(&ns, &["delete", "table", "inet", "cnikit"]);
    let o = portmap_in(&env, &ns, &conf);
    assert!(o.success(), "{}", o.stdout);
    let listing = nft_in(&ns, &["list", "ruleset"]);
    for want in [
        "pm-prerouting",
        "pm-hostports",
        "tcp . 8080",
        "udp . 5353",
        "10.66.0.2",
    ] {
        assert!(listing.contains(want), "missing {want}:\n{listing}");
    }
}

// ------------------------------------------------------------------ ipMasq

/// An "outside" netns on a veth link from the host: host end .1, outside .2
/// (both families), no route back to container subnets (also ptp's ipMasq test).
pub(crate) fn outside(env: &TestEnv) -> (Netns, Subnets) {
    let o = env.netns();
    let link = env.subnets();
    let (host_end, far_end) = env.veth_pair();
    ip(&["link", "set", &far_end, "netns", &o.name]);
    for (ns, dev, host) in [(None, &host_end, 1), (Some(o.name.as_str()), &far_end, 2)] {
        let v4 = format!("{}/24", link.v4_addr(host));
        let v6 = format!("{}/64", link.v6_addr(host.into()));
        let mut cmds = vec![
            vec!["addr", "add", v4.as_str(), "dev", dev],
            vec!["addr", "add", v6.as_str(), "dev", dev, "nodad"],
        ];
        if ns.is_some() {
            cmds.push(vec!["link", "set", dev, "up"]);
        }
        for cmd in cmds {
            let mut full = ns.map_or(vec![], |n| vec!["-n", n]);
            full.extend(cmd);
            ip(&full);
        }
    }
    (o, link)
}

without_and_with_daemon!(ip_masq_outside: ip_masq_outside_sees_the_host_address, ip_masq_outside_sees_the_host_address_via_daemon);

/// A container behind ipMasq reaches the outside, which sees the host's
/// address; within the network nothing is masqueraded; DEL (also after the
/// netns is gone) leaves no trace; another table stays untouched.
fn ip_masq_outside(daemon: bool) {
    let env = TestEnv::new("fw-ipmasq");
    // Someone else's table must come through untouched.
    let other = format!("other{}", short_hash());
    let (ok, out) = nft(&[
        "add",
        "table",
        "inet",
        &other,
        "{ chain c { type filter hook forward priority 0; ip saddr 203.0.113.7 drop; }; }",
    ]);
    assert!(ok, "{out}");
    let other_before = nft(&["list", "table", "inet", &other]).1;

    let (o, link) = outside(&env);
    let _outside = Servers::start(&o.path, "O", 9000, 9001);
    let (conf, _, socket) = network(&env, daemon, true, json!({"ipMasq": true}));
    let a = env.pod("bridge", &conf);
    let b = env.pod("bridge", &conf);
    let _b_servers = Servers::start(&b.ns.path, "B", 9000, 9001);
    let a_ns = Some(a.ns.path.as_str());

    for (far, host_end) in [
        (link.v4_addr(2), link.v4_addr(1)),
        (link.v6_addr(2), link.v6_addr(1)),
    ] {
        let seen = eventually_answers(|| tcp_ask(a_ns, &sock(&far, 9000)));
        assert_eq!(
            seen,
            Some(format!("O {host_end}")),
            "outside must see the host"
        );
        let seen = eventually_answers(|| udp_ask(a_ns, &sock(&far, 9001)));
        assert_eq!(
            seen,
            Some(format!("O {host_end}")),
            "outside must see the host (udp)"
        );
    }
    // Inside the network's subnets nothing is masqueraded.
    for v6 in [false, true] {
        let peer = first_addr(&b.result, v6);
        let seen = eventually_answers(|| tcp_ask(a_ns, &sock(&peer, 9000)));
        assert_eq!(seen, Some(format!("B {}", first_addr(&a.result, v6))));
    }

    a.del();
    assert_pod_gone("after DEL", &a);
    // A second container, deleted the way a runtime does after the pod died.
    let a2 = env.pod("bridge", &conf);
    let a2_ns = Some(a2.ns.path.as_str());
    assert!(eventually_answers(|| tcp_ask(a2_ns, &sock(&link.v4_addr(2), 9000))).is_some());
    env.del_netns(&a2.ns);
    a2.del_without_netns();
    assert_pod_gone("after DEL with the netns deleted first", &a2);
    b.del();
    assert_pod_gone("after DEL", &b);

    assert_eq!(nft(&["list", "table", "inet", &other]).1, other_before);
    nft(&["delete", "table", "inet", &other]);
    assert_fw_ops(socket.as_ref(), &[("masq-add", 3), ("masq-del", 3)]);
}

without_and_with_daemon!(ip_masq_gc: ip_masq_gc_keeps_only_valid_attachments, ip_masq_gc_keeps_only_valid_attachments_via_daemon);

/// GC keeps the masquerading of the valid attachments only.
fn ip_masq_gc(daemon: bool) {
    let env = TestEnv::new("fw-ipmasq-gc");
    let (conf, _, socket) = network(&env, daemon, false, json!({"ipMasq": true}));
    let a = env.pod("bridge", &conf);
    let b = env.pod("bridge", &conf);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": a.id, "ifname": "eth0"}]);
    env.plugin("bridge")
        .command("GC")
        .conf(&gc)
        .run()
        .ok_silent();
    let rules = ruleset_json();
    assert!(rules.contains(&a.id), "GC removed a valid attachment");
    assert_pod_gone("after GC", &b);
    a.del();
    b.del();
    assert_pod_gone("after DEL", &a);
    assert_fw_ops(socket.as_ref(), &[("masq-gc", 1), ("macspoof-gc", 1)]);
}

without_and_with_daemon!(ip_masq_check: ip_masq_check_fails_while_the_masquerade_is_gone, ip_masq_check_fails_while_the_masquerade_is_gone_via_daemon);

/// CHECK with ipMasq verifies the masquerade: it fails (code 100) naming the
/// address once the pod's entry is gone or another attachment's, and passes
/// again once the entry is back as ADD made it.
fn ip_masq_check(daemon: bool) {
    let env = TestEnv::new("fw-ipmasq-check");
    let (conf, _, socket) = network(&env, daemon, false, json!({"ipMasq": true}));
    let a = env.pod("bridge", &conf);
    a.check(&a.result);
    let v4 = first_addr(&a.result, false);
    let (set, tag) = masq_entry(&v4);
    let element = |verb: &str, comment: &str| {
        let elem = format!("{{ {v4} comment \"{comment}\" }}");
        let (ok, out) = nft(&[verb, "element", "inet", "cnikit", &set, &elem]);
        assert!(ok, "{out}");
    };
    let check = || a.call("CHECK").conf(&with_prev(&a.conf, &a.result)).run();
    element("delete", &tag);
    let missing = format!("set {set} has no entry for {v4}");
    check().expect_err(100, &[&format!("masquerade of {v4}"), &missing]);
    element("add", "someone/else/eth0");
    check().expect_err(100, &["belongs to container else"]);
    element("delete", "someone/else/eth0");
    element("add", &tag);
    a.check(&a.result);
    a.del();
    assert_pod_gone("after DEL", &a);
    assert_fw_ops(socket.as_ref(), &[("masq-check", 2)]);
}

/// The `masq4-…` set of table inet cnikit that holds `addr`, and the
/// element's comment (its owner's tag); ptp's ipMasq test reads it too.
pub(crate) fn masq_entry(addr: &str) -> (String, String) {
    let rules: Value = serde_json::from_str(&ruleset_json()).expect("nft json");
    let sets = rules["nftables"].as_array().into_iter().flatten();
    for set in sets.map(|item| &item["set"]) {
        let name = set["name"].as_str().unwrap_or_default();
        if set["table"] != "cnikit" || !name.starts_with("masq4-") {
            continue;
        }
        for e in set["elem"].as_array().into_iter().flatten() {
            if e["elem"]["val"] == addr {
                let tag = e["elem"]["comment"].as_str().expect("a tag");
                return (name.to_string(), tag.to_string());
            }
        }
    }
    panic!("no masq4- set holds {addr}");
}

// ------------------------------------------------------------------ macspoofchk

without_and_with_daemon!(macspoofchk: macspoofchk_drops_frames_with_another_source_mac, macspoofchk_drops_frames_with_another_source_mac_via_daemon);

/// Frames with another source MAC than the container's are dropped.
fn macspoofchk(daemon: bool) {
    let env = TestEnv::new("fw-macspoof");
    let (conf, nets, socket) = network(&env, daemon, false, json!({"macspoofchk": true}));
    let gw = nets.v4_addr(1);
    let a = env.pod("bridge", &conf);
    let ns = &a.ns.name;
    assert_ping(ns, &gw);
    let mac = a.result["interfaces"][2]["mac"]
        .as_str()
        .unwrap()
        .to_string();
    let set_mac = |mac: &str| ip(&["-n", ns, "link", "set", "eth0", "address", mac]);
    set_mac("02:00:00:00:be:ef");
    assert!(!ping(ns, &gw), "a spoofed source MAC got through");
    set_mac(&mac);
    assert_ping(ns, &gw);
    let host_veth = a.result["interfaces"][1]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(ruleset_json().contains(&host_veth));
    // `nft list` names the guarded port (it reads the set's key byte order).
    let (_, ports) = nft(&["-j", "list", "set", "bridge", "cnikit", "macspoof-ports"]);
    assert!(ports.contains(&format!("\"{host_veth}\"")), "{ports}");
    a.del();
    let rules = ruleset_json();
    assert!(
        !rules.contains(&host_veth) && !rules.contains(&a.id),
        "{rules}"
    );
    assert_fw_ops(socket.as_ref(), &[("macspoof-add", 1), ("macspoof-del", 1)]);
}

// ------------------------------------------------------------------ the daemon

/// A plugin in another network namespace than the daemon's: the daemon
/// declines (it would change the wrong ruleset) and the plugin does the
/// work itself, in its own namespace.
#[test]
fn daemon_in_another_netns_declines_and_the_plugin_does_it_itself() {
    let (env, ns) = TestEnv::with_netns("fw-daemon-netns");
    let ipam = env.ipam(Ipam::IpamdDaemon, json!([]));
    let id = format!("declined-{}", short_hash());
    let mut conf = synthetic_portmap(&id, false);
    let socket = use_daemon(&mut conf, &ipam);
    let o = portmap_in(&env, &ns, &conf);
    assert!(o.success(), "{}", o.stdout);
    let listing = nft_in(&ns, &["list", "ruleset"]);
    assert!(
        listing.contains(&id),
        "not applied in the plugin's netns:\n{listing}"
    );
    assert!(
        !ruleset_json().contains(&id),
        "applied in the daemon's netns"
    );
    assert_fw_ops(Some(&socket), &[("portmap-add", 0)]);
    let metrics = ipamd_get(std::path::Path::new(socket.as_str().unwrap()), "/metrics").unwrap();
    assert!(
        metrics.contains("op=\"firewall.portmap-add\",outcome=\"declined\"} 1"),
        "{metrics}"
    );
}
