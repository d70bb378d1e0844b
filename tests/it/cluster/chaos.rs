//! Chaos: a 3-member etcd and 4 nodes, each node daemon in its own network namespace
//! ([`super::netns`]), 2 ADD/DEL clients per node, while two fault injectors run at once,
//! driven by a seeded RNG:
//!
//! - the long one cuts a node off from etcd for longer than `reclaimAfter` + the session
//!   TTL (packets dropped in its namespace, its daemon SIGSTOPped, or SIGKILLed), times
//!   until `pool show` no longer gives the node the blocks it had, lets it return, and
//!   times until it serves an ADD again;
//! - the short one, every 1–3 s, SIGKILLs or SIGSTOPs one etcd member (for up to 2.5 s)
//!   or a node daemon, or partitions a node (for up to 1 s), then restores it; also while
//!   the long one times a reclaim, but then never the etcd leader: a new leader gives every
//!   lease its whole TTL again (etcd's rule), so the cut-off node's session would outlive
//!   the TTL the bound counts from the cut (with leader faults every few seconds it lived
//!   17 s). The members run with `--pre-vote` for the same reason: without it a member
//!   back from SIGSTOP deposes the leader.
//!
//! At the end ([`verdict`]): no address in two attachments that are both live, nor in two
//! nodes' journals at all (the pool keeps never-used space, so quarantine alone must keep
//! a reclaimed block's addresses from being handed out again); every node's journal holds
//! exactly the live attachments (an acknowledged lease kept, a DELed one gone; asserted for
//! the nodes never cut off long enough to lose their session, counted for the others);
//! every lease lies in a block of its node's or reclaimed from it; no ADD started after a
//! block was seen reclaimed got an address in it; every reclaim within `reclaimAfter` +
//! TTL + 10 s.
//!
//! The report (stderr, and the file `CNIKIT_CHAOS_REPORT` names, as JSON) gives the rounds
//! run, every reclaim time (and when the node was first seen without a session and its
//! absence first counted), every return time and the worst reclaim. A failure lists every
//! violation, and a reclaim over its bound, or within 3 s of it, prints the daemons'
//! session and reclaim log lines of its window (the daemons' lines carry Unix times:
//! [`super::netns`]).
//!
//! Knobs (environment): `CNIKIT_CHAOS_SECS` how long faults are injected (default 30: the
//! run takes about 50 s), `CNIKIT_CHAOS_ROUNDS` long rounds at least (default 2),
//! `CNIKIT_CHAOS_SEED` the seed (printed at the start: a failing run's seed repeats its
//! choices, not its timing).

mod faults;
mod verdict;
mod world;

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use world::{StopOnDrop, World, POOL};

const NODES: usize = 4;
const CLIENTS_PER_NODE: usize = 2;
const MAX_LIVE_PER_CLIENT: usize = 10;
/// `--etcd-session-ttl` of every node.
const TTL: Duration = Duration::from_secs(3);
/// The pool's `--reclaim-after`.
const RECLAIM_AFTER: Duration = Duration::from_secs(4);
/// A node that returned serves an ADD within this.
const RETURN_LIMIT: Duration = Duration::from_secs(25);
/// A /16 of /28 blocks: 4096 blocks, a few dozen ever claimed.
const POOL_ARGS: &str = "--cidr 10.96.0.0/16 --block-size 28";

/// What a run was asked to do.
struct Settings {
    seed: u64,
    secs: u64,
    rounds: usize,
}

impl Settings {
    fn from_env() -> Settings {
        let num = |k: &str| {
            std::env::var(k).ok().map(|v| {
                let v = v.trim();
                let parsed = match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => v.parse(),
                };
                parsed.unwrap_or_else(|e| panic!("{k}={v}: {e}"))
            })
        };
        let seed = num("CNIKIT_CHAOS_SEED").unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            t.map_or(1, |d| d.as_nanos() as u64) ^ u64::from(std::process::id())
        });
        Settings {
            seed,
            secs: num("CNIKIT_CHAOS_SECS").unwrap_or(30),
            rounds: num("CNIKIT_CHAOS_ROUNDS").unwrap_or(2) as usize,
        }
    }

    /// The `k`-th thread's generator.
    fn rng(&self, k: u64) -> Rng {
        let mut r = Rng((self.seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
        r.next();
        r
    }
}

/// A random duration in `lo..hi` milliseconds.
fn ms(rng: &mut Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + rng.next() % (hi - lo))
}

/// Proves: under concurrent ADD/DEL on 4 nodes, random SIGKILL/SIGSTOP of node daemons
/// and etcd members, and nodes cut off from etcd past `reclaimAfter` + TTL and returning,
/// no address is held twice, acknowledged leases are kept, a reclaimed block's addresses
/// are not handed out again, and reclaims take at most `reclaimAfter` + TTL + 10 s.
#[test]
fn chaos_partitions_kills_and_reclaims() {
    let started = Instant::now();
    let s = Settings::from_env();
    eprintln!(
        "chaos: seed {:#x} (CNIKIT_CHAOS_SEED), {} s of faults (CNIKIT_CHAOS_SECS), at least {} long rounds (CNIKIT_CHAOS_ROUNDS)",
        s.seed, s.secs, s.rounds
    );
    let env = TestEnv::new("cluster_chaos_reclaim");
    let lan = netns::Lan::new(&env, 3);
    let mut etcd = lan.etcd(&env);
    let e = etcd.endpoints();
    let reclaim = RECLAIM_AFTER.as_secs();
    pool_ok(
        &e,
        &format!("create {POOL} {POOL_ARGS} --reclaim-after {reclaim}"),
    );
    let ttl = format!("--etcd-session-ttl={}", TTL.as_secs());
    let extra = [ttl.as_str(), "--log-level", "info"];
    let nodes: Vec<netns::NsNode> = (0..NODES)
        .map(|i| lan.node(&env, i, &format!("k{i}"), &e, &extra))
        .collect();
    // The partition cuts, and its end mends.
    let member = e.split(',').next().expect("an endpoint");
    let (once, patiently) = (Duration::ZERO, Duration::from_secs(10));
    assert!(
        nodes[0].reaches(member, patiently),
        "k0 does not reach {member}"
    );
    nodes[0].partition(true);
    assert!(
        !nodes[0].reaches(member, once),
        "partitioned k0 reaches {member}"
    );
    nodes[0].partition(false);
    assert!(
        nodes[0].reaches(member, patiently),
        "k0 does not reach {member} after"
    );
    assert!(etcd.leader().is_some(), "no etcd member says it leads");
    let w = World::new(&env, nodes, e.clone());
    let short_done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        for ni in 0..NODES {
            for t in 0..CLIENTS_PER_NODE {
                let (w, s) = (&w, &s);
                sc.spawn(move || {
                    let _stop = StopOnDrop(&w.stop);
                    let mut rng = s.rng(100 + (ni * CLIENTS_PER_NODE + t) as u64);
                    w.client(ni, t, &mut rng, MAX_LIVE_PER_CLIENT);
                });
            }
        }
        // Every node gets blocks before the faults start.
        std::thread::sleep(Duration::from_secs(2));
        let deadline = Instant::now() + Duration::from_secs(s.secs);
        let short = sc.spawn(|| faults::short_faults(&w, &mut etcd, &s, &short_done));
        faults::long_faults(&w, &s, deadline);
        short_done.store(true, Ordering::SeqCst);
        if let Err(p) = short.join() {
            std::panic::resume_unwind(p);
        }
        w.say("faults over; stopping the clients");
        w.stop.store(true, Ordering::SeqCst);
    });
    verdict::judge(&w, &s, started);
}
