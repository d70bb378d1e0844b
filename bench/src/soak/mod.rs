//! Soak: many ADD/DEL cycles of the full chain (bridge ipMasq + ipamd +
//! portmap) with the daemon, W workers, the daemon restarted every N
//! completed cycles, SIGTERM and SIGKILL in turn, while the workers go on.
//! The main thread samples the daemon once a second and restarts it; at the
//! end everything a pod ever had must be gone (check.rs). See bench/README.md
//! "Soak".

pub(crate) mod check;
mod plot;
mod report;
pub(crate) mod sample;
mod trend;

use crate::daemon;
use crate::podns::PodNs;
use crate::sandbox::stopping;
use crate::setup::{conflist, Impl, Plugins, Pod, Setup, Variant};
use indicatif::ProgressBar;
use sample::Sample;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct SoakArgs {
    /// ADD/DEL cycles in all.
    #[arg(long, default_value_t = 10_000)]
    pub cycles: u64,
    /// Workers running cycles in parallel.
    #[arg(long, default_value_t = 32)]
    pub workers: usize,
    /// Restart the daemon after every N completed cycles (0: never);
    /// SIGTERM and SIGKILL take turns, SIGTERM first.
    #[arg(long, default_value_t = 1000)]
    pub restart_every: u64,
    /// Keep the daemon down this long at each restart, so that plugin calls
    /// run in-process for a while (and some still do when the new daemon
    /// starts serving); 0: restart at once.
    #[arg(long, default_value_t = 0)]
    pub down_ms: u64,
    /// Retries of a failed DEL, as a runtime re-issues it (each failed
    /// attempt is still counted as a failure).
    #[arg(long, default_value_t = 3)]
    pub del_retries: u32,
    /// Leave this cycle's pod attached (no DEL, netns kept), as a runtime
    /// that died would: shows that the leak checks see what a pod leaves.
    #[arg(long)]
    pub abandon: Option<u64>,
    /// Where soak.csv, restarts.csv, failures.txt, summary.{txt,json},
    /// soak.svg, soak.png and daemon.log go.
    #[arg(long, default_value = "soak-results")]
    pub out: PathBuf,
    /// The cnikit binary [default: `cnikit` next to this program]
    #[arg(long)]
    pub cnikit: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// One failed operation of a cycle.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub t_s: f64,
    pub cycle: u64,
    /// "netns", "ADD" or "DEL".
    pub op: &'static str,
    /// 0 for the first DEL, then its retries.
    pub attempt: u32,
    pub error: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Restart {
    /// When the signal was sent, seconds since the start.
    pub t_s: f64,
    pub cycles: u64,
    pub signal: &'static str,
    pub old_pid: Option<u32>,
    pub new_pid: Option<u32>,
    /// Signal to the old daemon reaped.
    pub exit_ms: f64,
    /// Signal to the new daemon accepting: no daemon for the plugins.
    pub down_ms: f64,
    pub status: String,
    /// What the old instance had answered at its last scrape, just before
    /// the signal.
    pub ipam_served: Option<u64>,
    pub fw_served: Option<u64>,
}

struct Shared {
    start: Instant,
    next: AtomicU64,
    done: AtomicU64,
    running: AtomicUsize,
    failures: Mutex<Vec<Failure>>,
    times: Mutex<Vec<trend::CycleTime>>,
}

impl Shared {
    fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn fail(&self, cycle: u64, op: &'static str, attempt: u32, error: String) {
        let f = Failure {
            t_s: self.t(),
            cycle,
            op,
            attempt,
            error,
        };
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(f);
    }

    fn failure_count(&self) -> u64 {
        self.failures.lock().map_or(0, |f| f.len() as u64)
    }
}

/// Runs the soak inside the sandbox (already entered); Ok(true) when no
/// cycle failed and nothing leaked.
pub fn run(args: &SoakArgs, plugins: &Plugins, out: &Path) -> Result<bool, String> {
    let list = conflist(Variant::Full, Impl::CnikitDaemon);
    let network = list["name"].as_str().unwrap_or_default().to_string();
    let bridge = list["plugins"][0]["bridge"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let store = Path::new(daemon::DATA_DIR).join(&network);
    let log = out.join("daemon.log");
    // A fresh log per soak: the daemon appends across its restarts.
    let _ = std::fs::remove_file(&log);
    // From this (the main) thread: the daemon dies with the thread that
    // started it, and the main thread does every restart too.
    daemon::start(&plugins.cnikit_bin, Some(&log), &[])?;
    let setup = Setup::new(Variant::Full, Impl::CnikitDaemon, plugins)?;
    let sh = Shared {
        start: Instant::now(),
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        running: AtomicUsize::new(args.workers.max(1)),
        failures: Mutex::new(Vec::new()),
        times: Mutex::new(Vec::with_capacity(args.cycles as usize)),
    };
    let pb = crate::progress(args.cycles, args.quiet, "cycles");
    let (mut samples, restarts) = std::thread::scope(|s| {
        for _ in 0..args.workers.max(1) {
            s.spawn(|| worker(&setup, &sh, args, &pb));
        }
        monitor(args, &sh, &store, &pb)
    });
    let duration = sh.t();
    samples.push(sample::take(
        duration,
        sh.done.load(Ordering::SeqCst),
        sh.failure_count(),
        &store,
    ));
    pb.finish_and_clear();

    let mut checks = vec![check::leases_from_daemon(&plugins.cnikit_bin, &network)];
    let nft_rules = check::nft_rules();
    let final_status = daemon::stop();
    checks.extend(check::after_stop(&plugins.cnikit_bin, &network, &bridge));

    let failures = sh.failures.into_inner().unwrap_or_else(|e| e.into_inner());
    let times = sh.times.into_inner().unwrap_or_else(|e| e.into_inner());
    let windows = trend::windows(&times);
    let r = report::Report {
        args,
        cnikit: &plugins.cnikit_bin,
        interrupted: stopping(),
        duration_s: duration,
        cycles_done: sh.done.load(Ordering::SeqCst),
        samples: &samples,
        restarts: &restarts,
        failures: &failures,
        windows: &windows,
        checks: &checks,
        nft_rules,
        final_status,
        daemon_log: std::fs::read_to_string(&log).unwrap_or_default(),
    };
    r.write(out)?;
    Ok(r.clean())
}

fn worker(setup: &Setup, sh: &Shared, args: &SoakArgs, pb: &ProgressBar) {
    while !stopping() {
        let n = sh.next.fetch_add(1, Ordering::Relaxed);
        if n >= args.cycles {
            break;
        }
        let took = if args.abandon == Some(n) {
            abandon(setup, n, sh);
            None
        } else {
            cycle(setup, n, args.del_retries, sh)
        };
        let done = sh.done.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((add_ms, del_ms)) = took {
            let t = trend::CycleTime {
                done,
                add_ms,
                del_ms,
            };
            sh.times.lock().unwrap_or_else(|e| e.into_inner()).push(t);
        }
        pb.inc(1);
    }
    sh.running.fetch_sub(1, Ordering::SeqCst);
}

/// create netns → ADD → DEL → delete netns, every failure recorded; returns
/// how long the ADD and the DELs took (ms), None when no netns was made.
fn cycle(setup: &Setup, n: u64, del_retries: u32, sh: &Shared) -> Option<(f32, f32)> {
    let ns = match PodNs::create(&format!("s{n}")) {
        Ok(ns) => ns,
        Err(e) => {
            sh.fail(n, "netns", 0, e);
            return None;
        }
    };
    let path = ns.path_str();
    let ms = |t: Instant| (t.elapsed().as_secs_f64() * 1000.0) as f32;
    let t0 = Instant::now();
    if let Err(e) = setup.add(Pod::Churn(n), &path) {
        sh.fail(n, "ADD", 0, e);
    }
    let add_ms = ms(t0);
    let t1 = Instant::now();
    // DEL also after a failed ADD, as the spec asks of runtimes; a failed
    // DEL is retried as a runtime retries a sandbox teardown, and what a DEL
    // that never succeeded left behind shows up in the leak checks.
    for attempt in 0..=del_retries {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(100 << attempt.min(6)));
        }
        match setup.del(Pod::Churn(n), &path) {
            Ok(()) => break,
            Err(e) => sh.fail(n, "DEL", attempt, e),
        }
    }
    let del_ms = ms(t1);
    ns.delete();
    Some((add_ms, del_ms))
}

fn abandon(setup: &Setup, n: u64, sh: &Shared) {
    match PodNs::create(&format!("s{n}")) {
        Ok(ns) => {
            if let Err(e) = setup.add(Pod::Churn(n), &ns.path_str()) {
                sh.fail(n, "ADD", 0, e);
            }
        }
        Err(e) => sh.fail(n, "netns", 0, e),
    }
}

/// On the main thread until the workers are done: a sample a second, and
/// the restarts.
fn monitor(
    args: &SoakArgs,
    sh: &Shared,
    store: &Path,
    pb: &ProgressBar,
) -> (Vec<Sample>, Vec<Restart>) {
    let mut samples = Vec::new();
    let mut restarts: Vec<Restart> = Vec::new();
    let mut next_restart = args.restart_every;
    let mut next_sample = Instant::now();
    let take = || {
        sample::take(
            sh.t(),
            sh.done.load(Ordering::SeqCst),
            sh.failure_count(),
            store,
        )
    };
    while sh.running.load(Ordering::SeqCst) > 0 {
        let done = sh.done.load(Ordering::SeqCst);
        // None at the very end: restarting then would only test the final
        // stop, which the leak checks do anyway.
        if args.restart_every > 0 && done >= next_restart && next_restart < args.cycles {
            let last = take();
            let kill = restarts.len() % 2 == 1;
            let pause = Duration::from_millis(args.down_ms);
            restarts.push(restart(sh, &last, kill, pause));
            samples.push(last);
            next_restart += args.restart_every;
        }
        if Instant::now() >= next_sample {
            samples.push(take());
            next_sample = (next_sample + Duration::from_secs(1)).max(Instant::now());
            let kills = restarts.iter().filter(|r| r.signal == "SIGKILL").count();
            pb.set_message(format!(
                "restarts {} ({kills} SIGKILL), failures {}",
                restarts.len(),
                sh.failure_count()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (samples, restarts)
}

fn restart(sh: &Shared, last: &Sample, kill: bool, pause: Duration) -> Restart {
    let (signal, name) = if kill {
        (libc::SIGKILL, "SIGKILL")
    } else {
        (libc::SIGTERM, "SIGTERM")
    };
    let t_s = sh.t();
    let cycles = sh.done.load(Ordering::SeqCst);
    let mut r = Restart {
        t_s,
        cycles,
        signal: name,
        old_pid: last.daemon.as_ref().map(|d| d.pid),
        new_pid: None,
        exit_ms: 0.0,
        down_ms: 0.0,
        status: String::new(),
        ipam_served: last.metrics().map(|m| m.ipam),
        fw_served: last.metrics().map(|m| m.fw),
    };
    match daemon::restart(signal, pause) {
        Ok(x) => {
            r.new_pid = Some(x.new_pid);
            r.exit_ms = x.exit.as_secs_f64() * 1000.0;
            r.down_ms = x.down.as_secs_f64() * 1000.0;
            r.status = x.status;
        }
        // Reported, and the soak goes on: the plugins work without a daemon.
        Err(e) => r.status = format!("restart failed: {e}"),
    }
    r
}
