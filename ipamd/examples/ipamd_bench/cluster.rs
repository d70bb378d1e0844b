//! `--cluster`: cluster pools measured with a real etcd (docs/cluster-pools.md's "Cluster pools on
//! etcd" targets).
//!
//! One etcd member (`--etcd`, Debian's by default) and three `cnikit ipamd daemon` nodes are
//! started as child processes under the bench's temp dir: child processes, not the in-process
//! daemon, because that is how a node runs in production (its own runtime, its own etcd
//! client), and the plugin processes need the `cnikit` binary anyway. Ports are free ones on
//! 127.0.0.1. Every child is SIGKILLed when the mode returns (error included) and, through
//! PR_SET_PDEATHSIG, when the bench itself dies.
//!
//! 1. per-pod ADD (then DEL) of the whole plugin process on node a, a local range vs a
//!    cluster pool through the same daemon, interleaved so that drift hits both; again
//!    (1b) after step 2, in the network whose allocate-only run left it many full blocks;
//! 2. allocations/s over the three nodes: `--clients` threads through the client library
//!    (allocate + release pairs, then allocate only, which keeps claiming blocks), then
//!    plugin processes (ADD only);
//! 3. block claims with an otherwise idle etcd: sequential allocations in a pool of /30
//!    blocks (one address each), so that every allocation claims a block. The claim time is
//!    the daemon's own (its log line "claimed block … in T": listing the pool's blocks plus
//!    the claim transaction); the client-side time of those allocations is printed beside it.
//!    The `/metrics` histogram is not used for the percentiles: it mixes every etcd call
//!    (session keep-alives, usage pushes) and its buckets are too coarse for a p99.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipamd::client::Client;

use super::scale_probes::{sample, scrape};

mod start;
use super::{exec_plugin, metric, percentile, report, request, throughput_with, Args};
pub(crate) use start::{pool_create, spawn_node, start_node, wait_node};

/// Pool of steps 1 and 2: /26 blocks, as in the README's walk-through; a /12 leaves room for
/// the ~1M addresses that allocate-only runs may take.
const POOL: (&str, &str, u8) = ("benchpool", "10.192.0.0/12", 26);
/// Pool of step 3: /30 blocks hold one usable address, so each allocation claims a block.
const CLAIM_POOL: (&str, &str, u8) = ("claimpool", "10.210.0.0/16", 30);
/// The local range of step 1 (outside both pools).
const LOCAL_SUBNET: &str = "10.129.0.0/16";
/// Concurrent plugin processes of step 2 (the README's first figures used 12).
const PLUGIN_WORKERS: usize = 12;

/// Child processes, SIGKILLed and reaped on drop: nothing outlives the mode.
pub(crate) struct Children(pub(crate) Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Children {
    /// Spawn `cmd` with stdout and stderr into `log`; it dies with the bench.
    pub(crate) fn spawn(&mut self, mut cmd: Command, log: &Path) -> Result<usize, String> {
        use std::os::unix::process::CommandExt;
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {:?}: {e}", cmd.get_program()))?;
        self.0.push(child);
        Ok(self.0.len() - 1)
    }

    /// Poll `ready` for up to 30 s; an error with the log's tail if child `i` exits first.
    pub(crate) fn wait(
        &mut self,
        i: usize,
        what: &str,
        log: &Path,
        ready: impl Fn() -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready() {
            let tail = || {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().rev().take(10).collect();
                lines.into_iter().rev().collect::<Vec<_>>().join("\n")
            };
            if let Ok(Some(st)) = self.0[i].try_wait() {
                return Err(format!(
                    "{what} exited ({st}) before serving; its log:\n{}",
                    tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{what} not ready within 30 s; its log:\n{}",
                    tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// One node: a daemon with its own socket, data dir, log and node name.
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) sock: PathBuf,
    pub(crate) data: PathBuf,
    pub(crate) log: PathBuf,
}

impl Node {
    pub(crate) fn ipam_conf(&self, network: &str, source: serde_json::Value) -> String {
        let mut ipam =
            serde_json::json!({"type": "ipamd", "dataDir": self.data, "socket": self.sock});
        for (k, v) in source.as_object().into_iter().flatten() {
            ipam[k] = v.clone();
        }
        serde_json::json!({"cniVersion": "1.0.0", "name": network, "type": "ipamd", "ipam": ipam})
            .to_string()
    }

    pub(crate) fn client(&self) -> Client {
        Client::new(&self.sock, &self.data)
    }

    /// Size of its log now: claims logged after this offset belong to what follows.
    pub(crate) fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }
}

pub(crate) fn run(args: &Args, root: &Path) -> Result<(), String> {
    let exe = args.cnikit.clone().ok_or(
        "--cluster needs the cnikit binary (`cargo build --release -p cnikit` or --cnikit PATH)",
    )?;
    let mut kids = Children(Vec::new());
    let endpoint = start_etcd(&args.etcd, root, &mut kids)?;
    for (name, cidr, block) in [POOL, CLAIM_POOL] {
        pool_create(&exe, &endpoint, (name, cidr, block), &[])?;
    }
    let nodes = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| start_node(&exe, root, n, &endpoint, &mut kids))
        .collect::<Result<Vec<_>, _>>()?;
    println!(
        "ipamd_bench --cluster: etcd {endpoint} (one member, data under {}), 3 daemons, {} CPUs",
        root.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    per_pod(args, &exe, &nodes[0], "bench-cluster", "1")?;
    throughput(args, &exe, &nodes)?;
    // The ADD builds its range set from every block the network owns on the node: step 1
    // again in the network that step 2's allocate-only run left with many (full) blocks.
    let owned = metric(&nodes[0].sock, "ipamd_cluster_blocks_owned").unwrap_or(0.0);
    println!(
        "1b. {} now owns {owned} blocks (all networks)",
        nodes[0].name
    );
    per_pod(args, &exe, &nodes[0], "bench-ao", "1b")?;
    claims(args, &nodes[0])?;
    etcd_histogram(&nodes);
    Ok(())
}

fn free_port() -> Result<u16, String> {
    // Bound and released at once: a race with another process is possible but unlikely, and
    // etcd then fails to start with a message saying so.
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

pub(crate) fn start_etcd(bin: &Path, root: &Path, kids: &mut Children) -> Result<String, String> {
    let (client, peer) = (free_port()?, free_port()?);
    let c = format!("http://127.0.0.1:{client}");
    let p = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new(bin);
    cmd.args(["--name", "bench", "--data-dir"])
        .arg(root.join("etcd"))
        .arg(format!("--listen-client-urls={c}"))
        .arg(format!("--advertise-client-urls={c}"))
        .arg(format!("--listen-peer-urls={p}"))
        .arg(format!("--initial-advertise-peer-urls={p}"))
        .arg(format!("--initial-cluster=bench={p}"));
    let log = root.join("etcd.log");
    let i = kids
        .spawn(cmd, &log)
        .map_err(|e| format!("{e} (install etcd-server or pass --etcd PATH)"))?;
    kids.wait(i, "etcd", &log, || etcd_healthy(client))?;
    Ok(c)
}

/// GET /health answers `"health":"true"` (the member has a leader).
fn etcd_healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut out = String::new();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
        .is_ok()
        && s.read_to_string(&mut out).is_ok()
        && out.contains("\"health\":\"true\"")
}

/// Step 1: ADD + DEL of a local range and of a cluster pool (network `network`) on one
/// daemon; `step` labels the lines (1b repeats it once the node owns many blocks).
fn per_pod(args: &Args, exe: &Path, node: &Node, network: &str, step: &str) -> Result<(), String> {
    let local = node.ipam_conf("bench-local", serde_json::json!({"subnet": LOCAL_SUBNET}));
    let pool = node.ipam_conf(network, serde_json::json!({"pool": POOL.0}));
    let n = (args.iterations / 4).max(50);
    let mut t: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
    for i in 0..n + n / 10 {
        // Interleaved, and the order swapped every round, so that neither mode always runs
        // right after the other (page cache, scheduler, the daemon's usage push).
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for m in order {
            let conf = [&local, &pool][m];
            let cid = format!("pp{m}-{i}");
            let a = exec_plugin(exe, conf, "ADD", &cid)?;
            let d = exec_plugin(exe, conf, "DEL", &cid)?;
            // The first tenth warms up (and claims the pool's first block).
            if i >= n / 10 {
                t[m].0.push(a);
                t[m].1.push(d);
            }
        }
    }
    for (m, what) in ["local range", "cluster pool"].iter().enumerate() {
        let via = format!("{step}. plugin process (exec) via daemon, {what}");
        report(&via, &t[m].0, &t[m].1);
    }
    let q = |v: &[Duration], p| {
        let mut v = v.to_vec();
        v.sort();
        percentile(&v, p).as_secs_f64()
    };
    let (r50, r99) = (
        q(&t[1].0, 0.5) / q(&t[0].0, 0.5),
        q(&t[1].0, 0.99) / q(&t[0].0, 0.99),
    );
    println!(
        "{step}. cluster/local ADD: p50 {r50:.2}x, p99 {r99:.2}x (target p50 <= 1.2x: {})",
        met(r50 <= 1.2)
    );
    Ok(())
}

pub(crate) fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "not met"
    }
}

/// Step 2: allocations/s over the three nodes.
fn throughput(args: &Args, exe: &Path, nodes: &[Node]) -> Result<(), String> {
    let clients = |k: usize| (0..k).map(|t| nodes[t % nodes.len()].client()).collect();
    let pools = vec![POOL.0.to_string()];
    let req = move |network: &str, cid: &str| {
        let mut r = request(network, cid, &[]);
        r.pools = pools.clone();
        r
    };
    let say = |what: &str, (n, took, errors): (u64, Duration, u64), claims: &str| {
        let rate = n as f64 / took.as_secs_f64();
        println!(
            "2. {what}, 3 nodes, {:.1} s: {rate:.0} allocations/s, {errors} errors{claims} (target >= 1,000/s: {})",
            took.as_secs_f64(),
            met(rate >= 1000.0)
        );
    };
    let r = req.clone();
    let pairs = throughput_with(clients(args.clients), args.seconds, move |c, t, i| {
        let cid = format!("tp-{t}-{i}");
        c.allocate(&r("bench-tp", &cid)).is_ok() && c.release(&super::key("bench-tp", &cid)).is_ok()
    });
    say(
        &format!(
            "client library, {} clients, allocate + release pairs",
            args.clients
        ),
        pairs,
        "",
    );

    let before: Vec<u64> = nodes.iter().map(Node::log_len).collect();
    let claims0 = claims_total(nodes);
    let r = req.clone();
    let only = throughput_with(clients(args.clients), args.seconds, move |c, t, i| {
        c.allocate(&r("bench-ao", &format!("ao-{t}-{i}"))).is_ok()
    });
    let mut under_load: Vec<Duration> = nodes
        .iter()
        .zip(&before)
        .flat_map(|(n, &off)| claim_times(&n.log, off))
        .collect();
    under_load.sort();
    let claims = format!(
        ", {:.0} block claims (daemon-timed p50 {:.1} ms p99 {:.1} ms under this load)",
        claims_total(nodes) - claims0,
        ms(percentile(&under_load, 0.5)),
        ms(percentile(&under_load, 0.99)),
    );
    say(
        &format!("client library, {} clients, allocate only", args.clients),
        only,
        &claims,
    );

    // Whole plugin processes, ADD only, spread over the nodes like the client threads.
    let confs: Vec<String> = nodes
        .iter()
        .map(|n| n.ipam_conf("bench-pp", serde_json::json!({"pool": POOL.0})))
        .collect();
    let exe = exe.to_path_buf();
    let plugins = throughput_with(clients(PLUGIN_WORKERS), args.seconds, move |_, t, i| {
        exec_plugin(&exe, &confs[t % confs.len()], "ADD", &format!("pa-{t}-{i}")).is_ok()
    });
    say(
        &format!("plugin processes, {PLUGIN_WORKERS} concurrent, ADD only"),
        plugins,
        "",
    );
    Ok(())
}

/// Step 3: sequential allocations that each claim a block, etcd otherwise idle.
fn claims(args: &Args, node: &Node) -> Result<(), String> {
    let n = (args.iterations / 10).max(50);
    let client = node.client();
    let offset = node.log_len();
    let claims0 = claims_total(std::slice::from_ref(node));
    let mut client_side = Vec::with_capacity(n);
    for i in 0..n {
        let mut r = request("bench-claim", &format!("cl-{i}"), &[]);
        r.pools = vec![CLAIM_POOL.0.to_string()];
        let t = Instant::now();
        client
            .allocate(&r)
            .map_err(|e| format!("allocate in pool {} on {}: {e}", CLAIM_POOL.0, node.name))?;
        client_side.push(t.elapsed());
    }
    let claimed = claims_total(std::slice::from_ref(node)) - claims0;
    let mut daemon = claim_times(&node.log, offset);
    if daemon.is_empty() {
        return Err(format!("step 3: no claim in the log of {}", node.name));
    }
    if daemon.len() != n || claimed != n as f64 {
        // Not fatal (the figures stay the daemon's), but the step did not do what it says.
        println!(
            "3. note: {n} allocations, {claimed} claims counted, {} logged",
            daemon.len()
        );
    }
    let last = daemon.len() - 1;
    daemon.sort();
    client_side.sort();
    let p99 = percentile(&daemon, 0.99);
    println!(
        "3. block claim, idle etcd, n={n}: daemon-timed (list blocks + claim txn) p50 {:.2} ms p99 {:.2} ms max {:.2} ms; the allocations that claimed, client-side: p50 {:.2} ms p99 {:.2} ms (target p99 <= 50 ms: {})",
        ms(percentile(&daemon, 0.5)),
        ms(p99),
        ms(daemon[last]),
        ms(percentile(&client_side, 0.5)),
        ms(percentile(&client_side, 0.99)),
        met(p99 <= Duration::from_millis(50)),
    );
    Ok(())
}

/// The daemons' etcd latency histogram, summed: every etcd call of the run, for context.
fn etcd_histogram(nodes: &[Node]) {
    // One scrape per node: a count and buckets of separate scrapes disagree (above 100 %).
    let texts: Vec<String> = nodes.iter().filter_map(|n| scrape(&n.sock)).collect();
    let sum = |name: &str, le: &str| texts.iter().map(|t| sample(t, name, &[le])).sum::<f64>();
    let total = sum("ipamd_cluster_etcd_latency_seconds_count", "");
    let within = |le: &str| sum("ipamd_cluster_etcd_latency_seconds_bucket", le);
    println!(
        "etcd calls of the whole run (/metrics, 3 daemons): {total:.0}, {:.0} errors; <= 10 ms {:.1}%, <= 50 ms {:.1}%",
        sum("ipamd_cluster_etcd_errors_total", ""),
        100.0 * within("le=\"0.01\"") / total.max(1.0),
        100.0 * within("le=\"0.05\"") / total.max(1.0),
    );
}

fn claims_total(nodes: &[Node]) -> f64 {
    nodes
        .iter()
        .filter_map(|n| metric(&n.sock, "ipamd_cluster_block_claims_total"))
        .sum()
}

/// Durations of the claims the daemon logged after byte `offset` of its log
/// ("… claimed block C for network N in 3.2ms", a `Duration`'s Debug form).
pub(crate) fn claim_times(log: &Path, offset: u64) -> Vec<Duration> {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default());
    text.lines()
        .filter(|l| l.contains(": claimed block "))
        .filter_map(|l| parse_debug_duration(l.rsplit(" in ").next()?))
        .collect()
}

fn parse_debug_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" | "us" => 1e-6,
        "ns" => 1e-9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(v * scale))
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
