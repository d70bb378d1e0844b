//! Three nodes (daemons with their own sockets, data dirs and names) on a 3-member etcd
//! cluster, with concurrent plugin clients.

use super::*;
use std::sync::Mutex;

/// ADD `count` containers on `node` from `pools`, `threads` at a time; the outcomes.
fn add_many(
    env: &TestEnv,
    node: &Node,
    network: &str,
    pools: &[&str],
    count: usize,
    threads: usize,
) -> Vec<(String, Outcome)> {
    let conf = node.conf(network, pools);
    let out = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (conf, out) = (&conf, &out);
            s.spawn(move || {
                for i in (t..count).step_by(threads) {
                    let cid = format!("{}-{network}-{i}", node.name);
                    let o = node.call(env, "ADD", &cid, conf);
                    lock(out).push((cid, o));
                }
            });
        }
    });
    out.into_inner().unwrap()
}

/// [`add_many`] on every node at once (network "pods"); the outcomes, node by node.
fn add_on_all(
    env: &TestEnv,
    nodes: &[Node],
    pool: &str,
    count: usize,
    threads: usize,
) -> Vec<Vec<(String, Outcome)>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = nodes
            .iter()
            .map(|n| s.spawn(move || add_many(env, n, "pods", &[pool], count, threads)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Proves: three nodes allocating concurrently from one pool each claim their own
/// blocks (several each), every address lies in a block `pool show` gives its node, none
/// is held twice, usage counts match within 10 s (also after DELs), a dual-stack
/// `pools` ADD gets one address from each pool with the block's gateway, and /metrics
/// counts the blocks and claims.
#[test]
fn three_nodes_share_pools() {
    let env = TestEnv::new("cluster_nodes");
    let pools = [
        "v4 --cidr 10.70.0.0/22 --block-size 27",
        "v6 --cidr fd70::/112 --block-size 123",
    ];
    let (_etcd, e) = etcd_with_pools(&env, 3, &pools);
    let nodes = Node::start_all(&env, &["n1", "n2", "n3"], &e, &[]);
    let results = add_on_all(&env, &nodes, "v4", 40, 4);
    for (n, res) in nodes.iter().zip(&results) {
        for (cid, o) in res {
            let r = o.result();
            let a = addresses(&r)[0];
            assert_eq!(a.prefix_len(), 27, "{cid}: {a}");
            let gw: std::net::IpAddr = r["ips"][0]["gateway"].as_str().unwrap().parse().unwrap();
            assert_eq!(
                gw,
                ipnet::IpNet::new(a.network(), 27)
                    .unwrap()
                    .hosts()
                    .next()
                    .unwrap()
            );
        }
        // 40 addresses in blocks of 29: two blocks each.
        assert_eq!(n.metric("ipamd_cluster_blocks_owned"), 2, "{}", n.name);
        assert_eq!(
            n.metric("ipamd_cluster_block_claims_total"),
            2,
            "{}",
            n.name
        );
    }
    assert_consistent(&e, "v4", &nodes);

    // DEL half of n1's containers: the counts follow.
    for i in (0..40).step_by(2) {
        let conf = nodes[0].conf("pods", &["v4"]);
        nodes[0]
            .call(&env, "DEL", &format!("n1-pods-{i}"), &conf)
            .ok_silent();
    }
    assert_consistent(&e, "v4", &nodes);

    // Dual-stack from two pools, in another network: blocks of its own.
    let conf = nodes[1].conf("dual", &["v4", "v6"]);
    let r = nodes[1].call(&env, "ADD", "ds1", &conf).result();
    let a = addresses(&r);
    assert_eq!(a.len(), 2);
    assert!(a[0].addr().is_ipv4() && a[1].addr().is_ipv6(), "{a:?}");
    assert_eq!(a[1].prefix_len(), 123);
    let again = nodes[1].call(&env, "ADD", "ds1", &conf).result();
    assert_eq!(addresses(&again), a, "ADD is idempotent");
    assert_eq!(nodes[1].metric("ipamd_cluster_blocks_owned"), 4);
    assert_consistent(&e, "v6", &nodes);
}

/// Proves: a pool of 4 blocks × 5 addresses shared by three nodes hands out exactly its
/// 20 addresses under 45 concurrent ADDs, never more; the rest fail with 103 naming the
/// pool, and STATUS answers 50 on a node whose blocks are full.
#[test]
fn small_pool_never_oversubscribed() {
    let env = TestEnv::new("cluster_small");
    let (_etcd, e) = etcd_with_pools(&env, 3, &["tiny --cidr 10.71.0.0/27 --block-size 29"]);
    let nodes = Node::start_all(&env, &["s1", "s2", "s3"], &e, &[]);
    let results: Vec<(String, Outcome)> = add_on_all(&env, &nodes, "tiny", 15, 3)
        .into_iter()
        .flatten()
        .collect();
    let ok = results.iter().filter(|(_, o)| o.success()).count();
    for (_, o) in results.iter().filter(|(_, o)| !o.success()) {
        o.expect_err(103, &["pool tiny", "exhausted"]);
    }
    assert_eq!(ok, 20, "the pool has 20 addresses");
    assert_consistent(&e, "tiny", &nodes);
    for n in &nodes {
        let conf = n.conf("pods", &["tiny"]);
        n.call(&env, "STATUS", "", &conf)
            .expect_err(50, &["pool tiny"]);
    }
    // Freeing one address makes its node serve again.
    let (cid, o) = results
        .iter()
        .find(|(c, o)| c.starts_with("s2") && o.success())
        .unwrap();
    let _ = o;
    let conf = nodes[1].conf("pods", &["tiny"]);
    nodes[1].call(&env, "DEL", cid, &conf).ok_silent();
    nodes[1].call(&env, "STATUS", "", &conf).ok_silent();
    nodes[1].call(&env, "ADD", "s2-new", &conf).result();
}

/// Proves: a node daemon restarted under the same --node while its session is alive
/// takes its blocks back and serves a new ADD from them within 5 s, claiming nothing
/// new; its leases survive; DEL with the daemon down frees the lease in-process and the
/// restarted daemon brings the usage count up to date.
#[test]
fn restarted_node_takes_its_blocks_back() {
    let env = TestEnv::new("cluster_restart");
    let (_etcd, e, n, conf) = one_node(&env, 1, "r --cidr 10.72.0.0/24 --block-size 27", "r1", &[]);
    for i in 0..5 {
        n.call(&env, "ADD", &format!("c{i}"), &conf).result();
    }
    let before = owners(&e, "r");
    assert_eq!(before.len(), 1);
    let leases = n.leases();
    n.kill();
    // DEL while no daemon runs: the node's own store, in-process.
    n.call(&env, "DEL", "c0", &conf).ok_silent();
    let t0 = Instant::now();
    n.restart();
    let r = n.call(&env, "ADD", "c9", &conf).result();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "served again after {took:?}");
    let block = *before.keys().next().unwrap();
    assert!(
        block.contains(&addresses(&r)[0].addr()),
        "{r} not in {block}"
    );
    assert_eq!(n.metric("ipamd_cluster_block_claims_total"), 0);
    let after = n.leases();
    for (addr, cid) in &leases {
        if cid != "c0" {
            assert_eq!(after.get(addr), Some(cid), "lease {addr} survives");
        }
    }
    assert_consistent(&e, "r", [&n]);
}

/// Proves: a block that stayed empty for --block-release-after goes back to the pool
/// (counted in /metrics), and the next ADD claims a block again.
#[test]
fn empty_blocks_are_released() {
    let env = TestEnv::new("cluster_release");
    let (_etcd, e, n, conf) = one_node(
        &env,
        1,
        "rel --cidr 10.75.0.0/24 --block-size 28",
        "e1",
        &["--block-release-after=1"],
    );
    n.call(&env, "ADD", "c1", &conf).result();
    assert_eq!(owners(&e, "rel").len(), 1);
    n.call(&env, "DEL", "c1", &conf).ok_silent();
    eventually(Duration::from_secs(10), "the empty block released", || {
        owners(&e, "rel").is_empty()
    });
    assert_eq!(n.metric("ipamd_cluster_block_releases_total"), 1);
    assert_eq!(n.metric("ipamd_cluster_blocks_owned"), 0);
    n.call(&env, "ADD", "c2", &conf).result();
    assert_eq!(owners(&e, "rel").len(), 1);
    assert_consistent(&e, "rel", [&n]);
}
