//! Benchmark of the ipamd lease store, daemon and client.
//!
//! ```text
//! cargo build --release                       # for the plugin-process round trips
//! cargo run --release -p ipamd --example ipamd_bench -- [--dir DIR] [--seconds N]
//!     [--iterations N] [--clients N] [--cnikit PATH] [--cluster [--etcd PATH]]
//!     [--cluster-scale [--nodes N] [--blocks N] [--block-size N] [--session-ttl S]
//!     [--reclaim-after S] [--kill N] [--idle-seconds S]]
//! ```
//!
//! Measures, on the file system of `--dir` (default: the temp dir):
//! 1. daemon throughput: `--clients` (32) threads, each a loop of allocate + release through
//!    the client library (one connection per call, like the plugin), for `--seconds`;
//!    every answer is durable (fsync'd before it is sent), fsyncs shared by group commit;
//! 2. single-call client round trip (one client, sequential) through the daemon: p50/p99;
//! 3. the same with no daemon (in-process fallback on the same store format);
//! 4. the full plugin process (exec of `cnikit` as `ipamd`, ADD then DEL), with and without
//!    the daemon, if the `cnikit` binary is found (default: next to this example's
//!    directory, i.e. `target/release/cnikit`).
//!
//! `--cluster` runs only the cluster mode instead (see `cluster.rs`): a real etcd and three
//! `cnikit ipamd daemon` nodes as child processes. `--cluster-scale` runs only the cluster
//! at scale (see `scale.rs`): 100 daemons, 1,100 blocks, idle and per-pod etcd requests,
//! reclaim of SIGKILLed nodes.
//!
//! Must run as root (the daemon serves root only) or it allows the caller's group.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipamd::api::{AllocateRequest, LeaseKey};
use ipamd::client::Client;
use ipamd::config::{IpamConfig, RangeSet};
use ipamd::daemon::{DaemonHandle, DaemonOptions};

mod cluster;
mod scale;
mod scale_probes;

struct Args {
    dir: PathBuf,
    seconds: u64,
    iterations: usize,
    clients: usize,
    cnikit: Option<PathBuf>,
    cluster: bool,
    etcd: PathBuf,
    cluster_scale: bool,
    scale: scale::Sizes,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        dir: std::env::temp_dir(),
        seconds: 5,
        iterations: 2000,
        clients: 32,
        cnikit: std::env::current_exe()
            .ok()
            .and_then(|p| Some(p.parent()?.parent()?.join("cnikit")))
            .filter(|p| p.is_file()),
        cluster: false,
        // Debian's etcd-server.
        etcd: PathBuf::from("/usr/bin/etcd"),
        cluster_scale: false,
        scale: scale::Sizes::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => a.dir = PathBuf::from(value()?),
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--iterations" => {
                a.iterations = value()?.parse().map_err(|e| format!("--iterations: {e}"))?
            }
            "--clients" => a.clients = value()?.parse().map_err(|e| format!("--clients: {e}"))?,
            "--cnikit" => a.cnikit = Some(PathBuf::from(value()?)),
            "--cluster" => a.cluster = true,
            "--etcd" => a.etcd = PathBuf::from(value()?),
            "--cluster-scale" => a.cluster_scale = true,
            "-h" | "--help" => {
                println!("ipamd_bench [--dir DIR] [--seconds N] [--iterations N] [--clients N] [--cnikit PATH] [--cluster [--etcd PATH]] {}", scale::FLAGS);
                std::process::exit(0);
            }
            other => {
                if !a.scale.flag(other, &mut value)? {
                    return Err(format!("unknown argument {other}"));
                }
            }
        }
    }
    Ok(a)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("ipamd_bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let root = args.dir.join(format!("ipamd-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    let res = if args.cluster_scale {
        scale::run(&args, &root)
    } else if args.cluster {
        cluster::run(&args, &root)
    } else {
        bench(&args, &root)
    };
    let _ = std::fs::remove_dir_all(&root);
    res
}

fn bench(args: &Args, root: &Path) -> Result<(), String> {
    let sock = root.join("ipamd.sock");
    let data = root.join("data");
    let sets = IpamConfig::ranges_from_json(&serde_json::json!([[{"subnet": "10.128.0.0/16"}]]))
        .map_err(|e| e.to_string())?;
    println!(
        "ipamd_bench: data dir {} ({} CPUs)",
        data.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // 0. What one durable append costs on this file system.
    let sync = fsync_baseline(root, 500)?;
    println!(
        "baseline: append 160 bytes + fdatasync p50 {:.3} ms p99 {:.3} ms",
        sync.0.as_secs_f64() * 1e3,
        sync.1.as_secs_f64() * 1e3
    );

    // 1. Throughput through the daemon.
    let daemon = start_daemon(&sock, &data)?;
    let fsyncs_before = metric(&sock, "ipamd_fsyncs_total").unwrap_or(0.0);
    // Each step is an allocate + release pair.
    let (pairs, elapsed, errors) = throughput(&sock, &data, args.clients, args.seconds, {
        let sets = sets.clone();
        move |client, t, i| {
            let cid = format!("tp-{t}-{i}");
            client.allocate(&request("bench", &cid, &sets)).is_ok()
                && client.release(&key("bench", &cid)).is_ok()
        }
    });
    let fsyncs = metric(&sock, "ipamd_fsyncs_total").unwrap_or(0.0) - fsyncs_before;
    let secs = elapsed.as_secs_f64();
    println!(
        "daemon, {} concurrent clients, {:.1} s: {:.0} allocations/s ({:.0} allocate+release pairs/s, {:.0} durable requests/s), {:.1} requests per fsync, {errors} errors",
        args.clients,
        secs,
        pairs as f64 / secs,
        pairs as f64 / secs,
        2.0 * pairs as f64 / secs,
        if fsyncs > 0.0 { 2.0 * pairs as f64 / fsyncs } else { 0.0 },
    );

    // 1b. Allocations only (the pool fills up; a /12 leaves room for ~1M).
    let big = IpamConfig::ranges_from_json(&serde_json::json!([[{"subnet": "10.64.0.0/12"}]]))
        .map_err(|e| e.to_string())?;
    let fsyncs_before = metric(&sock, "ipamd_fsyncs_total").unwrap_or(0.0);
    let (allocs, elapsed, errors) = throughput(
        &sock,
        &data,
        args.clients,
        args.seconds,
        move |client, t, i| {
            let cid = format!("ao-{t}-{i}");
            client.allocate(&request("bench-alloc", &cid, &big)).is_ok()
        },
    );
    let fsyncs = metric(&sock, "ipamd_fsyncs_total").unwrap_or(0.0) - fsyncs_before;
    println!(
        "daemon, {} concurrent clients, allocate only, {:.1} s: {:.0} durable allocations/s, {:.1} allocations per fsync, {errors} errors",
        args.clients,
        elapsed.as_secs_f64(),
        allocs as f64 / elapsed.as_secs_f64(),
        if fsyncs > 0.0 { allocs as f64 / fsyncs } else { 0.0 },
    );

    // 2. Single-call round trips through the daemon.
    let client = Client::new(&sock, &data);
    let (alloc, release) = round_trips(&client, &sets, "rt-daemon", args.iterations)?;
    report("client round trip via daemon", &alloc, &release);
    daemon.stop().map_err(|e| e.to_string())?;

    // 3. The in-process fallback (no daemon), same store format, same data dir.
    let client = Client::new(&root.join("no-daemon.sock"), &data);
    let (alloc, release) = round_trips(&client, &sets, "rt-inproc", args.iterations)?;
    report("in-process fallback", &alloc, &release);

    // 4. Whole plugin processes.
    match &args.cnikit {
        Some(exe) => {
            let n = (args.iterations / 4).max(50);
            let daemon = start_daemon(&sock, &data)?;
            let (add, del) = plugin_round_trips(exe, &sock, &data, "plugin-daemon", n)?;
            report("plugin process (exec) via daemon", &add, &del);
            daemon.stop().map_err(|e| e.to_string())?;
            let (add, del) = plugin_round_trips(exe, &sock, &data, "plugin-inproc", n)?;
            report("plugin process (exec) in-process", &add, &del);
        }
        None => println!(
            "plugin process round trips skipped: no cnikit binary (build it with `cargo build --release` or pass --cnikit PATH)"
        ),
    }
    Ok(())
}

fn start_daemon(sock: &Path, data: &Path) -> Result<DaemonHandle, String> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    ipamd::daemon::start(DaemonOptions {
        socket: sock.to_path_buf(),
        data_dir: data.to_path_buf(),
        reclaim_previous_boot: true,
        log_level: "error".into(),
        allowed_gid: (uid != 0).then_some(gid),
        services: ipamd::service::Services::new(),
        cluster: None,
        block_routes: None,
        plugin_calls: true,
    })
    .map_err(|e| format!("starting the daemon: {e}"))
}

fn request(network: &str, cid: &str, sets: &[RangeSet]) -> AllocateRequest {
    AllocateRequest {
        key: key(network, cid),
        range_sets: sets.to_vec(),
        requested: Vec::new(),
        pools: Vec::new(),
    }
}

fn key(network: &str, cid: &str) -> LeaseKey {
    LeaseKey {
        network: network.into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
    }
}

/// `clients` threads, each with its own client, calling `step(client, thread, i)` with
/// i = 0, 1, … until `seconds` have passed; returns (steps that succeeded, elapsed,
/// steps that failed).
fn throughput(
    sock: &Path,
    data: &Path,
    clients: usize,
    seconds: u64,
    step: impl Fn(&Client, usize, u64) -> bool + Send + Sync + 'static,
) -> (u64, Duration, u64) {
    let clients = (0..clients).map(|_| Client::new(sock, data)).collect();
    throughput_with(clients, seconds, step)
}

/// [`throughput`] with one thread per given client (the cluster mode spreads them over
/// the nodes' sockets).
fn throughput_with(
    clients: Vec<Client>,
    seconds: u64,
    step: impl Fn(&Client, usize, u64) -> bool + Send + Sync + 'static,
) -> (u64, Duration, u64) {
    let step = Arc::new(step);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(t, client)| {
            let (stop, done, errors) = (Arc::clone(&stop), Arc::clone(&done), Arc::clone(&errors));
            let step = Arc::clone(&step);
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let ok = step(&client, t, i);
                    i += 1;
                    if ok {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    (
        done.load(Ordering::Relaxed),
        started.elapsed(),
        errors.load(Ordering::Relaxed),
    )
}

/// p50 and p99 of appending a journal-sized record and fdatasync'ing it.
fn fsync_baseline(root: &Path, n: usize) -> Result<(Duration, Duration), String> {
    let path = root.join("fsync-probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("creating {}: {e}", path.display()))?;
    let rec = [b'x'; 160];
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&rec)
            .and_then(|()| f.sync_data())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        times.push(t.elapsed());
    }
    times.sort();
    let _ = std::fs::remove_file(&path);
    Ok((percentile(&times, 0.5), percentile(&times, 0.99)))
}

/// Sequential allocate and release timings (each call timed on its own).
fn round_trips(
    client: &Client,
    sets: &[RangeSet],
    network: &str,
    n: usize,
) -> Result<(Vec<Duration>, Vec<Duration>), String> {
    let (mut alloc, mut release) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + n / 10 {
        let cid = format!("c{i}");
        let t = Instant::now();
        client
            .allocate(&request(network, &cid, sets))
            .map_err(|e| format!("allocate: {e}"))?;
        let a = t.elapsed();
        let t = Instant::now();
        client
            .release(&key(network, &cid))
            .map_err(|e| format!("release: {e}"))?;
        let r = t.elapsed();
        // The first tenth warms up (store open, page cache).
        if i >= n / 10 {
            alloc.push(a);
            release.push(r);
        }
    }
    Ok((alloc, release))
}

/// exec `cnikit` as `ipamd`: ADD then DEL, each timed from spawn to exit.
fn plugin_round_trips(
    exe: &Path,
    sock: &Path,
    data: &Path,
    network: &str,
    n: usize,
) -> Result<(Vec<Duration>, Vec<Duration>), String> {
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": network,
        "type": "ipamd",
        "ipam": {"type": "ipamd", "subnet": "10.129.0.0/16", "dataDir": data, "socket": sock},
    })
    .to_string();
    let (mut add, mut del) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + n / 10 {
        let cid = format!("p{i}");
        let a = exec_plugin(exe, &conf, "ADD", &cid)?;
        let d = exec_plugin(exe, &conf, "DEL", &cid)?;
        if i >= n / 10 {
            add.push(a);
            del.push(d);
        }
    }
    Ok((add, del))
}

/// One exec of `cnikit` as the `ipamd` plugin with network config `conf`, timed from spawn
/// to exit; an error if it fails (its CNI error is on stdout).
fn exec_plugin(exe: &Path, conf: &str, cmd: &str, cid: &str) -> Result<Duration, String> {
    exec_plugin_answer(exe, conf, cmd, cid).map(|(took, _)| took)
}

/// [`exec_plugin`], with the plugin's answer (stdout).
fn exec_plugin_answer(
    exe: &Path,
    conf: &str,
    cmd: &str,
    cid: &str,
) -> Result<(Duration, String), String> {
    let t = Instant::now();
    let mut child = Command::new(exe)
        .arg0("ipamd")
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", "/var/run/netns/bench")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", exe.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("exec {}: {e}", exe.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(conf.as_bytes())
            .map_err(|e| format!("writing the config: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for the plugin: {e}"))?;
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("plugin {cmd} failed: {text}"));
    }
    Ok((took, text))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn report(what: &str, first: &[Duration], second: &[Duration]) {
    let mut a = first.to_vec();
    let mut b = second.to_vec();
    a.sort();
    b.sort();
    let mut pair: Vec<Duration> = first.iter().zip(second).map(|(x, y)| *x + *y).collect();
    pair.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{what} (n={}): allocate/ADD p50 {:.3} ms p99 {:.3} ms; release/DEL p50 {:.3} ms p99 {:.3} ms; both p50 {:.3} ms",
        a.len(),
        ms(percentile(&a, 0.5)),
        ms(percentile(&a, 0.99)),
        ms(percentile(&b, 0.5)),
        ms(percentile(&b, 0.99)),
        ms(percentile(&pair, 0.5)),
    );
}

/// A value of the daemon's /metrics (plain GET over the socket).
fn metric(sock: &Path, name: &str) -> Option<f64> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ipamd\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}
