//! What the chaos test knows of the cluster while it runs: the nodes, the attachments the
//! clients hold (ADD acknowledged, no DEL started), every acknowledged ADD, the blocks seen
//! reclaimed, and what went wrong. The clients: ADD/DEL loops on every node.

use super::super::netns::NsNode;
use super::super::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The pool every node allocates from, and the network the nodes' configs name.
pub const POOL: &str = "storm";
pub const NETWORK: &str = "pods";

/// An acknowledged ADD.
#[derive(Debug, Clone)]
pub struct Ack {
    pub node: usize,
    pub cid: String,
    pub addr: IpAddr,
    /// When the client sent it.
    pub started: Instant,
}

/// A block seen reclaimed from a node.
#[derive(Debug, Clone)]
pub struct Reclaimed {
    pub block: ipnet::IpNet,
    pub from: usize,
    /// When the test saw it no longer the node's.
    pub seen: Instant,
}

/// How long a reclaim took from the cut: until `pool show` said the node had no session,
/// until it counted its absence, until its blocks were no longer its own.
#[derive(Debug, Clone)]
pub struct ReclaimTime {
    pub what: String,
    pub took: Duration,
    pub orphaned: Option<Duration>,
    pub counted: Option<Duration>,
}

#[derive(Default)]
pub struct Counts {
    pub adds_ok: AtomicU64,
    pub adds_failed: AtomicU64,
    pub dels: AtomicU64,
}

pub struct World<'a> {
    pub env: &'a TestEnv,
    pub nodes: Vec<NsNode>,
    pub endpoints: String,
    pub t0: Instant,
    /// `t0` as Unix time (the daemons' log lines carry Unix times).
    pub unix0: f64,
    /// A fault is on the node now (one at a time per node).
    pub busy: Vec<AtomicBool>,
    /// The node was cut off from etcd (partitioned, stopped or dead) long enough that its
    /// session may have expired.
    pub cut_off: Vec<AtomicBool>,
    /// Live attachments: address → (node, container).
    pub live: Mutex<BTreeMap<IpAddr, (usize, String)>>,
    pub acks: Mutex<Vec<Ack>>,
    pub reclaimed: Mutex<Vec<Reclaimed>>,
    pub violations: Mutex<Vec<String>>,
    pub counts: Counts,
    /// The starts of the long cuts: (node, when).
    pub cuts: Mutex<Vec<(usize, Instant)>>,
    /// Long and short rounds run, by kind.
    pub long_rounds: Mutex<BTreeMap<&'static str, usize>>,
    pub short_rounds: Mutex<BTreeMap<&'static str, usize>>,
    pub reclaim_times: Mutex<Vec<ReclaimTime>>,
    /// (round, time from the node's return until it served an ADD).
    pub return_times: Mutex<Vec<(String, Duration)>>,
    /// A reclaim is being timed: the etcd leader is left alone meanwhile.
    pub timing: AtomicBool,
    /// Everything stops (the end, or a thread panicked).
    pub stop: AtomicBool,
}

impl<'a> World<'a> {
    pub fn new(env: &'a TestEnv, nodes: Vec<NsNode>, endpoints: String) -> World<'a> {
        let n = nodes.len();
        World {
            env,
            nodes,
            endpoints,
            t0: Instant::now(),
            unix0: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_secs_f64(),
            busy: (0..n).map(|_| AtomicBool::new(false)).collect(),
            cut_off: (0..n).map(|_| AtomicBool::new(false)).collect(),
            live: Mutex::default(),
            acks: Mutex::default(),
            reclaimed: Mutex::default(),
            violations: Mutex::default(),
            counts: Counts::default(),
            cuts: Mutex::default(),
            long_rounds: Mutex::default(),
            short_rounds: Mutex::default(),
            reclaim_times: Mutex::default(),
            return_times: Mutex::default(),
            timing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    /// Something the test proves did not hold; the run goes on and fails at the end.
    pub fn violation(&self, what: String) {
        eprintln!("chaos VIOLATION at {:?}: {what}", self.t0.elapsed());
        lock(&self.violations).push(what);
    }

    /// Log a step (with the time since the start).
    pub fn say(&self, what: &str) {
        eprintln!("chaos {:>7.2}s {what}", self.t0.elapsed().as_secs_f64());
    }

    /// Print the lines of every node's daemon logs since `from` that say something about
    /// sessions, absences or reclaims, in time order (times since the start of the run).
    pub fn dump_logs(&self, from: Instant) {
        let t = |i: Instant| self.unix0 + i.duration_since(self.t0).as_secs_f64();
        let mut lines: Vec<(f64, String)> = Vec::new();
        for n in &self.nodes {
            for (at, l) in n.log_lines(t(from), t(Instant::now())) {
                let wanted = ["session", "absen", "reclaim", "etcd ("];
                if wanted.iter().any(|w| l.contains(w)) {
                    lines.push((at - self.unix0, format!("{}: {l}", n.node.name)));
                }
            }
        }
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (at, l) in lines {
            let l: String = l.chars().take(300).collect();
            eprintln!("chaos {at:>7.2}s   {l}");
        }
    }

    pub fn name(&self, ni: usize) -> &str {
        &self.nodes[ni].node.name
    }

    /// Take node `ni` for a fault, unless another fault has it.
    pub fn take(&self, ni: usize) -> bool {
        self.busy[ni]
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    pub fn give_back(&self, ni: usize) {
        self.busy[ni].store(false, Ordering::SeqCst);
    }

    /// ADD acknowledged: no live attachment may have the address already.
    pub fn acked(&self, ni: usize, cid: &str, addr: IpAddr, started: Instant) {
        self.counts.adds_ok.fetch_add(1, Ordering::Relaxed);
        let mut live = lock(&self.live);
        if let Some((other, ocid)) = live.get(&addr) {
            let what = format!(
                "{addr} acknowledged to {cid} on {} while live for {ocid} on {}",
                self.name(ni),
                self.name(*other)
            );
            self.violation(what);
        }
        live.insert(addr, (ni, cid.to_string()));
        drop(live);
        lock(&self.acks).push(Ack {
            node: ni,
            cid: cid.to_string(),
            addr,
            started,
        });
    }

    /// One ADD on node `ni`: the address if acknowledged. A failure must be 11 (the
    /// daemon or etcd away, or a session being renewed); the container is then DELeted,
    /// as a runtime does after a failed ADD (the lease may have been written).
    pub fn add(&self, ni: usize, cid: &str) -> Option<IpAddr> {
        let node = &self.nodes[ni].node;
        let conf = node.conf(NETWORK, &[POOL]);
        let started = Instant::now();
        let o = node.call(self.env, "ADD", cid, &conf);
        if o.success() {
            let a = addresses(&o.result())[0].addr();
            self.acked(ni, cid, a, started);
            return Some(a);
        }
        self.counts.adds_failed.fetch_add(1, Ordering::Relaxed);
        let e = o.err();
        if e.code != 11 {
            self.violation(format!("ADD {cid} on {}: {e:?}", node.name));
        }
        self.del(ni, cid);
        None
    }

    /// ADDs on node `ni` until one is acknowledged (containers `NAME-TAG-K`): how long
    /// that took, or None (a violation) past `limit`.
    pub fn serves_again(&self, ni: usize, tag: &str, limit: Duration) -> Option<Duration> {
        let t = Instant::now();
        for k in 0.. {
            if self
                .add(ni, &format!("{}-{tag}-{k}", self.name(ni)))
                .is_some()
            {
                return Some(t.elapsed());
            }
            if t.elapsed() > limit {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let name = self.name(ni);
        self.violation(format!("{name} served no ADD within {limit:?} (tag {tag})"));
        None
    }

    /// DEL of `cid` on node `ni`, which must succeed (retried for 20 s while it fails with
    /// 11: the store's lock held by a stopped daemon).
    pub fn del(&self, ni: usize, cid: &str) {
        let node = &self.nodes[ni].node;
        let conf = node.conf(NETWORK, &[POOL]);
        let t = Instant::now();
        loop {
            let o = node.call(self.env, "DEL", cid, &conf);
            if o.success() {
                self.counts.dels.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let e = o.err();
            if e.code != 11 || t.elapsed() > Duration::from_secs(20) {
                self.violation(format!("DEL {cid} on {}: {e:?}", node.name));
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// A DEL is about to start: the attachment is not live from now on (an ADD elsewhere
    /// may get the address once the DEL is done).
    fn unlive(&self, addr: IpAddr) {
        lock(&self.live).remove(&addr);
    }

    /// One client thread: ADDs and DELs on node `ni` until told to stop, holding at most
    /// `max_live` attachments.
    pub fn client(&self, ni: usize, t: usize, rng: &mut Rng, max_live: usize) {
        let mut mine: Vec<(String, IpAddr)> = Vec::new();
        let mut i = 0;
        while !self.stop.load(Ordering::SeqCst) {
            i += 1;
            // Paced a little: the other tests (and the daemons' keep-alives) get the CPU too.
            std::thread::sleep(Duration::from_millis(rng.next() % 30));
            if !mine.is_empty() && (mine.len() >= max_live || rng.below(10) < 3) {
                let (cid, addr) = mine.swap_remove(rng.below(mine.len()));
                self.unlive(addr);
                self.del(ni, &cid);
                continue;
            }
            let cid = format!("{}-t{t}-{i}", self.name(ni));
            if let Some(a) = self.add(ni, &cid) {
                mine.push((cid, a));
            }
        }
    }

    /// `pool show --json`, or None when the command fails (etcd members are being killed).
    pub fn show(&self) -> Option<Value> {
        let out = pool(&self.endpoints, &format!("show {POOL} --json"));
        if !out.status.success() {
            self.say(&format!(
                "pool show failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

/// A block of `pool show --json`.
#[derive(Debug, Clone)]
pub struct Block {
    pub cidr: ipnet::IpNet,
    /// The owner; "" when quarantined.
    pub node: String,
    /// "owned", "orphaned" or "quarantined".
    pub state: String,
    pub reclaimed_from: String,
    /// Orphaned: how long the reclaimer has counted the owner's absence.
    pub absent_for: Option<u64>,
}

impl Block {
    /// Quarantined after a reclaim from `node`.
    pub fn reclaimed_from(&self, node: &str) -> bool {
        self.node.is_empty() && self.state == "quarantined" && self.reclaimed_from == node
    }
}

/// The blocks of a `pool show --json` answer.
pub fn blocks(shown: &Value) -> Vec<Block> {
    let text = |b: &Value, k: &str| b[k].as_str().unwrap_or("").to_string();
    shown["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .map(|b| Block {
            cidr: b["cidr"].as_str().unwrap().parse().unwrap(),
            node: text(b, "node"),
            state: text(b, "state"),
            reclaimed_from: text(b, "reclaimedFrom"),
            absent_for: b["absentForSeconds"].as_u64(),
        })
        .collect()
}

/// Sets the flag when dropped: a thread that panics stops the others.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}
