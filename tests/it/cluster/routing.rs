//! `--route-blocks` on one L2 segment: three nodes (network namespaces on one bridge, an
//! etcd member on it), each with its own daemon, bridge network and pod on dual-stack
//! cluster pools. Pods reach pods on other nodes (ping and TCP, both families) with their
//! own source address, and the rest of the world masqueraded; routes follow claims,
//! reclaims and restarts; a node address with no connected route is reported, not routed.

use super::netns::{Lan, NsNode};
use super::*;
use crate::support::traffic::{tcp_ask, Servers};

const POOLS: [&str; 2] = ["pods4", "pods6"];
/// cnikit's route protocol (`src/block_routes.rs`).
const PROTO: &str = "203";

/// The routes of cnikit's protocol on `node`, both families: destination → gateway.
fn routes(node: &NsNode) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for family in ["-4", "-6"] {
        let text = ip(&[
            "-j",
            "-n",
            &node.ns.name,
            family,
            "route",
            "show",
            "proto",
            PROTO,
        ]);
        let list: Vec<Value> = serde_json::from_str(&text).unwrap_or_default();
        for r in list {
            let dst = r["dst"].as_str().unwrap_or_default().to_string();
            out.insert(dst, r["gateway"].as_str().unwrap_or_default().to_string());
        }
    }
    out
}

/// The bridge network of `node`: its pods' addresses from the cluster pools, routed to
/// by the other nodes, masqueraded only outside the pools.
fn network(node: &NsNode) -> Value {
    let mut ipam = node.node.ipam(&POOLS);
    ipam["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
    json!({
        "cniVersion": "1.1.0", "name": "pods", "type": "bridge", "bridge": "cni0",
        "isGateway": true, "ipMasq": true,
        "ipMasqExclude": ["10.244.0.0/16", "fd00:244::/104"],
        "ipam": ipam,
    })
}

/// A pod on `node`: its netns and its addresses (IPv4, IPv6).
struct Pod {
    ns: Netns,
    cid: String,
    v4: String,
    v6: String,
}

fn add_pod(env: &TestEnv, node: &NsNode, cid: &str) -> Pod {
    let ns = env.netns();
    let out = env
        .plugin("bridge")
        .conf(&network(node))
        .attach("ADD", cid, &ns, "eth0")
        .exec_in(&node.ns)
        .run();
    let addrs = addresses(&out.ok().result());
    let of = |v4: bool| {
        let a = addrs.iter().find(|a| a.addr().is_ipv4() == v4);
        a.expect("an address of each family").addr().to_string()
    };
    Pod {
        cid: cid.to_string(),
        v4: of(true),
        v6: of(false),
        ns,
    }
}

fn del_pod(env: &TestEnv, node: &NsNode, pod: &Pod) {
    env.plugin("bridge")
        .conf(&network(node))
        .attach("DEL", &pod.cid, &pod.ns, "eth0")
        .exec_in(&node.ns)
        .run()
        .ok();
}

/// The blocks of `node` in both pools, from etcd.
fn blocks_of(e: &str, node: &str) -> Vec<String> {
    POOLS
        .iter()
        .flat_map(|p| owners(e, p))
        .filter(|(_, (owner, _))| owner == node)
        .map(|(b, _)| b.to_string())
        .collect()
}

/// Wait (polling every 20 ms, at most `limit`) until `f` holds; how long it took.
fn within(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

/// `node` routes every block of `other` via `via`s (its eth0 addresses).
fn routes_to(node: &NsNode, blocks: &[String], via: &[String]) -> bool {
    let r = routes(node);
    blocks.iter().all(|b| {
        let gw = r.get(b).map(String::as_str).unwrap_or_default();
        via.iter().any(|v| v == gw)
    })
}

#[test]
fn pods_reach_pods_on_other_nodes_through_block_routes() {
    let env = TestEnv::new("cluster_routing");
    let lan = Lan::new(&env, 1);
    let etcd = lan.etcd(&env);
    let e = etcd.endpoints();
    pool_ok(
        &e,
        "create pods4 --cidr 10.244.0.0/16 --block-size 26 --reclaim-after 2",
    );
    pool_ok(&e, "create pods6 --cidr fd00:244::/104 --reclaim-after 2");
    let extra = ["--route-blocks", "--etcd-session-ttl", "2"];
    let nodes: Vec<NsNode> = ["ra", "rb", "rc"]
        .iter()
        .enumerate()
        .map(|(i, name)| lan.node(&env, i, name, &e, &extra))
        .collect();
    // Each node's address of each family, as the nodes found them (their default route's
    // interface, eth0: no --node-address given).
    let via = |i: usize| vec![lan_addr(&nodes[i], "-4"), lan_addr(&nodes[i], "-6")];

    let mut pods = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        pods.push(add_pod(&env, n, &format!("pod-{i}")));
        let claimed = blocks_of(&e, &n.node.name);
        assert_eq!(claimed.len(), 2, "one block per pool on {}", n.node.name);
        let others = nodes.iter().enumerate().filter(|(j, _)| *j != i);
        for (_, other) in others {
            let took = within(Duration::from_secs(1), "route to a new block", || {
                routes_to(other, &claimed, &via(i))
            });
            eprintln!(
                "{} routes {}'s blocks {took:?} after its claim",
                other.node.name, n.node.name
            );
        }
    }

    // Pod to pod across nodes, both families, the source kept; to the LAN, masqueraded.
    let _servers: Vec<Servers> = pods
        .iter()
        .map(|p| Servers::start(&p.ns.path, &p.cid, 18080, 18081))
        .collect();
    let node_server = Servers::start(&nodes[1].ns.path, "node-rb", 18082, 18083);
    for (from, to) in [(0, 1), (1, 2), (2, 0)] {
        for addr in [&pods[to].v4, &pods[to].v6] {
            assert_ping(&pods[from].ns.name, addr);
        }
        let v4 = tcp_ask(Some(&pods[from].ns.path), &format!("{}:18080", pods[to].v4));
        assert_eq!(
            v4,
            Some(format!("pod-{to} {}", pods[from].v4)),
            "unmasqueraded v4"
        );
        let v6 = tcp_ask(
            Some(&pods[from].ns.path),
            &format!("[{}]:18080", pods[to].v6),
        );
        assert_eq!(
            v6,
            Some(format!("pod-{to} {}", pods[from].v6)),
            "unmasqueraded v6"
        );
    }
    let lan_v4 = lan_addr(&nodes[1], "-4");
    let seen = tcp_ask(Some(&pods[0].ns.path), &format!("{lan_v4}:18082"));
    assert_eq!(
        seen,
        Some(format!("node-rb {}", lan_addr(&nodes[0], "-4"))),
        "masqueraded"
    );
    drop(node_server);

    removed_routes_come_back(&e, &nodes);
    stale_gateways_are_cleared(&e, &nodes, &pods);
    unreachable_address_is_reported(&env, &lan, &e, &nodes);
    reclaim_and_restart(&env, &e, &nodes, &mut pods);
    for (i, p) in pods.iter().enumerate() {
        del_pod(&env, &nodes[i], p);
    }
}

/// Someone flushes cnikit's routes on node 1 (by hand, or a link that went down took them):
/// its daemon puts them back at its next reconcile, with no change in etcd.
fn removed_routes_come_back(e: &str, nodes: &[NsNode]) {
    let n = &nodes[1];
    let others: Vec<String> = [&nodes[0], &nodes[2]]
        .iter()
        .flat_map(|o| blocks_of(e, &o.node.name))
        .collect();
    ip(&["-n", &n.ns.name, "route", "flush", "proto", PROTO]);
    ip(&["-n", &n.ns.name, "-6", "route", "flush", "proto", PROTO]);
    let took = within(Duration::from_secs(12), "flushed routes put back", || {
        let r = routes(n);
        others.iter().all(|b| r.contains_key(b))
    });
    eprintln!("{}: flushed routes back after {took:?}", n.node.name);
}

/// Node 0's bridge still has the gateway addresses of node 1's blocks (as after node 0
/// gave those blocks back and node 1 claimed them: the bridge plugin never removes a
/// gateway): they would keep node 1's pods' traffic on node 0's bridge. Node 0's daemon
/// removes them and routes the blocks to node 1 (here at its restart, which reconciles
/// like the claim's watch event does).
fn stale_gateways_are_cleared(e: &str, nodes: &[NsNode], pods: &[Pod]) {
    let (here, owner) = (&nodes[0], &nodes[1]);
    let blocks = blocks_of(e, &owner.node.name);
    let gateways: Vec<String> = blocks.iter().map(|b| gateway(b)).collect();
    for g in &gateways {
        ip(&[
            "-n",
            &here.ns.name,
            "addr",
            "add",
            g,
            "dev",
            "cni0",
            "nodad",
        ]);
    }
    here.kill();
    here.restart();
    let via = vec![lan_addr(owner, "-4"), lan_addr(owner, "-6")];
    within(
        Duration::from_secs(5),
        "stale gateways cleared, blocks routed",
        || {
            let addrs = ip(&["-n", &here.ns.name, "addr", "show", "dev", "cni0"]);
            let gone = gateways.iter().all(|g| !addrs.contains(g.as_str()));
            gone && routes_to(here, &blocks, &via)
        },
    );
    assert_ping(&pods[0].ns.name, &pods[1].v4);
    assert_ping(&pods[0].ns.name, &pods[1].v6);
}

/// A block's gateway (its first usable address) with the block's prefix.
fn gateway(block: &str) -> String {
    let net: ipnet::IpNet = block.parse().expect("block");
    let first = match net.network() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) + 1).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) + 1).into()),
    };
    format!("{first}/{}", net.prefix_len())
}

/// A node whose published address has no connected route on the others: its blocks are
/// not routed there, and each other node logs it once.
fn unreachable_address_is_reported(env: &TestEnv, lan: &Lan, e: &str, nodes: &[NsNode]) {
    let far = lan.node(env, 3, "rfar", e, &["--node-address", "203.0.113.9"]);
    let conf = far.node.conf("far", &["pods4"]);
    far.node.call(env, "ADD", "far-1", &conf).ok();
    let block = blocks_of(e, "rfar");
    assert_eq!(block.len(), 1);
    let needle = "node address 203.0.113.9 has no connected route";
    for n in &nodes[..2] {
        within(
            Duration::from_secs(2),
            "the unreachable address logged",
            || {
                n.log_lines(0.0, f64::MAX)
                    .iter()
                    .any(|(_, l)| l.contains(needle))
            },
        );
        assert!(
            !routes(n).contains_key(&block[0]),
            "no route via 203.0.113.9"
        );
    }
    far.node.call(env, "DEL", "far-1", &conf).ok();
    pool_ok(e, "release-node pods4 --node rfar --force");
    far.kill();
    // Logged once, however often the node reconciled meanwhile.
    for n in &nodes[..2] {
        let count = n
            .log_lines(0.0, f64::MAX)
            .iter()
            .filter(|(_, l)| l.contains(needle))
            .count();
        assert_eq!(
            count, 1,
            "{} logged the unreachable address {count} times",
            n.node.name
        );
    }
}

/// Node 2 killed: once its blocks are reclaimed the others drop its routes within a
/// second. Restarted, with its routes flushed and a stale one of cnikit's in its table:
/// it reconciles (the stale one goes, the others come), and a new pod's block is routed.
fn reclaim_and_restart(env: &TestEnv, e: &str, nodes: &[NsNode], pods: &mut Vec<Pod>) {
    let dead = &nodes[2];
    let blocks = blocks_of(e, &dead.node.name);
    dead.kill();
    let reclaimed = || {
        POOLS
            .iter()
            .all(|p| !owners(e, p).values().any(|(o, _)| o == &dead.node.name))
    };
    eventually(
        Duration::from_secs(20),
        "the dead node's blocks reclaimed",
        reclaimed,
    );
    for n in &nodes[..2] {
        let took = within(
            Duration::from_secs(1),
            "routes of reclaimed blocks gone",
            || {
                let r = routes(n);
                blocks.iter().all(|b| !r.contains_key(b))
            },
        );
        eprintln!(
            "{}: routes of {}'s reclaimed blocks gone {took:?} after the reclaim was seen",
            n.node.name, dead.node.name
        );
    }

    let ns = &dead.ns.name;
    ip(&["-n", ns, "route", "flush", "proto", PROTO]);
    ip(&["-n", ns, "-6", "route", "flush", "proto", PROTO]);
    let stale_via = lan_addr(&nodes[0], "-4");
    ip(&[
        "-n",
        ns,
        "route",
        "add",
        "10.244.255.0/26",
        "via",
        &stale_via,
        "proto",
        PROTO,
    ]);
    dead.restart();
    let want: Vec<String> = nodes[..2]
        .iter()
        .flat_map(|n| blocks_of(e, &n.node.name))
        .collect();
    within(
        Duration::from_secs(5),
        "the restarted node's routes back",
        || {
            let r = routes(dead);
            !r.contains_key("10.244.255.0/26") && want.iter().all(|b| r.contains_key(b))
        },
    );
    // Its old pod's block is lost: the pod goes, a new one gets a routed block.
    let old = pods.pop().expect("pod of node 2");
    del_pod(env, dead, &old);
    let fresh = add_pod(env, dead, "pod-2b");
    let claimed = blocks_of(e, &dead.node.name);
    let via = vec![lan_addr(dead, "-4"), lan_addr(dead, "-6")];
    for n in &nodes[..2] {
        within(
            Duration::from_secs(1),
            "route to the restarted node's new block",
            || routes_to(n, &claimed, &via),
        );
    }
    assert_ping(&pods[0].ns.name, &fresh.v4);
    assert_ping(&pods[0].ns.name, &fresh.v6);
    pods.push(fresh);
}

/// The global address of `family` ("-4", "-6") on the node's eth0.
fn lan_addr(node: &NsNode, family: &str) -> String {
    let text = ip(&[
        "-j",
        "-n",
        &node.ns.name,
        family,
        "addr",
        "show",
        "dev",
        "eth0",
        "scope",
        "global",
    ]);
    let v: Value = serde_json::from_str(&text).expect("ip -j addr");
    v[0]["addr_info"][0]["local"]
        .as_str()
        .expect("an address")
        .to_string()
}
