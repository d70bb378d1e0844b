//! `cnikit ipamd pool …` against one real etcd, a cluster pool without its daemon, and the
//! rules of release-node and delete.

use super::*;

/// Proves: create is idempotent for the same spec and refuses another spec or an
/// overlapping CIDR; `show --json` has exactly the documented shape; an unknown pool is
/// named; delete of an unused pool succeeds and the pool is gone.
#[test]
fn pool_commands_against_one_etcd() {
    let env = TestEnv::new("pool_cli");
    let etcd = Etcd::start(&env, 1);
    let e = etcd.endpoints();
    pool_ok(&e, "create p1 --cidr 10.60.0.0/24");
    pool_ok(&e, "create p1 --cidr 10.60.0.0/24 --block-size 26");
    pool_err(
        &e,
        "create p1 --cidr 10.60.0.0/24 --block-size 28",
        "pool p1 already exists",
    );
    pool_err(&e, "create p2 --cidr 10.60.0.128/25", "overlaps pool p1");
    pool_err(
        &e,
        "create p3 --cidr 10.61.0.0/24 --block-size 31",
        "--block-size 31",
    );
    pool_ok(&e, "create v6 --cidr fd60::/112");

    assert_eq!(
        show(&e, "p1"),
        json!({
            "name": "p1", "cidr": "10.60.0.0/24", "cidrs": ["10.60.0.0/24"], "draining": [],
            "blockSize": 26, "reclaimAfter": 0,
            "usage": {"addresses": 244, "allocated": 0, "free": 244, "percent": 0.0,
                      "blocks": 4, "blocksOwned": 0, "blocksQuarantined": 0, "blocksFree": 4},
            "blocks": []
        })
    );
    assert_eq!(show(&e, "v6")["blockSize"], 122);
    pool_err(&e, "show nope", "pool nope does not exist");

    pool_ok(&e, "delete p1");
    pool_err(&e, "show p1", "pool p1 does not exist");
    // Unreachable etcd: a bounded wait and a message that says what to check.
    let t0 = Instant::now();
    pool_err("http://127.0.0.1:1", "show v6", "quorum of etcd members");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// Proves: a cluster pool with no daemon answering fails ADD with 11 and a message
/// saying the daemon is needed, STATUS answers 50, and DEL succeeds (nothing to free).
#[test]
fn cluster_pool_without_daemon() {
    let env = TestEnv::new("pool_nodaemon");
    let dir = env.dir("nodaemon");
    let conf = json!({"cniVersion": "1.1.0", "name": "pods", "type": "ipamd", "ipam": {
        "type": "ipamd", "pool": "p1", "socket": dir.join("none.sock"), "dataDir": dir.join("data")}});
    let call = |cmd: &str| {
        let c = env.plugin("ipamd").conf(&conf);
        if cmd == "STATUS" {
            c.command("STATUS").run()
        } else {
            c.attach_at(cmd, "c1", "/var/run/netns/none").run()
        }
    };
    call("ADD").expect_err(11, &["need the ipamd daemon", "none.sock"]);
    call("STATUS").expect_err(50, &["need the ipamd daemon"]);
    call("DEL").ok_silent();
}

/// Proves: release-node is refused while the node's session lives (naming --force),
/// succeeds once the session expired after the daemon died, and the freed block is then
/// claimed by another node; `pool delete` refuses while a node holds blocks.
#[test]
fn release_node_after_the_session_expired() {
    let env = TestEnv::new("release_node");
    // One block only: whoever holds it holds the pool.
    let (_etcd, e) = etcd_with_pools(&env, 1, &["one --cidr 10.62.0.0/28 --block-size 28"]);
    let a = Node::start(&env, "a", &e, &["--etcd-session-ttl=2"]);
    let b = Node::start(&env, "b", &e, &["--etcd-session-ttl=2"]);
    let ra = a
        .call(&env, "ADD", "ca", &a.conf("pods", &["one"]))
        .result();
    let addr = addresses(&ra)[0];
    assert_eq!(addr.to_string(), "10.62.0.2/28");
    assert_eq!(ra["ips"][0]["gateway"], "10.62.0.1");
    b.call(&env, "ADD", "cb", &b.conf("pods", &["one"]))
        .expect_err(103, &["pool one", "exhausted"]);
    b.call(&env, "STATUS", "", &b.conf("pods", &["one"]))
        .expect_err(50, &["pool one"]);

    pool_err(&e, "delete one", "in use by a");
    pool_err(&e, "release-node one --node a", "--force");

    a.kill();
    // The session (TTL 2 s) expires; etcd checks leases about every 500 ms.
    eventually(
        Duration::from_secs(10),
        "release-node of a dead node",
        || pool(&e, "release-node one --node a").status.success(),
    );
    assert!(owners(&e, "one").is_empty());
    let rb = b
        .call(&env, "ADD", "cb", &b.conf("pods", &["one"]))
        .result();
    assert!(addresses(&rb)[0].to_string().starts_with("10.62.0."));
    assert_eq!(owners(&e, "one").values().next().unwrap().0, "b");
    // Releasing with --force works on a live node too (the operator's call).
    let out = pool_ok(&e, "release-node one --node b --force");
    assert!(out.contains("released 1 block"), "{out}");
}
