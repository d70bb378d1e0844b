//! The churn loop: W workers, each doing create netns → ADD → DEL → delete
//! netns, pod after pod. Implementations take turns round by round (ABAB…),
//! so a noisy neighbour or thermal drift hits all of them alike; with
//! residents each setup runs its rounds alone, with and without them
//! (`resident::run`).

use crate::hosts::Hosts;
use crate::podns::PodNs;
use crate::sandbox::stopping;
use crate::setup::{Impl, Pod, Setup, Variant};
use indicatif::ProgressBar;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Everything measured for one (workers, variant, implementation).
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub workers: usize,
    pub variant: Variant,
    #[serde(rename = "implementation")]
    pub imp: Impl,
    /// The pods attached to the setup through these rounds (`--resident`).
    #[serde(skip_serializing_if = "is_zero")]
    pub residents: u32,
    /// Whole-chain latencies of the pods whose ADD succeeded, in ms.
    pub add_ms: Vec<f64>,
    pub del_ms: Vec<f64>,
    pub failures: usize,
    pub first_error: Option<String>,
    /// Wall time of this run's rounds (netns create/delete included).
    pub wall_s: f64,
}

impl Run {
    fn new(workers: usize, variant: Variant, imp: Impl) -> Run {
        Run {
            workers,
            variant,
            imp,
            residents: 0,
            add_ms: Vec::new(),
            del_ms: Vec::new(),
            failures: 0,
            first_error: None,
            wall_s: 0.0,
        }
    }

    /// Completed pods per second of wall time.
    pub fn pods_per_s(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.add_ms.len() as f64 / self.wall_s
        } else {
            0.0
        }
    }

    /// Adds `other`'s pods (a later round of the same setup) to this run.
    pub fn merge(&mut self, other: Run) {
        self.wall_s += other.wall_s;
        self.add_ms.extend(other.add_ms);
        self.del_ms.extend(other.del_ms);
        self.failures += other.failures;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn absorb(&mut self, samples: Vec<Sample>, wall: Duration) {
        self.wall_s += wall.as_secs_f64();
        for s in samples {
            match s.error {
                Some(e) => {
                    self.failures += 1;
                    self.first_error.get_or_insert(e);
                }
                None => {
                    self.add_ms.push(s.add_ms);
                    self.del_ms.push(s.del_ms);
                }
            }
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

struct Sample {
    add_ms: f64,
    del_ms: f64,
    error: Option<String>,
}

/// What to run.
pub struct Plan {
    pub workers: Vec<usize>,
    pub pods_per_worker: Box<dyn Fn(usize) -> usize>,
    pub rounds: usize,
    pub variants: Vec<Variant>,
    pub impls: Vec<Impl>,
}

impl Plan {
    /// The implementations compared in a variant; the floor is the kernel
    /// work of the NAT-free attach, so it belongs to the bare variant.
    pub fn impls_for(&self, variant: Variant) -> Vec<Impl> {
        self.impls
            .iter()
            .copied()
            .filter(|i| *i != Impl::Floor || variant == Variant::Bare)
            .collect()
    }

    pub fn total_pods(&self) -> u64 {
        let mut total = 0;
        for &w in &self.workers {
            for &v in &self.variants {
                total += (w * (self.pods_per_worker)(w) * self.impls_for(v).len()) as u64;
            }
        }
        total
    }
}

/// The setups, built once (bridges and rule chains persist across worker
/// counts); a setup that cannot even warm up is reported as failed.
pub type Setups = HashMap<(Variant, Impl), Result<Setup, String>>;

static POD: AtomicU64 = AtomicU64::new(0);

/// One untimed pod per setup: creates the bridge, IPAM state, rule chains.
pub fn warm_up(setups: &mut Setups, hosts: &Hosts) -> Result<(), String> {
    for (key, setup) in setups.iter_mut() {
        let _in = hosts.enter(*key)?;
        if let Ok(s) = setup {
            let sample = one_pod(s);
            if let Some(e) = sample.error {
                *setup = Err(e);
            }
        }
    }
    Ok(())
}

pub fn run_all(
    plan: &Plan,
    setups: &Setups,
    hosts: &Hosts,
    pb: &ProgressBar,
) -> Result<Vec<Run>, String> {
    let mut out = Vec::new();
    for &w in &plan.workers {
        for &variant in &plan.variants {
            if stopping() {
                return Ok(out);
            }
            let impls = plan.impls_for(variant);
            out.extend(run_variant(plan, setups, hosts, (w, variant, &impls), pb)?);
        }
    }
    Ok(out)
}

/// A round of one setup to run alone (for `--resident`, where each setup
/// has the machine to itself).
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub key: (Variant, Impl),
    /// Which of the plan's rounds (its share of each W's pods).
    pub round: usize,
    /// The pods attached to the setup meanwhile, for the runs' record.
    pub residents: u32,
}

/// Segment `seg` at every W, with no other setup's turns between them.
pub fn run_segment(
    plan: &Plan,
    setups: &Setups,
    hosts: &Hosts,
    seg: Segment,
    pb: &ProgressBar,
) -> Result<Vec<Run>, String> {
    let (variant, imp) = seg.key;
    let mut out = Vec::new();
    for &w in &plan.workers {
        if stopping() {
            break;
        }
        let mut run = Run::new(w, variant, imp);
        run.residents = seg.residents;
        let pods = round_pods(plan, w, seg.round);
        run_round_of(setups, hosts, &mut run, pods, pb)?;
        out.push(run);
    }
    Ok(out)
}

/// Each worker's pods in round `r` of the plan's rounds at W = `w`.
fn round_pods(plan: &Plan, w: usize, r: usize) -> usize {
    let n = (plan.pods_per_worker)(w);
    let rounds = plan.rounds.clamp(1, n.max(1));
    if r >= rounds {
        return 0;
    }
    n / rounds + usize::from(r < n % rounds)
}

/// The given implementations of one variant at W workers, interleaved by rounds.
fn run_variant(
    plan: &Plan,
    setups: &Setups,
    hosts: &Hosts,
    (w, variant, impls): (usize, Variant, &[Impl]),
    pb: &ProgressBar,
) -> Result<Vec<Run>, String> {
    let n = (plan.pods_per_worker)(w);
    let rounds = plan.rounds.clamp(1, n.max(1));
    let mut runs: Vec<Run> = impls.iter().map(|&i| Run::new(w, variant, i)).collect();
    for r in 0..rounds {
        let pods = round_pods(plan, w, r);
        for run in runs.iter_mut() {
            run_round_of(setups, hosts, run, pods, pb)?;
        }
    }
    Ok(runs)
}

/// One round of `pods` pods per worker for `run`'s setup, added to `run`.
fn run_round_of(
    setups: &Setups,
    hosts: &Hosts,
    run: &mut Run,
    pods: usize,
    pb: &ProgressBar,
) -> Result<(), String> {
    let (w, variant) = (run.workers, run.variant);
    pb.set_message(format!("W={w} {} {}", variant.name(), run.imp.name()));
    match setups.get(&(variant, run.imp)) {
        Some(Ok(s)) if !dead(run) && !stopping() => {
            // The workers inherit the host namespace of this thread.
            let _in = hosts.enter((variant, run.imp))?;
            let (samples, wall) = run_round(s, w, pods, pb);
            run.absorb(samples, wall);
        }
        Some(Err(e)) => {
            run.first_error.get_or_insert_with(|| e.clone());
            run.failures += w * pods;
            pb.inc((w * pods) as u64);
        }
        _ => pb.inc((w * pods) as u64),
    }
    Ok(())
}

/// Every pod so far failed: the failure is systematic (e.g. a feature the
/// plugin set lacks); do not spend the time budget on it.
fn dead(run: &Run) -> bool {
    run.failures > 0 && run.add_ms.is_empty()
}

fn run_round(
    setup: &Setup,
    workers: usize,
    pods: usize,
    pb: &ProgressBar,
) -> (Vec<Sample>, Duration) {
    let start = Instant::now();
    let samples = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| s.spawn(|| worker(setup, pods, pb)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    (samples, start.elapsed())
}

fn worker(setup: &Setup, pods: usize, pb: &ProgressBar) -> Vec<Sample> {
    let mut out = Vec::with_capacity(pods);
    for _ in 0..pods {
        if stopping() {
            break;
        }
        out.push(one_pod(setup));
        pb.inc(1);
    }
    out
}

/// Netns creation and deletion are outside the timed section: the runtime's
/// caller (containerd, CRI-O) does them, not the CNI chain.
fn one_pod(setup: &Setup) -> Sample {
    let n = POD.fetch_add(1, Ordering::Relaxed);
    let ns = match PodNs::create(&format!("p{n}")) {
        Ok(ns) => ns,
        Err(e) => return failed(format!("creating the pod netns: {e}")),
    };
    let path = ns.path_str();
    let t0 = Instant::now();
    let added = setup.add(Pod::Churn(n), &path);
    let t1 = Instant::now();
    // DEL also after a failed ADD, as the spec asks of runtimes.
    let deleted = setup.del(Pod::Churn(n), &path);
    let t2 = Instant::now();
    ns.delete();
    let error = match (added, deleted) {
        (Err(e), _) => Some(format!("ADD: {e}")),
        (Ok(()), Err(e)) => Some(format!("DEL: {e}")),
        (Ok(()), Ok(())) => None,
    };
    Sample {
        add_ms: ms(t1 - t0),
        del_ms: ms(t2 - t1),
        error,
    }
}

fn failed(error: String) -> Sample {
    Sample {
        add_ms: 0.0,
        del_ms: 0.0,
        error: Some(error),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
