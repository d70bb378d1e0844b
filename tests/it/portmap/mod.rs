//! portmap end to end on the kernel: bridge + IPAM + portmap chained with
//! prevResult and runtimeConfig.portMappings, real TCP and UDP servers in a
//! container netns, reached over 127.0.0.1, the bridge gateway (v4 and v6)
//! and hairpin from a second container; then DEL (with and without netns and
//! prevResult), collision, GC, CHECK, conntrack, iptables-nft coexistence,
//! and (ignored, a benchmark) 200 attachments.
//!
//! Only loopback and addresses inside the test's own namespaces are ever
//! traffic targets.

mod ownership;
mod runtime_gc;
mod scale;
mod traffic;

use crate::support::*;
use serde_json::{json, Value};

/// Ports the servers listen on inside the container.
const CTR_TCP: u16 = 8080;
const CTR_UDP: u16 = 5353;

fn net_name() -> String {
    format!("pm-{}", short_hash())
}

/// A 1.0.0 gateway bridge of network `net` on `bridge`.
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

/// A bridge of a new network over dual-stack (or v4-only) in-process ipamd.
fn network(env: &TestEnv, dual: bool) -> (String, Value, Subnets) {
    let net = net_name();
    let nets = env.subnets();
    let ranges = if dual {
        nets.dual_ranges()
    } else {
        nets.v4_ranges()
    };
    let br = env.link_name("pmbr");
    let bridge = bridge_conf(&net, &br, env.ipam(Ipam::Ipamd, ranges));
    (net, bridge, nets)
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

/// `conf` sending its firewall operations to the daemon on `socket` (null: none).
fn with_socket(mut conf: Value, socket: &Value) -> Value {
    conf["daemonSocket"] = socket.clone();
    conf
}

/// tcp hostPort → CTR_TCP and udp hostPort → CTR_UDP.
fn two_mappings(tcp: u16, udp: u16) -> Value {
    json!([
        {"hostPort": tcp, "containerPort": CTR_TCP, "protocol": "tcp"},
        {"hostPort": udp, "containerPort": CTR_UDP, "protocol": "udp"},
    ])
}

/// The portmap attachment chained after `pod`'s bridge, with `mappings`
/// (and `pod`'s result as prevResult when `prev`) and the bridge config's
/// `daemonSocket` (null: none).
fn portmap<'e>(pod: &Pod<'e>, net: &str, mappings: &Value, prev: bool) -> Attachment<'e> {
    let conf = portmap_conf(net, mappings.clone(), prev.then_some(&pod.result));
    let conf = with_socket(conf, &pod.conf["daemonSocket"]);
    pod.chained("portmap", &conf)
}

/// One container on the bridge; `mappings` chains portmap after it.
fn attach<'e>(env: &'e TestEnv, net: &str, bridge: &Value, mappings: Option<&Value>) -> Pod<'e> {
    let pod = env.pod("bridge", bridge);
    if let Some(m) = mappings {
        let pm = portmap(&pod, net, m, true).add();
        // portmap passes prevResult through unchanged.
        assert_eq!(pm, pod.result, "portmap must return prevResult unchanged");
    }
    pod
}

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

/// portmap `cmd` for container `id` of a synthetic attachment.
fn pm_call(env: &TestEnv, cmd: &str, id: &str, conf: &Value) -> Outcome {
    env.plugin("portmap")
        .attach_at(cmd, id, "/run/netns/fake")
        .conf(conf)
        .run()
}

/// The ipamd daemon's socket when `daemon`, else null.
fn daemon_socket(env: &TestEnv, daemon: bool) -> Value {
    if daemon {
        env.ipam(Ipam::IpamdDaemon, json!([]))["socket"].clone()
    } else {
        Value::Null
    }
}
