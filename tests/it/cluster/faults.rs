//! Faults: etcd quorum lost and back, an etcd member and a node daemon SIGKILLed and
//! restarted under concurrent ADDs and DELs. Zero duplicates, and every acknowledged
//! lease is still there.

use super::*;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Proves: with 2 of 3 etcd members stopped, a node keeps allocating from the block it
/// owns; the ADD that needs a new block fails with 11 and STATUS answers 50 naming etcd;
/// once quorum is back, allocation resumes (a new block is claimed).
#[test]
fn quorum_loss_keeps_owned_blocks_serving() {
    let env = TestEnv::new("cluster_quorum");
    // Blocks of 16 addresses: 13 leasable (network, gateway and last reserved).
    let (mut etcd, e, n, conf) = one_node(
        &env,
        3,
        "q --cidr 10.73.0.0/24 --block-size 28",
        "q1",
        &["--etcd-session-ttl=5"],
    );
    n.call(&env, "ADD", "c0", &conf).result();
    etcd.kill(1);
    etcd.kill(2);
    for i in 1..13 {
        n.call(&env, "ADD", &format!("c{i}"), &conf).result();
    }
    n.call(&env, "ADD", "c13", &conf).expect_err(11, &["etcd"]);
    n.call(&env, "STATUS", "", &conf).expect_err(50, &["etcd"]);
    // DEL and idempotent ADD need no etcd either.
    n.call(&env, "DEL", "c5", &conf).ok_silent();
    n.call(&env, "ADD", "c5", &conf).result();
    etcd.restart(1);
    etcd.restart(2);
    etcd.wait(0);
    let t = eventually(Duration::from_secs(20), "ADD after quorum returned", || {
        n.call(&env, "ADD", "c13", &conf).success()
    });
    eprintln!("allocation resumed {t:?} after the members restarted");
    n.call(&env, "STATUS", "", &conf).ok_silent();
    assert_eq!(owners(&e, "q").len(), 2);
    assert_consistent(&e, "q", [&n]);
}

/// Proves: an ADD that needs a new block, and `pool show`, while etcd answers nothing for
/// 3 s (longer than one etcd call's 2 s timeout), wait it out and succeed, instead of
/// failing the pod or the operator's command.
#[test]
fn a_claim_and_pool_show_ride_out_etcd_answering_nothing_for_3_s() {
    let env = TestEnv::new("cluster_freeze");
    let (etcd, e, n, conf) = one_node(&env, 3, "f --cidr 10.74.0.0/24 --block-size 28", "f1", &[]);
    n.call(&env, "STATUS", "", &conf).ok_silent(); // the session is up
    etcd.freeze_all(true);
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        etcd.freeze_all(false);
        etcd
    });
    let shown = std::thread::spawn({
        let e = e.clone();
        move || {
            let started = Instant::now();
            show(&e, "f");
            started.elapsed()
        }
    });
    let started = Instant::now();
    let o = n.call(&env, "ADD", "c0", &conf);
    let took = started.elapsed();
    let _etcd = thaw.join().unwrap();
    o.result();
    let show_took = shown.join().expect("pool show during the freeze");
    for (what, t) in [("the ADD", took), ("pool show", show_took)] {
        assert!(t >= Duration::from_secs(2), "{what} did not wait: {t:?}");
    }
    assert_eq!(owners(&e, "f").len(), 1);
    assert_consistent(&e, "f", [&n]);
}

/// Proves: `pool create`, `delete` and `release-node` wait out etcd answering nothing for
/// 3 s, as `show` does, and then do what they were asked.
#[test]
fn every_pool_command_rides_out_etcd_answering_nothing_for_3_s() {
    let env = TestEnv::new("cluster_freeze_cli");
    let (etcd, e) = etcd_with_pools(
        &env,
        3,
        &["gone --cidr 10.77.0.0/24", "kept --cidr 10.78.0.0/24"],
    );
    etcd.freeze_all(true);
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        etcd.freeze_all(false);
        etcd
    });
    let commands = [
        "create new --cidr 10.79.0.0/24",
        "delete gone",
        "release-node kept --node dead",
    ];
    let runs: Vec<_> = commands
        .into_iter()
        .map(|args| {
            let e = e.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let out = pool(&e, args);
                (args, out, started.elapsed())
            })
        })
        .collect();
    for run in runs {
        let (args, out, took) = run.join().expect("pool command");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "pool {args}: {said}");
        assert!(
            took >= Duration::from_secs(2),
            "pool {args} did not wait: {took:?}"
        );
    }
    let _etcd = thaw.join().expect("thaw");
    assert_eq!(show(&e, "new")["cidr"], "10.79.0.0/24");
    pool_err(&e, "show gone", "does not exist");
}

/// What the clients saw: acknowledged leases (node, container) → address.
type Acked = Mutex<BTreeMap<(usize, String), IpAddr>>;

/// One client: ADD/DEL loop on node `ni` until `stop`; failures must be 11 (daemon or
/// etcd away) or 103 (pool exhausted), never anything else.
fn client(env: &TestEnv, nodes: &[Node], ni: usize, t: usize, stop: &AtomicBool, acked: &Acked) {
    let conf = nodes[ni].conf("pods", &["chaos"]);
    let mut mine: Vec<String> = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        // Mostly ADDs, some DELs: blocks fill, new ones are claimed all along.
        if i % 4 == 0 && !mine.is_empty() {
            let cid = mine.remove(i % mine.len());
            let o = nodes[ni].call(env, "DEL", &cid, &conf);
            o.ok_silent();
            lock(acked).remove(&(ni, cid));
            continue;
        }
        let cid = format!("n{ni}-t{t}-{i}");
        let o = nodes[ni].call(env, "ADD", &cid, &conf);
        if o.success() {
            let a = addresses(&o.result())[0].addr();
            lock(acked).insert((ni, cid.clone()), a);
            mine.push(cid);
        } else {
            let e = o.err();
            assert!(e.code == 11 || e.code == 103, "unexpected failure: {e:?}");
            // An ADD that failed may still have its lease (the daemon died after the
            // journal write): DEL it, as a runtime does after a failed ADD.
            let _ = nodes[ni].call(env, "DEL", &cid, &conf);
        }
    }
}

/// Proves: with three nodes and 2 clients each allocating and releasing, while an etcd
/// member is SIGKILLed and restarted and a node daemon is SIGKILLed (mid-claim: blocks are
/// small, so claims are frequent) and restarted, no address is ever held by two nodes,
/// every node's addresses lie in its own blocks, usage counts match, and every
/// acknowledged lease is still held with the address the client got.
#[test]
fn no_duplicates_while_members_and_nodes_die() {
    let env = TestEnv::new("cluster_chaos");
    let (mut etcd, e) = etcd_with_pools(&env, 3, &["chaos --cidr 10.74.0.0/22 --block-size 29"]);
    let nodes = Node::start_all(&env, &["c1", "c2", "c3"], &e, &["--etcd-session-ttl=5"]);
    let stop = AtomicBool::new(false);
    let acked: Acked = Mutex::default();
    std::thread::scope(|s| {
        for ni in 0..3 {
            for t in 0..2 {
                let (env, nodes, stop, acked) = (&env, &nodes, &stop, &acked);
                s.spawn(move || client(env, nodes, ni, t, stop, acked));
            }
        }
        let pause = |ms| std::thread::sleep(Duration::from_millis(ms));
        pause(1500);
        etcd.kill(0);
        pause(1000);
        nodes[1].kill();
        pause(500);
        nodes[1].restart();
        pause(1000);
        etcd.restart(0);
        etcd.wait(0);
        pause(1500);
        stop.store(true, Ordering::SeqCst);
    });
    assert_consistent(&e, "chaos", &nodes);
    let acked = acked.into_inner().unwrap();
    assert!(acked.len() > 30, "only {} ADDs acknowledged", acked.len());
    let held: Vec<BTreeMap<IpAddr, String>> = nodes.iter().map(Node::leases).collect();
    let mut addrs = BTreeSet::new();
    for ((ni, cid), a) in &acked {
        assert_eq!(
            held[*ni].get(a),
            Some(cid),
            "acknowledged lease {a} of {cid} lost"
        );
        assert!(addrs.insert(*a), "{a} acknowledged twice");
    }
    assert!(
        nodes
            .iter()
            .map(|n| n.metric("ipamd_cluster_block_claims_total"))
            .sum::<u64>()
            > 3,
        "claims happened while the faults did"
    );
}
