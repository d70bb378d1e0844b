//! The firewall layer on the kernel: batches apply whole or not at all,
//! bridge `ipMasq` (a container reaches an "outside" namespace, which sees
//! the host's address; entries gone after DEL, also with the netns deleted
//! first; GC), bridge `macspoofchk`, and other tables left alone.

mod common;
mod fwnet;

use common::*;
use fwnet::*;
use serde_json::{json, Value};

fn net_name() -> String {
    format!("fw-{}", short_hash())
}

fn cid(tag: &str) -> String {
    format!("ctr-{tag}-{}", short_hash())
}

fn bridge_conf(net: &str, bridge: &str, ipam: Value, extra: Value) -> Value {
    let mut c = json!({
        "cniVersion": "1.1.0",
        "name": net,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "isDefaultGateway": true,
        "ipam": ipam,
    });
    for (k, v) in extra.as_object().expect("object") {
        c[k] = v.clone();
    }
    c
}

struct Pod {
    ns: Netns,
    id: String,
    result: Value,
}

fn add(env: &TestEnv, conf: &Value) -> Pod {
    let ns = env.netns();
    let id = cid("p");
    let result = env
        .plugin("bridge")
        .attach("ADD", &id, &ns, "eth0")
        .conf(conf)
        .run()
        .result();
    wait_ipv6_ready(Some(&ns.name));
    Pod { ns, id, result }
}

fn del(env: &TestEnv, conf: &Value, pod: &Pod, netns_gone: bool) {
    let call = env
        .plugin("bridge")
        .command("DEL")
        .container(&pod.id)
        .ifname("eth0");
    let call = if netns_gone {
        call
    } else {
        call.netns(&pod.ns)
    };
    call.conf(conf).run().ok_silent();
}

fn assert_no_trace(what: &str, pod: &Pod) {
    let rules = ruleset_json();
    let mut needles = vec![pod.id.clone()];
    for v6 in [false, true] {
        if result_addresses(&pod.result)
            .iter()
            .any(|a| a.contains(':') == v6)
        {
            needles.push(format!("\"{}\"", first_addr(&pod.result, v6)));
        }
    }
    for n in needles {
        assert!(
            !rules.contains(&n),
            "{what}: the ruleset still mentions {n}:\n{rules}"
        );
    }
}

// ------------------------------------------------------------------ atomicity

/// Run the portmap plugin inside `ns`, which has a ruleset of its own.
fn portmap_in(env: &TestEnv, ns: &Netns, conf: &Value) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(env.bin.join("portmap"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs([
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "atomic"),
            ("CNI_NETNS", "/run/netns/fake"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/nonexistent"),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn portmap");
    let input = serde_json::to_vec(conf).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().expect("portmap output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn nft_in(ns: &Netns, args: &[&str]) -> String {
    let mut full = vec!["netns", "exec", &ns.name, "nft"];
    full.extend_from_slice(args);
    let (ok, out, err) = sh("ip", &full);
    assert!(ok, "nft {args:?}: {err}");
    out
}

/// The batch of a portmap ADD is: table, sets, chains, rules, then the
/// elements. A full `pm4-addr` (a foreign element in a set of size 1) makes
/// one of the last messages fail; nothing before it may be applied: no
/// maps, no chains, no elements, the ruleset exactly as before.
#[test]
fn batch_applies_whole_or_not_at_all() {
    let env = TestEnv::new("fw-atomic");
    let ns = env.netns();
    nft_in(&ns, &["add", "table", "inet", "cnikit"]);
    nft_in(
        &ns,
        &[
            "add",
            "set",
            "inet",
            "cnikit",
            "pm4-addr",
            "{ type ipv4_addr; size 1; }",
        ],
    );
    nft_in(
        &ns,
        &[
            "add",
            "element",
            "inet",
            "cnikit",
            "pm4-addr",
            "{ 192.0.2.99 }",
        ],
    );
    let before = nft_in(&ns, &["list", "ruleset"]);

    let conf = json!({
        "cniVersion": "1.0.0", "name": "atomic", "type": "portmap",
        "runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
        ]},
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/fake"}],
            "ips": [{"address": "10.66.0.2/24", "interface": 0}],
        },
    });
    let (ok, out) = portmap_in(&env, &ns, &conf);
    assert!(!ok, "ADD must fail on the full set: {out}");
    assert!(out.contains("nothing was changed"), "{out}");
    let after = nft_in(&ns, &["list", "ruleset"]);
    assert_eq!(before, after, "a failed batch left changes behind");
    assert!(
        !after.contains("pm4-any") && !after.contains("chain"),
        "{after}"
    );

    // Once the obstacle is gone the same ADD applies in full.
    nft_in(&ns, &["delete", "table", "inet", "cnikit"]);
    let (ok, out) = portmap_in(&env, &ns, &conf);
    assert!(ok, "{out}");
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
/// (both families), no route back to container subnets.
fn outside(env: &TestEnv) -> (Netns, Subnets) {
    let o = env.netns();
    let link = env.subnets();
    let (host_end, far_end) = env.veth_pair();
    ip(&["link", "set", &far_end, "netns", &o.name]);
    ip(&[
        "addr",
        "add",
        &format!("{}/24", link.v4_addr(1)),
        "dev",
        &host_end,
    ]);
    ip(&[
        "addr",
        "add",
        &format!("{}/64", link.v6_addr(1)),
        "dev",
        &host_end,
        "nodad",
    ]);
    let far = |args: &[&str]| {
        let mut full = vec!["-n", o.name.as_str()];
        full.extend_from_slice(args);
        ip(&full);
    };
    far(&[
        "addr",
        "add",
        &format!("{}/24", link.v4_addr(2)),
        "dev",
        &far_end,
    ]);
    far(&[
        "addr",
        "add",
        &format!("{}/64", link.v6_addr(2)),
        "dev",
        &far_end,
        "nodad",
    ]);
    far(&["link", "set", &far_end, "up"]);
    (o, link)
}

#[test]
fn ip_masq_outside_sees_the_host_address() {
    ip_masq_outside(false);
}

/// The same with `cnikit ipamd daemon` applying the firewall changes.
#[test]
fn ip_masq_outside_sees_the_host_address_via_daemon() {
    ip_masq_outside(true);
}

fn ip_masq_outside(daemon: bool) {
    let env = TestEnv::new(if daemon { "fw-ipmasq-d" } else { "fw-ipmasq" });
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
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("fwbr");
    let kind = if daemon {
        Ipam::IpamdDaemon
    } else {
        Ipam::Ipamd
    };
    let ipam = env.ipam(kind, nets.dual_ranges());
    let mut conf = bridge_conf(&net, &br, ipam.clone(), json!({"ipMasq": true}));
    let socket = daemon.then(|| use_daemon(&mut conf, &ipam));
    let a = add(&env, &conf);
    let b = add(&env, &conf);
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

    del(&env, &conf, &a, false);
    assert_no_trace("after DEL", &a);
    // A second container, deleted the way a runtime does after the pod died.
    let a2 = add(&env, &conf);
    let a2_ns = Some(a2.ns.path.as_str());
    assert!(eventually_answers(|| tcp_ask(a2_ns, &sock(&link.v4_addr(2), 9000))).is_some());
    env.del_netns(&a2.ns);
    del(&env, &conf, &a2, true);
    assert_no_trace("after DEL with the netns deleted first", &a2);
    del(&env, &conf, &b, false);
    assert_no_trace("after DEL", &b);

    assert_eq!(nft(&["list", "table", "inet", &other]).1, other_before);
    nft(&["delete", "table", "inet", &other]);
    if let Some(s) = socket {
        assert_eq!(daemon_fw_ops(&s, "masq-add"), 3, "the daemon did every ADD");
        assert_eq!(daemon_fw_ops(&s, "masq-del"), 3, "the daemon did every DEL");
    }
}

#[test]
fn ip_masq_gc_keeps_only_valid_attachments() {
    ip_masq_gc(false);
}

#[test]
fn ip_masq_gc_keeps_only_valid_attachments_via_daemon() {
    ip_masq_gc(true);
}

fn ip_masq_gc(daemon: bool) {
    let env = TestEnv::new(if daemon {
        "fw-ipmasq-gc-d"
    } else {
        "fw-ipmasq-gc"
    });
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("fwbr");
    let kind = if daemon {
        Ipam::IpamdDaemon
    } else {
        Ipam::Ipamd
    };
    let ipam = env.ipam(kind, nets.v4_ranges());
    let mut conf = bridge_conf(&net, &br, ipam.clone(), json!({"ipMasq": true}));
    let socket = daemon.then(|| use_daemon(&mut conf, &ipam));
    let a = add(&env, &conf);
    let b = add(&env, &conf);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": a.id, "ifname": "eth0"}]);
    env.plugin("bridge")
        .command("GC")
        .conf(&gc)
        .run()
        .ok_silent();
    let rules = ruleset_json();
    assert!(rules.contains(&a.id), "GC removed a valid attachment");
    assert_no_trace("after GC", &b);
    del(&env, &conf, &a, false);
    del(&env, &conf, &b, false);
    assert_no_trace("after DEL", &a);
    if let Some(s) = socket {
        assert_eq!(daemon_fw_ops(&s, "masq-gc"), 1, "the daemon did the GC");
        assert_eq!(daemon_fw_ops(&s, "macspoof-gc"), 1, "the daemon did the GC");
    }
}

// ------------------------------------------------------------------ macspoofchk

#[test]
fn macspoofchk_drops_frames_with_another_source_mac() {
    macspoofchk(false);
}

#[test]
fn macspoofchk_drops_frames_with_another_source_mac_via_daemon() {
    macspoofchk(true);
}

fn macspoofchk(daemon: bool) {
    let env = TestEnv::new(if daemon {
        "fw-macspoof-d"
    } else {
        "fw-macspoof"
    });
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("fwbr");
    let kind = if daemon {
        Ipam::IpamdDaemon
    } else {
        Ipam::Ipamd
    };
    let ipam = env.ipam(kind, nets.v4_ranges());
    let mut conf = bridge_conf(&net, &br, ipam.clone(), json!({"macspoofchk": true}));
    let socket = daemon.then(|| use_daemon(&mut conf, &ipam));
    let a = add(&env, &conf);
    let gw = nets.v4_addr(1);
    assert_ping(&a.ns.name, &gw);
    let mac = a.result["interfaces"][2]["mac"]
        .as_str()
        .unwrap()
        .to_string();
    ip(&[
        "-n",
        &a.ns.name,
        "link",
        "set",
        "eth0",
        "address",
        "02:00:00:00:be:ef",
    ]);
    assert!(!ping(&a.ns.name, &gw), "a spoofed source MAC got through");
    ip(&["-n", &a.ns.name, "link", "set", "eth0", "address", &mac]);
    assert_ping(&a.ns.name, &gw);
    let host_veth = a.result["interfaces"][1]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(ruleset_json().contains(&host_veth));
    del(&env, &conf, &a, false);
    let rules = ruleset_json();
    assert!(
        !rules.contains(&host_veth) && !rules.contains(&a.id),
        "{rules}"
    );
    if let Some(s) = socket {
        assert_eq!(
            daemon_fw_ops(&s, "macspoof-add"),
            1,
            "the daemon did the ADD"
        );
        assert_eq!(
            daemon_fw_ops(&s, "macspoof-del"),
            1,
            "the daemon did the DEL"
        );
    }
}

// ------------------------------------------------------------------ the daemon

/// A plugin in another network namespace than the daemon's: the daemon
/// declines (it would change the wrong ruleset) and the plugin does the
/// work itself, in its own namespace.
#[test]
fn daemon_in_another_netns_declines_and_the_plugin_does_it_itself() {
    let env = TestEnv::new("fw-daemon-netns");
    let ns = env.netns();
    let ipam = env.ipam(Ipam::IpamdDaemon, json!([]));
    let id = format!("declined-{}", short_hash());
    let mut conf = json!({
        "cniVersion": "1.0.0", "name": id, "type": "portmap",
        "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80}]},
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/fake"}],
            "ips": [{"address": "10.66.0.2/24", "interface": 0}],
        },
    });
    let socket = use_daemon(&mut conf, &ipam);
    let (ok, out) = portmap_in(&env, &ns, &conf);
    assert!(ok, "{out}");
    let listing = nft_in(&ns, &["list", "ruleset"]);
    assert!(
        listing.contains(&id),
        "not applied in the plugin's netns:\n{listing}"
    );
    assert!(
        !ruleset_json().contains(&id),
        "applied in the daemon's netns"
    );
    assert_eq!(daemon_fw_ops(&socket, "portmap-add"), 0);
    let metrics = ipamd_get(std::path::Path::new(socket.as_str().unwrap()), "/metrics").unwrap();
    assert!(
        metrics.contains("op=\"firewall.portmap-add\",outcome=\"declined\"} 1"),
        "{metrics}"
    );
}
