//! Pools that change live: CIDRs added and drained, overlaps refused.

use super::reclaim::{block_of, first_address};
use super::*;

/// Proves: a pool created with two CIDRs shows both; an exhausted pool (ADD fails 103)
/// serves again within 1 s of `pool update --add-cidr` with no daemon restart; CIDRs that
/// overlap the pool's own or another pool's are refused; `--drain-cidr` stops new leases
/// in the CIDR's blocks, and the CIDR leaves the pool once its last lease is gone (but for
/// the last CIDR of a pool, which stays, draining).
#[test]
fn a_full_pool_grows_and_drains_live() {
    let env = TestEnv::new("cluster_grow");
    let (_etcd, e) = etcd_with_pools(
        &env,
        1,
        &[
            "g --cidr 10.79.0.0/28 --block-size 28",
            "two --cidr 10.79.8.0/28 --cidr 10.79.9.0/28 --block-size 28",
        ],
    );
    let two = show(&e, "two");
    assert_eq!(two["cidrs"], json!(["10.79.8.0/28", "10.79.9.0/28"]));
    assert_eq!(two["usage"]["addresses"], 26);

    let n = Node::start(&env, "g1", &e, &[]);
    let conf = n.conf("pods", &["g"]);
    for i in 0..13 {
        n.call(&env, "ADD", &format!("c{i}"), &conf).result();
    }
    n.call(&env, "ADD", "c13", &conf)
        .expect_err(103, &["pool g", "--add-cidr"]);
    eventually(Duration::from_secs(10), "usage 100 %", || {
        show(&e, "g")["usage"]["percent"] == 100.0
    });

    pool_err(&e, "update g --add-cidr 10.79.8.0/24", "overlaps pool two");
    pool_err(
        &e,
        "update g --add-cidr 10.79.0.0/24",
        "overlaps the pool's 10.79.0.0/28",
    );
    pool_err(
        &e,
        "update g --drain-cidr 10.79.5.0/28",
        "not one of the pool's CIDRs",
    );
    let t0 = Instant::now();
    pool_ok(&e, "update g --add-cidr 10.79.1.0/28");
    let grown = first_address(&n.call(&env, "ADD", "c13", &conf));
    let took = t0.elapsed();
    eprintln!("ADD after --add-cidr: {took:?}");
    assert!(
        took < Duration::from_secs(1),
        "ADD after --add-cidr took {took:?}"
    );
    assert!("10.79.1.0/28"
        .parse::<ipnet::IpNet>()
        .unwrap()
        .contains(&grown));

    // Drain the first CIDR: its block takes no new lease, the new one serves.
    pool_ok(&e, "update g --drain-cidr 10.79.0.0/28");
    n.call(&env, "DEL", "c0", &conf).ok_silent();
    // The node learns of the drain within a third of its session TTL (default 30 s).
    eventually(
        Duration::from_secs(15),
        "no new lease in a draining block",
        || {
            let cid = format!("probe-{}", Instant::now().elapsed().as_nanos());
            let a = first_address(&n.call(&env, "ADD", &cid, &conf));
            n.call(&env, "DEL", &cid, &conf).ok_silent();
            !"10.79.0.0/28".parse::<ipnet::IpNet>().unwrap().contains(&a)
        },
    );
    assert_eq!(block_of(&e, "g", grown)["node"], "g1");
    for i in 1..13 {
        n.call(&env, "DEL", &format!("c{i}"), &conf).ok_silent();
    }
    let t = eventually(
        Duration::from_secs(15),
        "the drained CIDR leaving the pool",
        || show(&e, "g")["cidrs"] == json!(["10.79.1.0/28"]),
    );
    eprintln!("the drained CIDR left the pool {t:?} after its last DEL");
    assert_eq!(show(&e, "g")["draining"], json!([]));
    n.call(&env, "ADD", "c20", &conf).result();

    // Draining the last CIDR: its block goes, the CIDR stays (draining) for the pool to be.
    pool_ok(&e, "update g --drain-cidr 10.79.1.0/28");
    for cid in ["c13", "c20"] {
        n.call(&env, "DEL", cid, &conf).ok_silent();
    }
    eventually(Duration::from_secs(20), "the last block released", || {
        show(&e, "g")["blocks"] == json!([])
    });
    std::thread::sleep(Duration::from_secs(3)); // a reclaimer look or two
    let last = show(&e, "g");
    assert_eq!(
        (&last["cidrs"], &last["draining"]),
        (&json!(["10.79.1.0/28"]), &json!(["10.79.1.0/28"]))
    );
    n.call(&env, "ADD", "c21", &conf)
        .expect_err(103, &["pool g"]);
}
