//! `--cluster-scale`: the cluster at scale. `--nodes` (100) real `cnikit ipamd daemon`
//! processes (about 8 MB resident and no measurable CPU each when idle, so none is
//! simulated), each its own node (socket, data dir, `--node`, log), claim `--blocks` (1,100)
//! blocks of `--block-size` (/28: 13 addresses) from one pool on one etcd member, all child
//! processes as in `--cluster` (`cluster.rs`). The daemons run with `--etcd-session-ttl
//! --session-ttl` (30 s, their default), the pool with `--reclaim-after` (30 s). Every figure
//! comes with its floor or reference from the same run:
//!
//! 1. fill: `--clients` threads, each serving its share of the nodes in turn, allocate
//!    (client library) until every node holds its share of the blocks, the last with room.
//!    Per allocation the client time and whether it claimed (its address lies in a block
//!    new to the node); the claims' own time from the daemons' logs ("claimed block … in
//!    T"); the floor under the same load: a bench client making a claim's three etcd calls
//!    bare every 5 ms meanwhile;
//! 2. etcd's floor on the idle cluster: a get of the pool key, a list of the pool's blocks
//!    and a create-if-absent transaction, from the bench with etcd-client (the daemon's
//!    crate): what one claim does (its list grows with the pool);
//! 3. whole plugin ADDs (exec of `cnikit`), sequential on one node, in a second network of
//!    the same pool, so that every 13th claims a block: ADD that claims vs ADD that does not,
//!    and those claims as the daemon timed them, with 1,100+ blocks in the pool;
//! 4. idle for `--idle-seconds` (30): etcd requests per second of each node (the daemons'
//!    `ipamd_cluster_etcd_requests_total`), the reclaimer apart, against the daemon's timers;
//!    etcd's own count by gRPC method, the bytes it sent and its writes (revision); the
//!    daemons' CPU; and what one /metrics scrape of every node costs etcd;
//! 5. per-pod: ADD + DEL pairs (client library, `--clients` threads) on all nodes for as
//!    long as step 4, within the blocks they own: claims (none), and etcd calls beyond the
//!    idle rate less etcd's writes, which are the usage pushes (changed counts, every 2 s):
//!    target none per pod;
//! 6. reclaim: SIGKILL `--kill` (10) nodes, never the reclaimer, and poll `cnikit ipamd pool
//!    show --json` until all their blocks are "quarantined" (and before that "orphaned":
//!    sessions gone), against reclaimAfter + TTL + 10 s.
//!
//! A scrape of a daemon's /metrics reads its pool's view from etcd (at most every 5 s) after
//! it took its counters: a window starts with two scrapes, so that the view read of the
//! start is not counted in it, and ends with one.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ipamd::client::Client;
use ipnet::IpNet;

use super::cluster::{
    claim_times, ms, pool_create, spawn_node, start_etcd, wait_node, Children, Node,
};
use super::scale_probes::{self as probes, Etcd};
use super::{exec_plugin_answer, metric, percentile, request, Args};

mod steps;

pub(crate) const POOL: &str = "scalepool";
pub(crate) const NETWORK: &str = "scale";
pub(crate) const SEQ_NETWORK: &str = "scale-seq";

/// The sizes of the run (flags).
#[derive(Debug, Clone)]
pub(crate) struct Sizes {
    pub nodes: usize,
    pub blocks: usize,
    pub block_size: u8,
    pub session_ttl: u64,
    pub reclaim_after: u64,
    pub kill: usize,
    pub idle_seconds: u64,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes {
            nodes: 100,
            blocks: 1100,
            block_size: 28,
            session_ttl: 30,
            reclaim_after: 30,
            kill: 10,
            idle_seconds: 30,
        }
    }
}

pub(crate) const FLAGS: &str = "[--cluster-scale [--nodes N] [--blocks N] [--block-size N] [--session-ttl S] [--reclaim-after S] [--kill N] [--idle-seconds S]]";

impl Sizes {
    /// Take `flag` if it is one of the scale run's; whether it was.
    pub(crate) fn flag(
        &mut self,
        flag: &str,
        value: &mut dyn FnMut() -> Result<String, String>,
    ) -> Result<bool, String> {
        let mut num = |what: &str| -> Result<u64, String> {
            value()?.parse().map_err(|e| format!("{what}: {e}"))
        };
        match flag {
            "--nodes" => self.nodes = num(flag)? as usize,
            "--blocks" => self.blocks = num(flag)? as usize,
            "--block-size" => {
                self.block_size = u8::try_from(num(flag)?).map_err(|e| format!("{flag}: {e}"))?
            }
            "--session-ttl" => self.session_ttl = num(flag)?,
            "--reclaim-after" => self.reclaim_after = num(flag)?,
            "--kill" => self.kill = num(flag)? as usize,
            "--idle-seconds" => self.idle_seconds = num(flag)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn check(&self) -> Result<(), String> {
        if self.nodes < self.kill + 2 || self.blocks < self.nodes {
            return Err("--nodes must exceed --kill + 1, and --blocks be at least --nodes".into());
        }
        if !(8..=30).contains(&self.block_size) || self.reclaim_after == 0 {
            return Err("--block-size must be 8-30 and --reclaim-after above 0".into());
        }
        Ok(())
    }

    /// Addresses a block leases (network, gateway and last address are never leased).
    pub(crate) fn capacity(&self) -> usize {
        (1usize << (32 - self.block_size)) - 3
    }
}

/// The nodes and what the run needs of them.
pub(crate) struct Cluster {
    pub exe: std::path::PathBuf,
    pub endpoint: String,
    pub nodes: Vec<Node>,
    /// Index of each node's daemon in `kids`.
    pub kid: Vec<usize>,
    pub kids: Children,
    pub etcd: Etcd,
}

impl Cluster {
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.kid.iter().map(|&i| self.kids.0[i].id()).collect()
    }
}

pub(crate) fn run(args: &Args, root: &Path) -> Result<(), String> {
    let s = &args.scale;
    s.check()?;
    let exe = args.cnikit.clone().ok_or(
        "--cluster-scale needs the cnikit binary (`cargo build --release -p cnikit` or --cnikit PATH)",
    )?;
    println!(
        "ipamd_bench --cluster-scale: load average {} at the start, {} CPUs",
        probes::loadavg(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let per_node = s.blocks.div_ceil(s.nodes);
    let seq_claims = (args.iterations / 10).max(50);
    let cidr = pool_cidr(s, s.nodes * per_node + seq_claims)?;
    let mut kids = Children(Vec::new());
    let endpoint = start_etcd(&args.etcd, root, &mut kids)?;
    let reclaim = [format!("--reclaim-after={}", s.reclaim_after)];
    pool_create(&exe, &endpoint, (POOL, &cidr, s.block_size), &reclaim)?;
    let started = Instant::now();
    let (nodes, kid) = start_nodes(&exe, root, &endpoint, s, &mut kids)?;
    let etcd = Etcd::connect(&endpoint)?;
    let mut c = Cluster {
        exe,
        endpoint,
        nodes,
        kid,
        kids,
        etcd,
    };
    let rss: Vec<u64> = c.pids().iter().map(|&p| probes::rss_kb(p)).collect();
    println!(
        "scale: etcd {} (one member), pool {POOL} {cidr} of /{} blocks ({} addresses each, reclaimAfter {} s), {} daemons (session TTL {} s) serving in {:.1} s; daemon RSS mean {:.1} MB, all {:.0} MB",
        c.endpoint,
        s.block_size,
        s.capacity(),
        s.reclaim_after,
        s.nodes,
        s.session_ttl,
        started.elapsed().as_secs_f64(),
        rss.iter().sum::<u64>() as f64 / rss.len() as f64 / 1024.0,
        rss.iter().sum::<u64>() as f64 / 1024.0,
    );
    let allocs = (per_node - 1) * s.capacity() + 1;
    fill(&c, args.clients, allocs)?;
    // Let the usage pushes of the fill settle before anything is measured at rest.
    std::thread::sleep(Duration::from_secs(5));
    let floor = steps::floors(&mut c, args.iterations.clamp(50, 200))?;
    steps::sequential(&c, seq_claims, s.capacity(), &floor)?;
    std::thread::sleep(Duration::from_secs(5));
    let idle = steps::idle(&mut c, s)?;
    steps::per_pod(&mut c, args, s, &idle)?;
    steps::reclaim(&mut c, s)?;
    steps::summary(&c);
    println!("scale: load average {} at the end", probes::loadavg());
    Ok(())
}

/// A pool with room for twice the blocks the run claims (a power of two of them).
fn pool_cidr(s: &Sizes, needed: usize) -> Result<String, String> {
    let bits = (2 * needed).next_power_of_two().trailing_zeros();
    let prefix = u32::from(s.block_size)
        .checked_sub(bits)
        .filter(|p| *p >= 8)
        .ok_or("--blocks too many for --block-size within 10.0.0.0/8")?;
    Ok(format!("10.0.0.0/{prefix}"))
}

/// Start every daemon, then wait for each to hold its session.
fn start_nodes(
    exe: &Path,
    root: &Path,
    etcd: &str,
    s: &Sizes,
    kids: &mut Children,
) -> Result<(Vec<Node>, Vec<usize>), String> {
    let mut nodes = Vec::with_capacity(s.nodes);
    let mut kid = Vec::with_capacity(s.nodes);
    let extra = [format!("--etcd-session-ttl={}", s.session_ttl)];
    for i in 0..s.nodes {
        let name = format!("node-{i:03}");
        let (node, k) = spawn_node(exe, root, (&name, etcd), &extra, kids)?;
        nodes.push(node);
        kid.push(k);
    }
    for (n, &i) in nodes.iter().zip(&kid) {
        wait_node(kids, i, n)?;
    }
    Ok((nodes, kid))
}

/// One allocation in `pool` of `network` through the client library: its client-side
/// time and the block of its address.
pub(crate) fn alloc(c: &Client, network: &str, cid: &str) -> Result<(Duration, IpNet), String> {
    let mut r = request(network, cid, &[]);
    r.pools = vec![POOL.to_string()];
    let t = Instant::now();
    let a = c.allocate(&r).map_err(|e| e.to_string())?;
    let took = t.elapsed();
    let addr = a.first().ok_or("an allocation without an address")?.address;
    Ok((took, addr.trunc()))
}

/// `threads` threads, each serving its share of the nodes in turn (node j by thread
/// j % threads, so one node's steps are sequential): `rounds` calls of
/// `step(client, node, its state, round)` per node, or as many as fit before `until`.
/// Returns every result and the wall time.
pub(crate) fn drive<S: Default, T: Send>(
    nodes: &[Node],
    threads: usize,
    (rounds, until): (usize, Option<Instant>),
    step: impl Fn(&Client, &Node, &mut S, usize) -> Result<T, String> + Sync,
) -> Result<(Vec<T>, Duration), String> {
    let threads = threads.clamp(1, nodes.len());
    let started = Instant::now();
    let step = &step;
    let parts: Vec<Result<Vec<T>, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || {
                    let mine: Vec<&Node> = nodes.iter().skip(t).step_by(threads).collect();
                    let clients: Vec<Client> = mine.iter().map(|n| n.client()).collect();
                    let mut state: Vec<S> = mine.iter().map(|_| S::default()).collect();
                    let mut out =
                        Vec::with_capacity(rounds.saturating_mul(mine.len()).min(1 << 16));
                    for k in 0..rounds {
                        if until.is_some_and(|u| Instant::now() >= u) {
                            break;
                        }
                        for (j, n) in mine.iter().enumerate() {
                            out.push(step(&clients[j], n, &mut state[j], k)?);
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let mut all = Vec::new();
    for p in parts {
        all.extend(p?);
    }
    Ok((all, started.elapsed()))
}

/// Step 1: every node allocates `allocs` addresses, claiming its share of the blocks.
fn fill(c: &Cluster, clients: usize, allocs: usize) -> Result<(), String> {
    let offsets: Vec<u64> = c.nodes.iter().map(Node::log_len).collect();
    let claims0 = claims_total(&c.nodes);
    let spec = format!("/cnikit/pools/{POOL}");
    let blocks = format!("{spec}/blocks/");
    let (done, mut floor) = probes::floor_during(&c.endpoint, (&spec, &blocks), || {
        drive(
            &c.nodes,
            clients,
            (allocs, None),
            |client, n, seen: &mut HashSet<IpNet>, k| {
                let (took, block) = alloc(client, NETWORK, &format!("f-{}-{k}", n.name))
                    .map_err(|e| format!("fill: allocate on {}: {e}", n.name))?;
                Ok((took, seen.insert(block)))
            },
        )
    })?;
    let (timed, wall) = done?;
    let claims = claims_total(&c.nodes) - claims0;
    let mut daemon: Vec<Duration> = c
        .nodes
        .iter()
        .zip(&offsets)
        .flat_map(|(n, &off)| claim_times(&n.log, off))
        .collect();
    let (with, without) = split(&timed);
    println!(
        "scale 1. fill: {} nodes x {allocs} allocations (client library, {} threads) in {:.1} s, {:.0}/s: {} claims ({claims:.0} counted by the daemons, {} logged); block claim, daemon-timed: {} (etcd's floor under this load, a claim's three calls bare from the bench every 5 ms: {}); allocation that claimed, client-side: {}; that did not: {}",
        c.nodes.len(),
        clients.clamp(1, c.nodes.len()),
        wall.as_secs_f64(),
        timed.len() as f64 / wall.as_secs_f64(),
        with.len(),
        daemon.len(),
        dist(&mut daemon),
        dist(&mut floor),
        dist(&mut with.clone()),
        dist(&mut without.clone()),
    );
    Ok(())
}

/// Split (time, claimed) samples into the times that claimed and those that did not.
pub(crate) fn split(timed: &[(Duration, bool)]) -> (Vec<Duration>, Vec<Duration>) {
    let with = timed.iter().filter(|t| t.1).map(|t| t.0).collect();
    let without = timed.iter().filter(|t| !t.1).map(|t| t.0).collect();
    (with, without)
}

/// "p50 … p99 … max … (n=…)", sorting `v`.
pub(crate) fn dist(v: &mut [Duration]) -> String {
    v.sort();
    format!(
        "p50 {:.2} ms p99 {:.2} ms max {:.2} ms (n={})",
        ms(percentile(v, 0.5)),
        ms(percentile(v, 0.99)),
        ms(v.last().copied().unwrap_or_default()),
        v.len()
    )
}

pub(crate) fn claims_total(nodes: &[Node]) -> f64 {
    nodes
        .iter()
        .filter_map(|n| metric(&n.sock, "ipamd_cluster_block_claims_total"))
        .sum()
}

/// A whole plugin ADD (exec of `cnikit` as `ipamd`): its time and its address's block.
pub(crate) fn exec_add(exe: &Path, conf: &str, cid: &str) -> Result<(Duration, IpNet), String> {
    let (took, text) = exec_plugin_answer(exe, conf, "ADD", cid)?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("plugin ADD answer: {e}: {text}"))?;
    let addr: IpNet = v["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("plugin ADD answer without an address: {text}"))?;
    Ok((took, addr.trunc()))
}

/// `cnikit ipamd pool show POOL --json`, and how long it took.
pub(crate) fn pool_show(
    exe: &Path,
    endpoint: &str,
) -> Result<(serde_json::Value, Duration), String> {
    let t = Instant::now();
    let out = Command::new(exe)
        .args(["ipamd", "pool", "show", POOL, "--json"])
        .arg(format!("--etcd-endpoints={endpoint}"))
        .output()
        .map_err(|e| format!("running cnikit ipamd pool show: {e}"))?;
    let took = t.elapsed();
    if !out.status.success() {
        return Err(format!(
            "cnikit ipamd pool show: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v = serde_json::from_slice(&out.stdout).map_err(|e| format!("pool show --json: {e}"))?;
    Ok((v, took))
}
