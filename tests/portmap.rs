//! portmap end to end on the kernel: bridge + IPAM + portmap chained with
//! prevResult and runtimeConfig.portMappings, real TCP and UDP servers in a
//! container netns, reached over 127.0.0.1, the bridge gateway (v4 and v6)
//! and hairpin from a second container; then DEL (with and without netns and
//! prevResult), collision, GC, CHECK, conntrack, iptables-nft coexistence,
//! and (ignored, a benchmark) 200 attachments.
//!
//! Only loopback and addresses inside the test's own namespaces are ever
//! traffic targets.

mod common;
mod fwnet;

use common::*;
use fwnet::*;
use serde_json::{json, Value};
use std::time::Instant;

/// Ports the servers listen on inside the container.
const CTR_TCP: u16 = 8080;
const CTR_UDP: u16 = 5353;

fn net_name() -> String {
    format!("pm-{}", short_hash())
}

fn cid(tag: &str) -> String {
    format!("ctr-{tag}-{}", short_hash())
}

fn bridge_conf(net: &str, bridge: &str, ipam: Value) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": net,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "isDefaultGateway": true,
        "ipam": ipam,
    })
}

fn portmap_conf(net: &str, mappings: Value, prev: Option<&Value>) -> Value {
    let mut c = json!({
        "cniVersion": "1.0.0",
        "name": net,
        "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": mappings},
    });
    if let Some(p) = prev {
        c["prevResult"] = p.clone();
    }
    c
}

/// tcp hostPort → CTR_TCP and udp hostPort → CTR_UDP.
fn two_mappings(tcp: u16, udp: u16) -> Value {
    json!([
        {"hostPort": tcp, "containerPort": CTR_TCP, "protocol": "tcp"},
        {"hostPort": udp, "containerPort": CTR_UDP, "protocol": "udp"},
    ])
}

/// One container on the bridge; `mappings` chains portmap after it.
struct Pod {
    ns: Netns,
    id: String,
    result: Value,
    /// The bridge config's `daemonSocket` (null: none), used by portmap too.
    daemon: Value,
}

fn attach(env: &TestEnv, net: &str, bridge: &Value, mappings: Option<&Value>) -> Pod {
    let ns = env.netns();
    let id = cid("p");
    let result = env
        .plugin("bridge")
        .attach("ADD", &id, &ns, "eth0")
        .conf(bridge)
        .run()
        .result();
    let daemon = bridge["daemonSocket"].clone();
    if let Some(m) = mappings {
        let mut conf = portmap_conf(net, m.clone(), Some(&result));
        conf["daemonSocket"] = daemon.clone();
        let pm = env
            .plugin("portmap")
            .attach("ADD", &id, &ns, "eth0")
            .conf(&conf)
            .run()
            .result();
        // portmap passes prevResult through unchanged.
        assert_eq!(pm, result, "portmap must return prevResult unchanged");
    }
    wait_ipv6_ready(Some(&ns.name));
    Pod {
        ns,
        id,
        result,
        daemon,
    }
}

fn portmap_del(env: &TestEnv, net: &str, pod: &Pod, mappings: &Value, prev: bool) {
    let mut conf = portmap_conf(net, mappings.clone(), prev.then_some(&pod.result));
    conf["daemonSocket"] = pod.daemon.clone();
    env.plugin("portmap")
        .attach("DEL", &pod.id, &pod.ns, "eth0")
        .conf(&conf)
        .run()
        .ok_silent();
}

fn assert_no_trace(what: &str, needles: &[String]) {
    let rules = ruleset_json();
    for n in needles {
        assert!(
            !rules.contains(n.as_str()),
            "{what}: the ruleset still mentions {n}:\n{rules}"
        );
    }
}

/// What identifies a pod in the ruleset: its container ID and its addresses.
fn traces(pod: &Pod) -> Vec<String> {
    vec![
        pod.id.clone(),
        format!("\"{}\"", first_addr(&pod.result, false)),
        format!("\"{}\"", first_addr(&pod.result, true)),
    ]
}

// ------------------------------------------------------------------ traffic

fn traffic(kind: Ipam) {
    let env = TestEnv::new("portmap-traffic");
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("pmbr");
    let ipam = env.ipam(kind, nets.dual_ranges());
    let mut bridge = bridge_conf(&net, &br, ipam.clone());
    let socket = (kind == Ipam::IpamdDaemon).then(|| use_daemon(&mut bridge, &ipam));
    // A container reaching its own mapping gets its packets back on the port
    // they came in on; with br_netfilter loaded that is bridged, which needs
    // hairpin mode on the port (as with the reference plugins).
    bridge["hairpinMode"] = json!(true);
    let (tcp, udp) = (host_port(), host_port());
    let mappings = two_mappings(tcp, udp);
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let b = attach(&env, &net, &bridge, None);
    let _servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    let (gw4, gw6) = (nets.v4_addr(1), nets.v6_addr(1));
    let b_ns = Some(b.ns.path.as_str());
    let a_ns = Some(a.ns.path.as_str());

    // From the host: localhost and the gateway, v4 and v6, TCP and UDP.
    let targets = [
        (None, "127.0.0.1"),
        (None, gw4.as_str()),
        (None, gw6.as_str()),
        (b_ns, gw4.as_str()),
        (b_ns, gw6.as_str()),
        (a_ns, gw4.as_str()),
        (a_ns, gw6.as_str()),
    ];
    for (from, host) in targets {
        let who = format!("from {} to {host}", from.unwrap_or("host"));
        let t = eventually_answers(|| tcp_ask(from, &sock(host, tcp)));
        assert!(
            t.as_deref().is_some_and(|r| r.starts_with("A ")),
            "tcp {who}: {t:?}"
        );
        let u = eventually_answers(|| udp_ask(from, &sock(host, udp)));
        assert!(
            u.as_deref().is_some_and(|r| r.starts_with("A ")),
            "udp {who}: {u:?}"
        );
    }
    // Hairpin is masqueraded: A sees the gateway, not B, as the peer.
    let seen = tcp_ask(b_ns, &sock(&gw4, tcp)).unwrap_or_default();
    assert_eq!(
        seen,
        format!("A {gw4}"),
        "hairpin from B must be masqueraded"
    );

    let mut check = portmap_conf(&net, mappings.clone(), Some(&a.result));
    check["daemonSocket"] = a.daemon.clone();
    env.plugin("portmap")
        .attach("CHECK", &a.id, &a.ns, "eth0")
        .conf(&check)
        .run()
        .ok_silent();

    portmap_del(&env, &net, &a, &mappings, true);
    for (from, host) in targets {
        assert_eq!(
            tcp_ask(from, &sock(host, tcp)),
            None,
            "tcp to {host} after DEL"
        );
        assert_eq!(
            udp_ask(from, &sock(host, udp)),
            None,
            "udp to {host} after DEL"
        );
    }
    assert_no_trace("after DEL", &traces(&a));
    for pod in [&a, &b] {
        env.plugin("bridge")
            .attach("DEL", &pod.id, &pod.ns, "eth0")
            .conf(&bridge)
            .run()
            .ok_silent();
    }
    if let Some(s) = socket {
        for op in ["portmap-add", "portmap-check", "portmap-del"] {
            assert_eq!(daemon_fw_ops(&s, op), 1, "{op} by the daemon");
        }
        // The UDP mapping's stale-conntrack flush on ADD, too.
        assert_eq!(daemon_fw_ops(&s, "conntrack-flush-udp"), 1);
    }
}

#[test]
fn traffic_ipamd() {
    traffic(Ipam::Ipamd);
}

/// The same with `cnikit ipamd daemon` applying every firewall change: the
/// daemon's metrics prove the plugins used it.
#[test]
fn traffic_ipamd_daemon() {
    traffic(Ipam::IpamdDaemon);
}

#[test]
fn traffic_host_local() {
    traffic(Ipam::HostLocal);
}

/// A mapping with a hostIP answers on that address only (here the IPv6
/// gateway), and ::1 is never mapped: the kernel never routes ::1 off the
/// loopback device (there is no IPv6 route_localnet), so [::1]:hostPort
/// must fail cleanly rather than hang or reach something else.
#[test]
fn host_ip_mappings_and_ipv6_localhost() {
    let env = TestEnv::new("portmap-host-ip");
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("pmbr");
    let bridge = bridge_conf(&net, &br, env.ipam(Ipam::Ipamd, nets.dual_ranges()));
    let (any, only6) = (host_port(), host_port());
    let (gw4, gw6) = (nets.v4_addr(1), nets.v6_addr(1));
    let mappings = json!([
        {"hostPort": any, "containerPort": CTR_TCP},
        {"hostPort": only6, "containerPort": CTR_TCP, "hostIP": gw6},
    ]);
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let _servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    assert!(eventually_answers(|| tcp_ask(None, &sock(&gw6, any))).is_some());
    assert_eq!(tcp_ask(None, &sock("::1", any)), None);
    assert!(eventually_answers(|| tcp_ask(None, &sock(&gw6, only6))).is_some());
    for host in [gw4.as_str(), "127.0.0.1", "::1"] {
        assert_eq!(
            tcp_ask(None, &sock(host, only6)),
            None,
            "{host} is not the hostIP"
        );
    }
    portmap_del(&env, &net, &a, &mappings, true);
    assert_no_trace("after DEL", &traces(&a));
}

// ------------------------------------------------------------------ UDP conntrack

/// A UDP flow tracked before the mapping existed must not keep bypassing the
/// DNAT: ADD deletes the stale conntrack entry, so the same socket (same
/// tuple) reaches the container right after ADD.
#[test]
fn add_flushes_stale_udp_conntrack() {
    let env = TestEnv::new("portmap-conntrack");
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("pmbr");
    let bridge = bridge_conf(&net, &br, env.ipam(Ipam::Ipamd, nets.v4_ranges()));
    let a = attach(&env, &net, &bridge, None);
    let _servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    let udp = host_port();
    let target = sock(&nets.v4_addr(1), udp);
    // The NAT chains must exist before the first datagram: only then does
    // its flow get a (null) NAT binding that later packets keep using.
    let other = json!([{"hostPort": host_port(), "containerPort": 1}]);
    let other = portmap_conf(&net, other, Some(&a.result));
    pm_call(&env, "ADD", "other", &other).result();

    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket.connect(&target).unwrap();
    socket
        .set_read_timeout(Some(std::time::Duration::from_millis(300)))
        .unwrap();
    let _ = socket.send(b"before"); // tracked, unanswered (no host listener)
    std::thread::sleep(std::time::Duration::from_millis(100));

    let mappings = json!([{"hostPort": udp, "containerPort": CTR_UDP, "protocol": "udp"}]);
    let conf = portmap_conf(&net, mappings.clone(), Some(&a.result));
    env.plugin("portmap")
        .attach("ADD", &a.id, &a.ns, "eth0")
        .conf(&conf)
        .run()
        .result();
    let mut buf = [0u8; 256];
    let mut answer = None;
    for _ in 0..10 {
        let _ = socket.send(b"after");
        if let Ok(n) = socket.recv(&mut buf) {
            answer = Some(String::from_utf8_lossy(&buf[..n]).into_owned());
            break;
        }
    }
    assert!(
        answer.as_deref().is_some_and(|a| a.starts_with("A ")),
        "the old flow still bypasses the mapping: {answer:?}"
    );
    portmap_del(&env, &net, &a, &mappings, true);
    pm_call(&env, "DEL", "other", &other).ok_silent();
}

// ------------------------------------------------------------------ ownership

/// Synthetic attachments: portmap needs only prevResult, not a real netns.
fn fake_prev(addr4: &str, addr6: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "cni0"}, {"name": "eth0", "sandbox": "/run/netns/fake"}],
        "ips": [
            {"address": format!("{addr4}/24"), "interface": 1},
            {"address": format!("{addr6}/64"), "interface": 1},
        ],
    })
}

fn pm_call(env: &TestEnv, cmd: &str, id: &str, conf: &Value) -> Outcome {
    env.plugin("portmap")
        .command(cmd)
        .container(id)
        .netns_path("/run/netns/fake")
        .ifname("eth0")
        .conf(conf)
        .run()
}

#[test]
fn collision_is_refused_and_changes_nothing() {
    collision(false);
}

/// Through the daemon the error keeps its CNI code (105) and message.
#[test]
fn collision_is_refused_and_changes_nothing_via_daemon() {
    collision(true);
}

fn collision(daemon: bool) {
    let env = TestEnv::new("portmap-collision");
    // Every conf below gets the daemon socket (null: none).
    let socket = if daemon {
        env.ipam(Ipam::IpamdDaemon, json!([]))["socket"].clone()
    } else {
        Value::Null
    };
    let portmap_conf = |net: &str, m: Value, prev: Option<&Value>| {
        let mut c = portmap_conf(net, m, prev);
        c["daemonSocket"] = socket.clone();
        c
    };
    let net = net_name();
    let nets = env.subnets();
    let (p1, p2) = (host_port(), host_port());
    let prev_a = fake_prev(&nets.v4_addr(10), &nets.v6_addr(10));
    let prev_b = fake_prev(&nets.v4_addr(11), &nets.v6_addr(11));
    let (a, b) = (cid("a"), cid("b"));
    let map_a = json!([{"hostPort": p1, "containerPort": 80}]);
    let conf_a = portmap_conf(&net, map_a.clone(), Some(&prev_a));
    pm_call(&env, "ADD", &a, &conf_a).result();
    // Our own mapping again is fine.
    pm_call(&env, "ADD", &a, &conf_a).result();

    // B asks for a free port and A's port: refused as a whole.
    let map_b = json!([
        {"hostPort": p2, "containerPort": 80},
        {"hostPort": p1, "containerPort": 81},
    ]);
    let conf_b = portmap_conf(&net, map_b, Some(&prev_b));
    let e = pm_call(&env, "ADD", &b, &conf_b).expect_err(105, &[&format!("{p1}"), &a]);
    assert!(e.msg.contains("nothing was changed"), "{}", e.msg);
    assert_no_trace("after the refused ADD", std::slice::from_ref(&b));
    // A's mapping is intact.
    pm_call(&env, "CHECK", &a, &conf_a).ok_silent();
    // The same port on another hostIP is another mapping.
    let map_c = json!([{"hostPort": p1, "containerPort": 80, "hostIP": "127.0.0.1"}]);
    let conf_c = portmap_conf(&net, map_c, Some(&prev_b));
    pm_call(&env, "ADD", &b, &conf_c).result();
    for (id, conf) in [(&a, &conf_a), (&b, &conf_c)] {
        pm_call(&env, "DEL", id, conf).ok_silent();
    }
    assert_no_trace("after DEL", &[a, b]);
    if daemon {
        assert_eq!(
            daemon_fw_ops(&socket, "portmap-add"),
            3,
            "ADDs by the daemon"
        );
        assert_eq!(
            daemon_fw_ops(&socket, "portmap-del"),
            2,
            "DELs by the daemon"
        );
    }
}

#[test]
fn del_without_prev_result_after_netns_gone_and_twice() {
    let env = TestEnv::new("portmap-del");
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("pmbr");
    let bridge = bridge_conf(&net, &br, env.ipam(Ipam::Ipamd, nets.dual_ranges()));
    let mappings = two_mappings(host_port(), host_port());
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let trace = traces(&a);
    env.del_netns(&a.ns);
    // What a runtime sends once the container is gone: no netns, no prevResult.
    let conf = portmap_conf(&net, mappings.clone(), None);
    for _ in 0..2 {
        env.plugin("portmap")
            .command("DEL")
            .container(&a.id)
            .ifname("eth0")
            .conf(&conf)
            .run()
            .ok_silent();
    }
    assert_no_trace("after DEL without netns and prevResult", &trace);
    env.plugin("bridge")
        .command("DEL")
        .container(&a.id)
        .ifname("eth0")
        .conf(&bridge)
        .run()
        .ok_silent();
}

#[test]
fn gc_removes_attachments_not_in_the_valid_list() {
    gc_valid_list(false);
}

#[test]
fn gc_removes_attachments_not_in_the_valid_list_via_daemon() {
    gc_valid_list(true);
}

fn gc_valid_list(daemon: bool) {
    let env = TestEnv::new("portmap-gc");
    let socket = if daemon {
        env.ipam(Ipam::IpamdDaemon, json!([]))["socket"].clone()
    } else {
        Value::Null
    };
    let portmap_conf = |net: &str, m: Value, prev: Option<&Value>| {
        let mut c = portmap_conf(net, m, prev);
        c["daemonSocket"] = socket.clone();
        c
    };
    let net = net_name();
    let other_net = net_name();
    let nets = env.subnets();
    let ids: Vec<String> = (0..3).map(|i| cid(&format!("g{i}"))).collect();
    for (i, id) in ids.iter().enumerate() {
        let prev = fake_prev(&nets.v4_addr(20 + i as u8), &nets.v6_addr(20 + i as u16));
        let m = json!([{"hostPort": host_port(), "containerPort": 80}]);
        let name = if i == 2 { &other_net } else { &net };
        pm_call(&env, "ADD", id, &portmap_conf(name, m, Some(&prev))).result();
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
    gc(json!([{"containerID": ids[0], "ifname": "eth0"}]));
    let rules = ruleset_json();
    assert!(rules.contains(&ids[0]), "GC removed a valid attachment");
    assert!(!rules.contains(&ids[1]), "GC kept an invalid attachment");
    assert!(rules.contains(&ids[2]), "GC touched another network");
    gc(json!([]));
    assert_no_trace("after GC with an empty list", &ids[..2]);
    let m = json!([{"hostPort": 1, "containerPort": 80}]);
    pm_call(&env, "DEL", &ids[2], &portmap_conf(&other_net, m, None)).ok_silent();
    assert_no_trace("after DEL", &ids);
    if daemon {
        assert_eq!(daemon_fw_ops(&socket, "portmap-gc"), 2, "GCs by the daemon");
    }
}

#[test]
fn check_detects_a_deleted_map_entry() {
    let env = TestEnv::new("portmap-check");
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
    pm_call(&env, "ADD", &id, &conf).result();
    pm_call(&env, "CHECK", &id, &conf).ok_silent();
    let (ok, out) = nft(&[
        "delete",
        "element",
        "inet",
        "cnikit",
        "pm4-any",
        &format!("{{ tcp . {p} }}"),
    ]);
    assert!(ok, "{out}");
    pm_call(&env, "CHECK", &id, &conf).expect_err(100, &["CHECK", &format!("tcp/{p}"), "missing"]);
    pm_call(&env, "DEL", &id, &conf).ok_silent();
    assert_no_trace("after DEL", &[id]);
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
    let with = |k: &str, v: Value| {
        let mut c = base.clone();
        c[k] = v;
        c
    };
    let id = cid("k");
    pm_call(
        &env,
        "ADD",
        &id,
        &with("conditionsV4", json!(["-s", "1.2.3.4"])),
    )
    .expect_err(2, &["conditionsV4"]);
    pm_call(
        &env,
        "ADD",
        &id,
        &with("conditionsV6", json!(["-s", "::1"])),
    )
    .expect_err(2, &["conditionsV6"]);
    pm_call(&env, "ADD", &id, &with("markMasqBit", json!(32))).expect_err(7, &["markMasqBit"]);
    pm_call(&env, "ADD", &id, &with("backend", json!("ebpf"))).expect_err(7, &["backend"]);
    let bad_map = {
        let mut c = base.clone();
        c["runtimeConfig"]["portMappings"] = json!([{"hostPort": 0, "containerPort": 80}]);
        c
    };
    pm_call(&env, "ADD", &id, &bad_map).expect_err(7, &["hostPort"]);
    let o = pm_call(&env, "ADD", &id, &with("backend", json!("iptables")));
    o.result();
    assert!(o.stderr.contains("nftables"), "{}", o.stderr);
    pm_call(&env, "DEL", &id, &base).ok_silent();

    // No mappings: prevResult passes through, DEL is a no-op.
    let mut none = base.clone();
    none["runtimeConfig"] = json!({});
    assert_eq!(
        pm_call(&env, "ADD", &id, &none).result()["ips"],
        prev["ips"]
    );
    none.as_object_mut().unwrap().remove("prevResult");
    pm_call(&env, "DEL", &id, &none).ok_silent();
}

// ------------------------------------------------------------------ iptables

/// Docker / kube-proxy style iptables-nft rules (unrelated addresses only)
/// do not disturb the mappings, and the mappings do not disturb them.
#[test]
fn works_alongside_iptables_nft_rules() {
    let env = TestEnv::new("portmap-iptables");
    let rules: [&[&str]; 4] = [
        &["-t", "nat", "-N", "CNIKIT-TEST-DOCKER"],
        &[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            "192.0.2.1/32",
            "-j",
            "CNIKIT-TEST-DOCKER",
        ],
        &[
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            "198.51.100.0/24",
            "-j",
            "MASQUERADE",
        ],
        &["-A", "FORWARD", "-s", "203.0.113.0/24", "-j", "DROP"],
    ];
    for r in rules {
        let (ok, _, err) = sh("iptables", r);
        assert!(ok || err.contains("exists"), "iptables {r:?}: {err}");
    }
    let (_, before, _) = sh("iptables-save", &[]);

    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("pmbr");
    let bridge = bridge_conf(&net, &br, env.ipam(Ipam::Ipamd, nets.v4_ranges()));
    let tcp = host_port();
    let mappings = json!([{"hostPort": tcp, "containerPort": CTR_TCP}]);
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let _servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    for host in ["127.0.0.1", nets.v4_addr(1).as_str()] {
        let t = eventually_answers(|| tcp_ask(None, &sock(host, tcp)));
        assert!(t.is_some(), "tcp to {host} with iptables rules present");
    }
    portmap_del(&env, &net, &a, &mappings, true);
    let (_, after, _) = sh("iptables-save", &[]);
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" [").next().unwrap_or(l).to_string())
            .collect()
    };
    assert_eq!(strip(&before), strip(&after), "iptables rules changed");
    env.plugin("bridge")
        .attach("DEL", &a.id, &a.ns, "eth0")
        .conf(&bridge)
        .run()
        .ok_silent();
}

// ------------------------------------------------------------------ scale

/// Run a plugin inside netns `ns` (its own, empty ruleset).
fn run_in(env: &TestEnv, ns: &Netns, cmd: &str, id: &str, conf: &Value) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(env.bin.join("portmap"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs([
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", id),
            ("CNI_NETNS", "/run/netns/fake"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/nonexistent"),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn plugin");
    let input = serde_json::to_vec(conf).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    child.wait_with_output().expect("plugin output")
}

/// 200 attachments with 2 mappings each, then DEL all; prints ADD/DEL times
/// of the first and last. A benchmark, not a timed assertion:
/// `tests/run --test portmap -- --ignored --nocapture scale`.
#[test]
#[ignore]
fn scale_200_attachments() {
    let env = TestEnv::new("portmap-scale");
    let ns = env.netns();
    let net = net_name();
    let n = 200u16;
    let conf = |i: u16| {
        let prev = fake_prev(
            &format!("10.77.{}.{}", i / 250, i % 250 + 2),
            &format!("fd77::{:x}", i + 2),
        );
        let m = two_mappings(10000 + 2 * i, 10001 + 2 * i);
        portmap_conf(&net, m, Some(&prev))
    };
    let mut add_ms = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let out = run_in(&env, &ns, "ADD", &format!("c{i}"), &conf(i));
        add_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let mut del_ms = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let out = run_in(&env, &ns, "DEL", &format!("c{i}"), &conf(i));
        del_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let (ok, listing, _) = sh("ip", &["netns", "exec", &ns.name, "nft", "list", "ruleset"]);
    assert!(ok);
    assert!(!listing.contains("elements"), "entries left:\n{listing}");
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "portmap scale: ADD #1 {:.2} ms, #200 {:.2} ms, mean of first 10 {:.2} ms, last 10 {:.2} ms; \
         DEL #1 {:.2} ms, #200 {:.2} ms (ip netns exec included)",
        add_ms[0],
        add_ms[199],
        avg(&add_ms[..10]),
        avg(&add_ms[190..]),
        del_ms[0],
        del_ms[199]
    );
}

/// Proves: a DEL whose runtime did not pass `runtimeConfig.portMappings`
/// again (cnitool/libcni 1.1.2 does this) still removes the attachment's
/// mappings, found by the marker its ADD left; and a DEL of an attachment
/// that never had mappings stays a no-op.
#[test]
fn del_without_mappings_still_removes_what_add_mapped() {
    let env = TestEnv::new("portmap-del-nomap");
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("pmbr");
    let bridge = bridge_conf(&net, &br, env.ipam(Ipam::Ipamd, nets.dual_ranges()));
    let mappings = two_mappings(host_port(), host_port());
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let trace = traces(&a);
    let conf = portmap_conf(&net, json!(null), None);
    env.plugin("portmap")
        .command("DEL")
        .container(&a.id)
        .ifname("eth0")
        .conf(&conf)
        .run()
        .ok_silent();
    assert_no_trace("after DEL without portMappings", &trace);
    env.plugin("bridge")
        .attach("DEL", &a.id, &a.ns, "eth0")
        .conf(&bridge)
        .run()
        .ok_silent();
}
