//! `--resident N`: each setup's churn measured on a node without and with N
//! attachments (netns, veth on the bridge, IPAM lease, firewall entries for
//! 2 host ports each), in the same turn, so the growth between them is one
//! run's figure (see [`turn`]). The residents are checked to have left
//! nothing after each delete, before the next setup's come (see [`run`]).
//! Set up and torn down in parallel; that time is reported apart and is not
//! in the churn's figures.

pub mod growth;
pub mod settle;
mod state;

use crate::churn::{self, Plan, Run, Segment, Setups};
use crate::hosts::Hosts;
use crate::podns::PodNs;
use crate::sandbox::stopping;
use crate::setup::{Impl, Plugins, Pod, Setup, Variant, RESIDENT_PORT};
use crate::soak::check::{self, Check};
use crate::soak::sample;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// ADDs (and DELs) in flight while residents are set up (and torn down):
/// as many as the churn's usual W=8, enough to keep both CPUs busy.
pub const WORKERS: usize = 8;

/// How one setup's residents went.
#[derive(Debug, Serialize)]
pub struct Report {
    pub variant: Variant,
    #[serde(rename = "implementation")]
    pub imp: Impl,
    pub attached: usize,
    pub attach_failures: usize,
    pub attach_s: f64,
    pub detach_failures: usize,
    pub detach_s: f64,
    pub first_error: Option<String>,
    /// What the setup's host held with the residents attached…
    pub held: Vec<Check>,
    /// …and after their DEL (all 0 when clean).
    pub left: Vec<Check>,
}

/// The residents of one setup, until they are deleted.
pub struct Residents {
    key: (Variant, Impl),
    pods: Vec<(u32, PodNs)>,
    /// The setup, taken out of the churn when its residents did not all
    /// attach: churn figures on fewer residents than asked would mislead.
    own: Option<Setup>,
    report: Report,
}

impl Residents {
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// The residents' pods (index, netns), in the order they attached.
    pub fn pods(&self) -> &[(u32, PodNs)] {
        &self.pods
    }

    /// The residents' pods (index, netns), for their DEL.
    pub fn into_pods(self) -> Vec<(u32, PodNs)> {
        self.pods
    }
}

/// Everything `--resident` adds to the output.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub residents: u32,
    pub workers: usize,
    /// One per attach and delete of a setup's residents.
    pub setups: Vec<Report>,
    /// Waited for the machine to go quiet before rounds (see `turn`).
    pub settle_s: f64,
    pub portmap_markers_left: Check,
    pub firewall_records_left: Check,
    /// The daemon's firewall operations over the whole run, by op and
    /// outcome: `*-del-keys` are DELs that had prevResult and mappings.
    pub daemon_firewall_ops: Option<Vec<(String, String, u64)>>,
}

/// What every step of a setup's turn needs.
struct Turn<'a> {
    n: u32,
    plan: &'a Plan,
    hosts: &'a Hosts,
    plugins: &'a Plugins,
    pb: &'a indicatif::ProgressBar,
    quiet: bool,
}

/// Each setup in turn with the machine to itself, measured without and with
/// its `n` residents (see [`turn`]); then the next setup. Network namespaces
/// belong to the machine, not to a host netns: with every setup's residents
/// at once the machine would hold `n` pod netns per setup, and the kernel's
/// per-netns work (each churned pod's dying netns is looked up in every
/// other one: `cleanup_net` → `idr_for_each`, 8 % of all CPU with five
/// setups' residents) would make each setup's node one of `n` × setups pods.
pub fn run(
    n: u32,
    plan: &Plan,
    setups: &mut Setups,
    hosts: &Hosts,
    plugins: &Plugins,
    pb: &indicatif::ProgressBar,
    quiet: bool,
) -> Result<(Vec<Run>, Summary), String> {
    let mut keys: Vec<_> = setups.keys().copied().collect();
    // In the table's order: full first, then the implementations as declared.
    keys.sort_by_key(|&(v, i)| (v as u8, i as u8));
    let cx = Turn {
        n,
        plan,
        hosts,
        plugins,
        pb,
        quiet,
    };
    let (mut runs, mut reports, mut settle_s) = (Vec::new(), Vec::new(), 0.0);
    for key in keys {
        if stopping() {
            break;
        }
        let (key_runs, key_reports, waited) = turn(&cx, key, setups)?;
        runs.extend(merge_rounds(key_runs));
        reports.extend(key_reports);
        settle_s += waited;
    }
    runs.sort_by_key(|r| {
        let w = plan.workers.iter().position(|&w| w == r.workers);
        (r.residents, w, r.variant as u8, r.imp as u8)
    });
    let summary = Summary {
        residents: n,
        workers: WORKERS,
        setups: reports,
        settle_s,
        // Shared by all cnikit setups (one /run), so checked once, at the end.
        portmap_markers_left: check::check(
            "portmap markers",
            check::dir_entries(Path::new("/run/cnikit/portmap")),
        ),
        firewall_records_left: check::check("firewall records", check::firewall_records()),
        daemon_firewall_ops: sample::firewall_ops(),
    };
    Ok((runs, summary))
}

/// One setup's rounds, each once without residents and once with them, in
/// mirrored pairs: 0 N, N 0, 0 N… So the baseline is measured by the same
/// method in the same turn, and a drift over the turn (the machine warming,
/// a neighbour) weighs on both alike. The residents are attached at each
/// 0 → N and deleted at each N → 0: once per two rounds. Before each round the
/// machine is let go quiet ([`settle::until_quiet`]). Returns the runs, the
/// residents' reports and the seconds spent settling.
fn turn(
    cx: &Turn,
    key: (Variant, Impl),
    setups: &mut Setups,
) -> Result<(Vec<Run>, Vec<Report>, f64), String> {
    let (mut runs, mut reports, mut waited) = (Vec::new(), Vec::new(), 0.0);
    let mut attached: Option<Residents> = None;
    for (round, with) in order(cx.plan.rounds.max(1)) {
        if stopping() {
            break;
        }
        if with && attached.is_none() {
            // A setup whose residents did not all attach is an error by now:
            // its rounds count as failed, as for any broken setup.
            let a = cx.pb.suspend(|| attach_setup(cx, key, setups))?;
            let Some(a) = a else { break };
            attached = Some(a);
        }
        if !with {
            if let Some(a) = attached.take() {
                reports.push(cx.pb.suspend(|| detach_setup(cx, a, setups))?);
            }
        }
        waited += settle::until_quiet().as_secs_f64();
        let residents = if with { cx.n } else { 0 };
        let seg = Segment {
            key,
            round,
            residents,
        };
        runs.extend(churn::run_segment(cx.plan, setups, cx.hosts, seg, cx.pb)?);
    }
    if let Some(a) = attached.take() {
        reports.push(cx.pb.suspend(|| detach_setup(cx, a, setups))?);
    }
    Ok((runs, reports, waited))
}

/// The (round, with residents) sequence of a turn: 0 N, N 0, 0 N…
fn order(rounds: usize) -> Vec<(usize, bool)> {
    (0..rounds)
        .flat_map(|r| {
            let first = r % 2 == 1;
            [(r, first), (r, !first)]
        })
        .collect()
}

/// A setup's rounds as one run per (W, residents).
fn merge_rounds(runs: Vec<Run>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for run in runs {
        match out
            .iter_mut()
            .find(|o| o.workers == run.workers && o.residents == run.residents)
        {
            Some(o) => o.merge(run),
            None => out.push(run),
        }
    }
    out
}

/// Attach `n` residents to setup `key` in its host (None: no working setup).
fn attach_setup(
    cx: &Turn,
    key: (Variant, Impl),
    setups: &mut Setups,
) -> Result<Option<Residents>, String> {
    let (n, plugins, quiet) = (cx.n, cx.plugins, cx.quiet);
    let _in = cx.hosts.enter(key)?;
    let Some(Ok(setup)) = setups.get(&key) else {
        return Ok(None);
    };
    let pb = crate::progress(u64::from(n), quiet, "residents");
    pb.set_message(format!("attaching: {} {}", key.0.name(), key.1.name()));
    let mut r = attach(setup, key, n, &pb);
    pb.finish_and_clear();
    r.report.held = state::read(key, plugins);
    if r.report.attach_failures > 0 {
        let why = format!(
            "{} of {n} residents failed to attach: {}",
            r.report.attach_failures,
            r.report.first_error.as_deref().unwrap_or("")
        );
        r.own = setups.insert(key, Err(why)).and_then(Result::ok);
    }
    Ok(Some(r))
}

/// Attach `n` residents to `setup`, [`WORKERS`] at a time, in the calling
/// thread's host (also used by `cnikit-bench repair`).
pub fn attach(
    setup: &Setup,
    key: (Variant, Impl),
    n: u32,
    pb: &indicatif::ProgressBar,
) -> Residents {
    let next = AtomicU32::new(0);
    let pods = Mutex::new(Vec::with_capacity(n as usize));
    let errors = Mutex::new(Vec::new());
    let prefix = state::netns_prefix(key);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || stopping() {
                    break;
                }
                match PodNs::create(&format!("{prefix}{i}")) {
                    Ok(ns) => {
                        let added = setup.add(Pod::Resident(i), &ns.path_str());
                        // Kept also after a failed ADD: DEL comes at the end, as for all.
                        lock(&pods).push((i, ns));
                        if let Err(e) = added {
                            lock(&errors).push(format!("resident {i} ADD: {e}"));
                        }
                    }
                    Err(e) => lock(&errors).push(format!("resident {i} netns: {e}")),
                }
                pb.inc(1);
            });
        }
    });
    let attach_s = start.elapsed().as_secs_f64();
    let pods = pods.into_inner().unwrap_or_else(|e| e.into_inner());
    let errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
    Residents {
        key,
        report: Report {
            variant: key.0,
            imp: key.1,
            attached: pods.len().saturating_sub(errors.len()),
            attach_failures: errors.len(),
            attach_s,
            detach_failures: 0,
            detach_s: 0.0,
            first_error: errors.into_iter().next(),
            held: Vec::new(),
            left: Vec::new(),
        },
        pods,
        own: None,
    }
}

/// DEL every resident of one setup (as the runtime does: the same
/// capability args, the cached result as prevResult), delete its netns, then
/// read back what is left. Call while the daemon still runs: its leases are
/// read from it.
fn detach_setup(cx: &Turn, mut r: Residents, setups: &Setups) -> Result<Report, String> {
    let (plugins, quiet) = (cx.plugins, cx.quiet);
    let _in = cx.hosts.enter(r.key)?;
    let setup = match (&r.own, setups.get(&r.key)) {
        (Some(own), _) => own,
        (None, Some(Ok(s))) => s,
        _ => return Err(format!("no setup for {:?}", r.key)),
    };
    let pb = crate::progress(r.pods.len() as u64, quiet, "residents");
    pb.set_message(format!("deleting: {} {}", r.key.0.name(), r.key.1.name()));
    let pods = std::mem::take(&mut r.pods);
    let start = Instant::now();
    let errors = detach(setup, pods, &pb);
    r.report.detach_s = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    r.report.detach_failures = errors.len();
    if r.report.first_error.is_none() {
        r.report.first_error = errors.into_iter().next();
    }
    r.report.left = state::read(r.key, plugins);
    Ok(r.report)
}

/// DEL and delete `pods`, [`WORKERS`] at a time; the errors.
pub fn detach(setup: &Setup, pods: Vec<(u32, PodNs)>, pb: &indicatif::ProgressBar) -> Vec<String> {
    let queue = Mutex::new(pods);
    let errors = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                // Not stopped by Ctrl-C: leaving residents behind would only
                // make the leftover counts lie (the sandbox goes anyway).
                let Some((i, ns)) = lock(&queue).pop() else {
                    break;
                };
                if let Err(e) = setup.del(Pod::Resident(i), &ns.path_str()) {
                    lock(&errors).push(format!("resident {i} DEL: {e}"));
                }
                ns.delete();
                pb.inc(1);
            });
        }
    });
    errors.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The block printed under the churn table.
pub fn text(s: &Summary) -> String {
    let mut t = String::new();
    let last = RESIDENT_PORT + 2 * s.residents.max(1) - 1;
    let _ = writeln!(
        t,
        "\nresidents: {} per setup, 2 host ports each ({RESIDENT_PORT}-{last}); the setups one after \
         another, each on a host netns of its own with only its own residents on the machine; \
         each round without and with them (0 N, N 0, …), attached and deleted between rounds, \
         {} at a time (not in the figures above); {:.1} s waited for a quiet machine before rounds",
        s.residents, s.workers, s.settle_s
    );
    let _ = writeln!(
        t,
        "{:<5} {:<13} {:>8} {:>7} {:>8} {:>4} | held with the residents → left after their DEL",
        "var", "impl", "attach s", "pods/s", "detach s", "fail"
    );
    for r in &s.setups {
        let rate = if r.attach_s > 0.0 {
            r.attached as f64 / r.attach_s
        } else {
            0.0
        };
        let _ = writeln!(
            t,
            "{:<5} {:<13} {:>8.1} {:>7.1} {:>8.1} {:>4} | {} → {}",
            r.variant.name(),
            r.imp.name(),
            r.attach_s,
            rate,
            r.detach_s,
            r.attach_failures + r.detach_failures,
            counts(&r.held),
            left(&r.left)
        );
        if let Some(e) = &r.first_error {
            let _ = writeln!(t, "      first error: {e}");
        }
    }
    let _ = writeln!(
        t,
        "portmap markers: {}",
        left(std::slice::from_ref(&s.portmap_markers_left))
    );
    let _ = writeln!(
        t,
        "firewall records: {}",
        left(std::slice::from_ref(&s.firewall_records_left))
    );
    if let Some(ops) = &s.daemon_firewall_ops {
        let list: Vec<String> = ops
            .iter()
            .map(|(op, outcome, n)| format!("{op} {outcome} {n}"))
            .collect();
        let _ = writeln!(t, "daemon firewall ops (whole run): {}", list.join(", "));
    }
    t
}

fn counts(checks: &[Check]) -> String {
    let parts: Vec<String> = checks
        .iter()
        .map(|c| match c.found {
            Some(n) => format!("{} {n}", c.what),
            None => format!("{} ? ({})", c.what, c.detail),
        })
        .collect();
    parts.join(", ")
}

fn left(checks: &[Check]) -> String {
    let dirty: Vec<&Check> = checks.iter().filter(|c| !c.clean()).collect();
    if dirty.is_empty() {
        return "none left".into();
    }
    let parts: Vec<String> = dirty
        .iter()
        .map(|c| match c.found {
            Some(n) => format!("{} {n} ({})", c.what, c.detail),
            None => format!("{} ? ({})", c.what, c.detail),
        })
        .collect();
    format!("LEFT: {}", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::order;

    #[test]
    fn rounds_run_in_mirrored_pairs() {
        let seq = order(3);
        let want = [
            (0, false),
            (0, true),
            (1, true),
            (1, false),
            (2, false),
            (2, true),
        ];
        assert_eq!(seq, want);
    }
}
