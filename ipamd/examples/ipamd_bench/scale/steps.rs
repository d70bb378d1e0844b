//! Steps 2 to 6 of the scale run (its module doc says what each measures).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use super::{
    alloc, claims_total, dist, drive, exec_add, pool_show, split, Cluster, Sizes, NETWORK, POOL,
    SEQ_NETWORK,
};
use crate::cluster::{claim_times, met, ms};
use crate::scale_probes::{
    calls_by_method, cpu_seconds, etcd_metrics, rss_kb, sample, scrape, Floor,
};
use crate::{key, percentile, Args};

/// etcd's floor for a claim: its three calls, bare.
pub(crate) struct ClaimFloor {
    get: Floor,
    list: Floor,
    txn: Floor,
}

/// Step 2.
pub(crate) fn floors(c: &mut Cluster, n: usize) -> Result<ClaimFloor, String> {
    let prefix = format!("/cnikit/pools/{POOL}/blocks/");
    let (keys, bytes) = c.etcd.list_size(&prefix)?;
    let (all_keys, all_bytes) = c.etcd.list_size("/cnikit/pools/")?;
    let [get, list, txn] = c
        .etcd
        .floors(&format!("/cnikit/pools/{POOL}"), &prefix, n)?;
    let f = |x: Floor| format!("p50 {:.2} ms p99 {:.2} ms", ms(x.p50), ms(x.p99));
    println!(
        "scale 2. etcd's floor (bench's etcd client, idle cluster, n={n} each): get of the pool key {}; list of the pool's {keys} blocks ({:.0} kB) {}; create-if-absent transaction {}; a claim's get + list + transaction, p50s added: {:.2} ms. (The reclaimer lists /cnikit/pools/, {all_keys} keys, {:.0} kB, every 2 s.)",
        f(get),
        bytes as f64 / 1024.0,
        f(list),
        f(txn),
        ms(get.p50 + list.p50 + txn.p50),
        all_bytes as f64 / 1024.0,
    );
    Ok(ClaimFloor { get, list, txn })
}

/// Step 3: sequential whole plugin ADDs on the first node, every `cap`-th claiming.
pub(crate) fn sequential(
    c: &Cluster,
    claims: usize,
    cap: usize,
    floor: &ClaimFloor,
) -> Result<(), String> {
    let node = &c.nodes[0];
    let conf = node.ipam_conf(SEQ_NETWORK, serde_json::json!({"pool": POOL}));
    let offset = node.log_len();
    let mut seen = HashSet::new();
    let mut timed = Vec::with_capacity(claims * cap);
    for i in 0..claims * cap {
        let (took, block) = exec_add(&c.exe, &conf, &format!("s-{i}"))
            .map_err(|e| format!("step 3 on {}: {e}", node.name))?;
        timed.push((took, seen.insert(block)));
    }
    let mut daemon = claim_times(&node.log, offset);
    daemon.sort();
    let p99 = percentile(&daemon, 0.99);
    let (mut with, mut without) = split(&timed);
    let sum = |f: fn(&Floor) -> Duration| ms(f(&floor.get) + f(&floor.list) + f(&floor.txn));
    println!(
        "scale 3. whole plugin ADDs (exec), sequential on {}, otherwise idle: block claim, daemon-timed (get spec + list blocks + claim txn): {} (floor, the three bare calls: p50 {:.2} ms, p99s added {:.2} ms; target p99 <= 50 ms: {}); ADD that claimed: {}; ADD that did not: {}",
        node.name,
        dist(&mut daemon),
        sum(|f| f.p50),
        sum(|f| f.p99),
        met(p99 <= Duration::from_millis(50)),
        dist(&mut with),
        dist(&mut without),
    );
    Ok(())
}

/// Counters at the start of a window.
struct Mark {
    at: Vec<Instant>,
    calls: Vec<f64>,
    claims: f64,
    cpu: Vec<f64>,
    etcd: String,
    etcd_at: Instant,
    rev: i64,
}

/// What changed over a window.
pub(crate) struct Window {
    /// Per node: seconds between its two scrapes, etcd calls, CPU seconds.
    secs: Vec<f64>,
    calls: Vec<f64>,
    cpu: Vec<f64>,
    claims: f64,
    /// etcd's own: gRPC calls started by method, bytes sent to clients, over `etcd_secs`.
    methods: BTreeMap<String, f64>,
    sent: f64,
    etcd_secs: f64,
    /// Writes (etcd's revision).
    writes: i64,
}

impl Window {
    fn rate(&self, i: usize) -> f64 {
        self.calls[i] / self.secs[i]
    }
}

/// Each node's etcd calls and claims, with when each was read.
fn read_nodes(c: &Cluster) -> Result<(Vec<Instant>, Vec<f64>, f64), String> {
    let (mut at, mut calls, mut claims) = (Vec::new(), Vec::new(), 0.0);
    for n in &c.nodes {
        let text = scrape(&n.sock).ok_or_else(|| format!("{}: /metrics unreadable", n.name))?;
        at.push(Instant::now());
        calls.push(sample(&text, "ipamd_cluster_etcd_requests_total", &[]));
        claims += sample(&text, "ipamd_cluster_block_claims_total", &[]);
    }
    Ok((at, calls, claims))
}

fn cpu(c: &Cluster) -> Vec<f64> {
    c.pids().iter().map(|&p| cpu_seconds(p)).collect()
}

fn start(c: &mut Cluster) -> Result<Mark, String> {
    // A scrape reads the pool's view after taking its counters: have that done first.
    for n in &c.nodes {
        let _ = scrape(&n.sock);
    }
    let (at, calls, claims) = read_nodes(c)?;
    let cpu = cpu(c);
    let etcd = etcd_metrics(&c.endpoint)?;
    let etcd_at = Instant::now();
    let rev = c.etcd.revision()?;
    Ok(Mark {
        at,
        calls,
        claims,
        cpu,
        etcd,
        etcd_at,
        rev,
    })
}

fn finish(c: &mut Cluster, m: Mark) -> Result<Window, String> {
    let etcd = etcd_metrics(&c.endpoint)?;
    let etcd_secs = m.etcd_at.elapsed().as_secs_f64();
    let rev = c.etcd.revision()?;
    let cpu_end = cpu(c);
    let (at, calls, claims) = read_nodes(c)?;
    let before = calls_by_method(&m.etcd);
    let mut methods = calls_by_method(&etcd);
    for (k, v) in &mut methods {
        *v -= before.get(k).copied().unwrap_or(0.0);
    }
    let sent = "etcd_network_client_grpc_sent_bytes_total";
    let diff = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x - y).collect();
    Ok(Window {
        secs: (at.iter().zip(&m.at))
            .map(|(b, a)| (*b - *a).as_secs_f64())
            .collect(),
        calls: diff(&calls, &m.calls),
        cpu: diff(&cpu_end, &m.cpu),
        claims: claims - m.claims,
        methods,
        sent: sample(&etcd, sent, &[]) - sample(&m.etcd, sent, &[]),
        etcd_secs,
        writes: rev - m.rev,
    })
}

/// The node holding `/cnikit/reclaimer`.
fn reclaimer(c: &mut Cluster) -> Result<usize, String> {
    let v = c
        .etcd
        .get("/cnikit/reclaimer")?
        .ok_or("no daemon holds /cnikit/reclaimer")?;
    let v: serde_json::Value = serde_json::from_slice(&v).map_err(|e| e.to_string())?;
    let name = v["node"].as_str().unwrap_or_default();
    c.nodes
        .iter()
        .position(|n| n.name == name)
        .ok_or_else(|| format!("the reclaimer {name:?} is none of the bench's nodes"))
}

/// mean, min and max of `v`.
fn spread(v: &[f64]) -> String {
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("mean {mean:.3} (min {min:.3}, max {max:.3})")
}

/// etcd's own count of gRPC calls over a window.
fn etcd_calls(w: &Window) -> f64 {
    w.methods.values().sum()
}

/// etcd's own counts over a window.
fn etcd_side(w: &Window) -> String {
    let by: Vec<String> = (w.methods.iter())
        .filter(|(_, v)| **v > 0.0)
        .map(|(k, v)| format!("{k} {:.2}/s", v / w.etcd_secs))
        .collect();
    format!(
        "etcd's own count: {:.1} gRPC calls/s ({}), {:.1} kB/s sent to clients; writes (revision): {}",
        etcd_calls(w) / w.etcd_secs,
        by.join(", "),
        w.sent / w.etcd_secs / 1024.0,
        w.writes
    )
}

/// Step 4: nothing happens for `idle_seconds`.
pub(crate) fn idle(c: &mut Cluster, s: &Sizes) -> Result<Window, String> {
    let r = reclaimer(c)?;
    // What one scrape of every node's /metrics costs etcd (each reads its pool's view).
    let before = etcd_metrics(&c.endpoint)?;
    let took = Instant::now();
    for n in &c.nodes {
        let _ = scrape(&n.sock);
    }
    let took = took.elapsed();
    let after = etcd_metrics(&c.endpoint)?;
    let calls = |t: &str| calls_by_method(t).values().sum::<f64>();
    let sent = |t: &str| sample(t, "etcd_network_client_grpc_sent_bytes_total", &[]);
    let m = start(c)?;
    std::thread::sleep(Duration::from_secs(s.idle_seconds));
    let w = finish(c, m)?;
    let others: Vec<usize> = (0..c.nodes.len()).filter(|&i| i != r).collect();
    let rates: Vec<f64> = others.iter().map(|&i| w.rate(i)).collect();
    let all: f64 = (0..c.nodes.len()).map(|i| w.rate(i)).sum();
    let cpu: Vec<f64> = (0..c.nodes.len())
        .map(|i| 1e3 * w.cpu[i] / w.secs[i])
        .collect();
    println!(
        "scale 4. idle, {:.1} s: etcd requests/s per node (daemon /metrics): {} nodes {}, by the daemon's timers 3 per TTL/3 = {:.3}; the reclaimer ({}) {:.3}; all {} together {all:.1}/s, {:.0} claims; {}; daemon CPU ms/s {}; one /metrics scrape of all {} nodes ({:.1} s) cost etcd {:.0} calls, {:.0} kB sent",
        w.etcd_secs,
        others.len(),
        spread(&rates),
        9.0 / s.session_ttl as f64,
        c.nodes[r].name,
        w.rate(r),
        c.nodes.len(),
        w.claims,
        etcd_side(&w),
        spread(&cpu),
        c.nodes.len(),
        took.as_secs_f64(),
        calls(&after) - calls(&before),
        (sent(&after) - sent(&before)) / 1024.0,
    );
    Ok(w)
}

/// Step 5: ADD + DEL pairs within the blocks the nodes own, for as long as step 4 idled.
pub(crate) fn per_pod(
    c: &mut Cluster,
    args: &Args,
    s: &Sizes,
    idle: &Window,
) -> Result<(), String> {
    let m = start(c)?;
    let until = Instant::now() + Duration::from_secs(s.idle_seconds);
    let (timed, wall) = drive(
        &c.nodes,
        args.clients,
        (usize::MAX, Some(until)),
        |client, n, _: &mut (), k| {
            let cid = format!("pp-{}-{k}", n.name);
            let (add, _) = alloc(client, NETWORK, &cid).map_err(|e| format!("{}: {e}", n.name))?;
            let t = Instant::now();
            client
                .release(&key(NETWORK, &cid))
                .map_err(|e| format!("release on {}: {e}", n.name))?;
            Ok((add, t.elapsed()))
        },
    )?;
    let w = finish(c, m)?;
    let n = c.nodes.len();
    let expected: f64 = (0..n).map(|i| idle.rate(i) * w.secs[i]).sum();
    let calls: f64 = w.calls.iter().sum();
    let rates: Vec<f64> = (0..n).map(|i| w.rate(i)).collect();
    let (mut adds, mut dels): (Vec<Duration>, Vec<Duration>) = timed.into_iter().unzip();
    let pairs = adds.len();
    println!(
        "scale 5. per-pod, {pairs} ADD + DEL pairs (client library, {} threads) within owned blocks in {:.1} s: ADD {}; DEL {}; {:.0} claims; etcd requests/s per node {} (idle {:.3}); calls beyond the idle rate: {:.0} for {pairs} ADDs = {:.3} per ADD, less the writes (usage pushes): {:.0}, by etcd's count {:.0} (target: none per pod; the nodes' session ticks fall together, so a window's edges move these by up to 3 per node); {}",
        args.clients.clamp(1, n),
        wall.as_secs_f64(),
        dist(&mut adds),
        dist(&mut dels),
        w.claims,
        spread(&rates),
        (0..n).map(|i| idle.rate(i)).sum::<f64>() / n as f64,
        calls - expected,
        (calls - expected) / pairs as f64,
        calls - expected - w.writes as f64,
        etcd_calls(&w) - etcd_calls(idle) / idle.etcd_secs * w.etcd_secs - w.writes as f64,
        etcd_side(&w),
    );
    Ok(())
}

/// Step 6: SIGKILL `kill` nodes and time their blocks' reclaim.
pub(crate) fn reclaim(c: &mut Cluster, s: &Sizes) -> Result<(), String> {
    let r = reclaimer(c)?;
    let victims: Vec<usize> = (0..c.nodes.len())
        .rev()
        .filter(|&i| i != r)
        .take(s.kill)
        .collect();
    let names: HashSet<&str> = victims.iter().map(|&i| c.nodes[i].name.as_str()).collect();
    let (before, _) = pool_show(&c.exe, &c.endpoint)?;
    let blocks_of = |v: &serde_json::Value| -> Vec<(String, String, String)> {
        let field = |b: &serde_json::Value, k: &str| b[k].as_str().unwrap_or_default().to_string();
        (v["blocks"].as_array().into_iter().flatten())
            .map(|b| (field(b, "cidr"), field(b, "node"), field(b, "state")))
            .collect()
    };
    let theirs: HashSet<String> = (blocks_of(&before).into_iter())
        .filter(|(_, node, _)| names.contains(node.as_str()))
        .map(|(cidr, _, _)| cidr)
        .collect();
    let rlog = c.nodes[r].log_len();
    let t0 = Instant::now();
    for &i in &victims {
        let k = &mut c.kids.0[c.kid[i]];
        let _ = k.kill();
        let _ = k.wait();
    }
    let bound = Duration::from_secs(s.reclaim_after + s.session_ttl + 10);
    let mut seen: [Option<Duration>; 4] = [None; 4]; // first gone, all gone, first q, all q
    let (mut shows, mut others) = (Vec::new(), 0);
    while seen[3].is_none() && t0.elapsed() < bound + Duration::from_secs(30) {
        let (v, took) = pool_show(&c.exe, &c.endpoint)?;
        let at = t0.elapsed();
        shows.push(took);
        let (mut gone, mut q) = (0, 0);
        for (cidr, _, state) in blocks_of(&v) {
            let quarantined = state == "quarantined";
            if !theirs.contains(&cidr) {
                others += usize::from(quarantined);
                continue;
            }
            gone += usize::from(quarantined || state == "orphaned");
            q += usize::from(quarantined);
        }
        for (i, hit) in [gone > 0, gone == theirs.len(), q > 0, q == theirs.len()]
            .into_iter()
            .enumerate()
        {
            if hit && seen[i].is_none() {
                seen[i] = Some(at);
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let text = std::fs::read(&c.nodes[r].log).unwrap_or_default();
    let logged = String::from_utf8_lossy(text.get(rlog as usize..).unwrap_or_default())
        .matches(": reclaimed block ")
        .count();
    let secs =
        |d: Option<Duration>| d.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64()));
    println!(
        "scale 6. reclaim: {} nodes SIGKILLed, {} blocks: sessions gone (pool show: orphaned) first {}, all {}; quarantined first {}, all {} (bound reclaimAfter {} s + TTL {} s + 10 s = {} s: {}); reclaimer {} logged {logged} reclaims; other blocks quarantined: {others}; pool show --json ({} blocks) {}",
        victims.len(),
        theirs.len(),
        secs(seen[0]),
        secs(seen[1]),
        secs(seen[2]),
        secs(seen[3]),
        s.reclaim_after,
        s.session_ttl,
        bound.as_secs(),
        met(seen[3].is_some_and(|d| d <= bound)),
        c.nodes[r].name,
        blocks_of(&before).len(),
        dist(&mut shows),
    );
    Ok(())
}

/// etcd calls of the whole run on the nodes still up, and etcd's size.
pub(crate) fn summary(c: &Cluster) {
    let texts: Vec<String> = c.nodes.iter().filter_map(|n| scrape(&n.sock)).collect();
    let sum = |name: &str| texts.iter().map(|t| sample(t, name, &[])).sum::<f64>();
    let etcd = etcd_metrics(&c.endpoint).unwrap_or_default();
    let etcd_pid = c.kids.0.first().map_or(0, |k| k.id());
    println!(
        "scale: whole run, {} daemons still up: {:.0} etcd calls, {:.0} errors, {:.0} claims; etcd RSS {:.0} MB, db {:.1} MB",
        texts.len(),
        sum("ipamd_cluster_etcd_requests_total"),
        sum("ipamd_cluster_etcd_errors_total"),
        claims_total(&c.nodes),
        rss_kb(etcd_pid) as f64 / 1024.0,
        sample(&etcd, "etcd_mvcc_db_total_size_in_bytes", &[]) / 1e6,
    );
}
