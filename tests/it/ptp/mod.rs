//! ptp end to end on the kernel: the version matrix with real traffic (IPv4
//! and IPv6, pod to pod and pod to node) for both IPAMs, the pod's and the
//! host's routes exactly as the reference lays them out, CHECK, DEL (twice,
//! after the netns is gone, with a config it cannot use), GC of a forgotten
//! pod's veth, rollback of a failed ADD, ipMasq; side by side with the
//! reference /usr/lib/cni/ptp; kind's own network list (ptp + portmap); and IPv6 only
//! where a pod has it.

mod differential;
mod ipv6;
mod kind;
mod lifecycle;
mod matrix;

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// A network name no other test uses: GC removes whatever of its network
/// is not valid on the whole (shared) test host.
fn net_name() -> String {
    format!("ptp-{}", short_hash())
}

/// IPAM of `kind` over new subnets (dual stack or IPv4 only), with a default
/// route per family as kind writes them: the IPAM object and the subnets.
fn ipam(env: &TestEnv, kind: Ipam, dual: bool) -> (Value, Subnets) {
    let nets = env.subnets();
    (ipam_over(env, kind, &nets, dual), nets)
}

/// The same over `nets`, with a fresh state of its own.
fn ipam_over(env: &TestEnv, kind: Ipam, nets: &Subnets, dual: bool) -> Value {
    let (ranges, routes) = if dual {
        (
            nets.dual_ranges(),
            json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]),
        )
    } else {
        (nets.v4_ranges(), json!([{"dst": "0.0.0.0/0"}]))
    };
    let mut ipam = env.ipam(kind, ranges);
    ipam["routes"] = routes;
    ipam
}

fn conf(version: &str, net: &str, ipam: &Value) -> Value {
    json!({"cniVersion": version, "name": net, "type": "ptp", "ipam": ipam})
}

/// A 1.1.0 ptp network of its own over dual-stack IPAM of `kind`, with the
/// `extra` keys: the config and its subnets.
fn network(env: &TestEnv, kind: Ipam, extra: Value) -> (Value, Subnets) {
    let (ipam, nets) = ipam(env, kind, true);
    (merged(conf("1.1.0", &net_name(), &ipam), extra), nets)
}

/// The host end of the veth of container `id` on network `net`, found by
/// the alias that names its attachment (any result layout).
fn host_veth_of(net: &str, id: &str) -> Option<String> {
    let alias = format!("cnikit ptp {net}/{id}/eth0");
    let out = ip(&["-j", "-d", "link", "show"]);
    let links: Vec<Value> = serde_json::from_str(&out).expect("ip -j link");
    links
        .iter()
        .find(|l| l["ifalias"] == alias.as_str())
        .and_then(|l| l["ifname"].as_str().map(str::to_string))
}

/// The host end of the veth (`interfaces[0]` of a result).
fn host_veth(r: &Value) -> &str {
    r["interfaces"][0]["name"].as_str().expect("host veth")
}

/// The pod's routes (`dst via gw dev dev` strings) ptp makes for one address
/// `addr` with gateway `gw` in `subnet`, with IPAM's default route.
fn pod_routes(subnet: &str, gw: &str, default: &str) -> BTreeSet<String> {
    // As `ip` prints it: "fdcb:125:0::/64" is "fdcb:125::/64".
    let subnet = subnet
        .parse::<ipnet::IpNet>()
        .map_or(subnet.to_string(), |n| n.to_string());
    [
        format!("{default} via {gw} dev eth0"),
        format!("{subnet} via {gw} dev eth0"),
        format!("{gw} dev eth0"),
    ]
    .into_iter()
    .collect()
}

/// The pod's addresses and routes, and the host end's gateway addresses and
/// host routes, as ptp lays them out for a dual-stack pod in `nets`.
fn assert_ptp_layout(ns: &Netns, veth: &str, nets: &Subnets, v4: &str, v6: &str) {
    let (gw4, gw6) = (nets.v4_addr(1), nets.v6_addr(1));
    let cont = link(Some(&ns.name), "eth0").expect("eth0 in the pod");
    assert_eq!(link_kind(&cont), Some("veth"));
    assert!(has_flag(&cont, "UP"), "eth0 is up");
    assert_eq!(
        addrs(Some(&ns.name), "eth0"),
        BTreeSet::from([format!("{v4}/24"), format!("{v6}/64")]),
        "pod addresses keep their prefix"
    );
    assert_eq!(
        routes(Some(&ns.name), "-4"),
        pod_routes(&nets.v4, &gw4, "default"),
        "IPv4: the subnet via the gateway, the gateway on-link, no kernel subnet route"
    );
    assert_eq!(
        routes(Some(&ns.name), "-6"),
        pod_routes(&nets.v6, &gw6, "default"),
        "IPv6: the subnet via the gateway, the gateway on-link, no kernel subnet route"
    );
    let host = link(None, veth).expect("host veth");
    assert!(has_flag(&host, "UP"), "host end is up");
    assert_eq!(
        addrs(None, veth),
        BTreeSet::from([format!("{gw4}/32"), format!("{gw6}/128")]),
        "the host end carries the gateways"
    );
    assert!(routes(None, "-4").contains(&format!("{v4} dev {veth}")));
    assert!(routes(None, "-6").contains(&format!("{v6} dev {veth}")));
}

/// `ping` from the test host itself.
fn assert_host_pings(addr: &str) {
    let (ok, out, err) = sh("ping", &["-c1", "-W2", addr]);
    assert!(ok, "the node cannot ping {addr}: {out}{err}");
}
