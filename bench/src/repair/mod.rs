//! `cnikit-bench repair`: how long a node with N resident pods (the full
//! chain, each pod with host ports) goes without its firewall after
//! `nft flush ruleset`, until cnikit has put it back. With the daemon, its
//! watch repairs on its own; without it, `cnikit firewall restore` does, and
//! beside it the floor: `nft -f` of the very ruleset that was flushed, one
//! batch of the same objects with nothing to read or decide first.
//!
//! Each setup gets a node of its own (a host netns, as `--resident` makes
//! them) and its turn: its residents are attached, it is flushed `--repeat`
//! times, then its residents are deleted before the next setup's come.

mod events;
mod measure;
mod probe;
pub mod report;
mod ruleset;

use crate::hosts::Hosts;
use crate::resident::{self, settle, Residents};
use crate::sandbox::{stopping, STATE};
use crate::setup::{Impl, Plugins, Setup, Variant, BRIDGE_MAX_PORTS, MAX_RESIDENTS};
use crate::{daemon, progress};
use report::{Rep, Series};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct RepairArgs {
    /// Resident pods per setup, 2 host ports each.
    #[arg(long, default_value_t = 1000)]
    pub resident: u32,
    /// Flushes per setup (and floor loads); the table shows the median.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Residents with a listener whose host port is probed after each flush.
    #[arg(long, default_value_t = 10)]
    pub sample: u32,
    /// cnikit-daemon (the daemon's watch repairs) and/or cnikit (`cnikit
    /// firewall restore`, and the floor beside it).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "cnikit-daemon,cnikit"
    )]
    pub impls: Vec<Impl>,
    /// Where table.txt, repair.json and daemon.log go.
    #[arg(long, default_value = "repair-results")]
    pub out: PathBuf,
    /// The cnikit binary [default: `cnikit` next to this program]
    #[arg(long)]
    #[serde(skip)]
    pub cnikit: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub settings: RepairArgs,
    pub nodes: Vec<NodeReport>,
    pub series: Vec<Series>,
}

/// One setup's node: its residents and its ruleset with them.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    #[serde(rename = "implementation")]
    pub imp: Impl,
    pub attached: usize,
    pub attach_s: f64,
    pub ruleset: Option<ruleset::Counts>,
    /// Times the benchmark's own event socket overran (a commit it may
    /// have missed shows as a missing figure).
    pub events_lost: u32,
    pub error: Option<String>,
}

pub fn check(args: &RepairArgs) -> Result<(), String> {
    let max = MAX_RESIDENTS.min(BRIDGE_MAX_PORTS as u32);
    if args.resident == 0 || args.resident > max {
        return Err(format!("--resident: 1 to {max} (one bridge per node)"));
    }
    if let Some(i) = args
        .impls
        .iter()
        .find(|i| !matches!(i, Impl::Cnikit | Impl::CnikitDaemon))
    {
        return Err(format!(
            "--impls: cnikit-daemon or cnikit, not {}",
            i.name()
        ));
    }
    Ok(())
}

/// Every setup in turn on its node; call inside the sandbox.
pub fn run(args: &RepairArgs, plugins: &Plugins, out: &Path) -> Result<Summary, String> {
    let keys: Vec<(Variant, Impl)> = args.impls.iter().map(|&i| (Variant::Full, i)).collect();
    let hosts = Hosts::isolated(&keys)?;
    let (mut nodes, mut series) = (Vec::new(), Vec::new());
    for key in keys {
        if stopping() {
            break;
        }
        let _in = hosts.enter(key)?;
        let (node, s) = node_turn(args, plugins, out, key.1)?;
        nodes.push(node);
        series.extend(s);
    }
    Ok(Summary {
        settings: args.clone(),
        nodes,
        series,
    })
}

/// Attach, measure, delete: one setup on the node the caller is in.
fn node_turn(
    args: &RepairArgs,
    plugins: &Plugins,
    out: &Path,
    imp: Impl,
) -> Result<(NodeReport, Vec<Series>), String> {
    let log = out.join("daemon.log");
    if imp == Impl::CnikitDaemon {
        // Info: the level of the daemon's line about each repair.
        let _ = std::fs::remove_file(&log);
        daemon::start_at(&plugins.cnikit_bin, Some(&log), "info", &[])?;
    }
    let key = (Variant::Full, imp);
    let setup = Setup::new(key.0, imp, plugins)?;
    let pb = progress(u64::from(args.resident), args.quiet, "residents");
    pb.set_message(format!("attaching: {}", imp.name()));
    let residents = resident::attach(&setup, key, args.resident, &pb);
    pb.finish_and_clear();
    let r = residents.report();
    let mut node = NodeReport {
        imp,
        attached: r.attached,
        attach_s: r.attach_s,
        ruleset: None,
        events_lost: 0,
        error: None,
    };
    let measured = match r.attach_failures {
        0 => measure_node(args, plugins, &residents, &log, &mut node),
        n => Err(format!(
            "{n} residents failed to attach, the first: {}",
            r.first_error.as_deref().unwrap_or("?")
        )),
    };
    let pb = progress(u64::from(args.resident), args.quiet, "residents");
    pb.set_message(format!("deleting: {}", imp.name()));
    resident::detach(&setup, residents.into_pods(), &pb);
    pb.finish_and_clear();
    // Its leases were needed for the DELs; the next node has no use for it.
    daemon::stop();
    settle::until_quiet();
    // Shown with the node, and the next setup still runs.
    let series = measured.unwrap_or_else(|e| {
        node.error = Some(e);
        Vec::new()
    });
    Ok((node, series))
}

/// The flushes of one node, each after the machine went quiet.
fn measure_node(
    args: &RepairArgs,
    plugins: &Plugins,
    residents: &Residents,
    log: &Path,
    report: &mut NodeReport,
) -> Result<Vec<Series>, String> {
    let mut node = prepare(args, residents)?;
    report.ruleset = Some(node.before);
    let saved = PathBuf::from(STATE).join("ruleset.nft");
    if report.imp == Impl::CnikitDaemon {
        // The daemon's own watch listens anyway: ours adds a copy of each
        // notification, not their making.
        node.watch = Some(events::Watch::start()?);
        let mut daemon = series(report::DAEMON);
        for i in 0..args.repeat {
            settle::until_quiet();
            push(&mut daemon, measure::daemon_repair(&node, log)?, i, args);
        }
        report.events_lost = node.watch.as_ref().map_or(0, events::Watch::lost);
        return Ok(vec![daemon]);
    }
    ruleset::save(&saved)?;
    let mut all: Vec<Series> = OTHERS.iter().map(|&n| series(n)).collect();
    for i in 0..args.repeat {
        for (j, s) in all.iter_mut().enumerate() {
            if stopping() {
                break;
            }
            // Every other series with a listener of ours, to show its cost.
            node.watch = if j % 2 == 1 {
                Some(events::Watch::start()?)
            } else {
                None
            };
            settle::until_quiet();
            let rep = match j / 2 {
                0 => measure::restore(&node, &plugins.cnikit_bin)?,
                _ => measure::floor(&node, &saved)?,
            };
            push(s, rep, i, args);
            report.events_lost += node.watch.take().map_or(0, |w| w.lost());
        }
    }
    Ok(all)
}

/// The series of the node without the daemon, in the order they run.
const OTHERS: [&str; 4] = [
    report::RESTORE,
    report::RESTORE_LISTENED,
    report::FLOOR,
    report::FLOOR_LISTENED,
];

fn series(name: &'static str) -> Series {
    Series {
        name,
        reps: Vec::new(),
    }
}

/// Listen for commits, put listeners in the sampled pods, and check that
/// all of them answer before anything is flushed: a probe that never
/// worked would otherwise read as a slow repair.
fn prepare(args: &RepairArgs, residents: &Residents) -> Result<measure::Node, String> {
    let pods = residents.pods();
    let picked: Vec<(u32, &crate::podns::PodNs)> = probe::spread(args.resident, args.sample)
        .into_iter()
        .filter_map(|i| pods.iter().find(|(j, _)| *j == i).map(|(j, ns)| (*j, ns)))
        .collect();
    let sample = probe::Sample::listen(&picked)?;
    let answering = sample.answering();
    if answering != sample.host_ports.len() {
        return Err(format!(
            "before any flush only {answering} of {} sampled host ports answer",
            sample.host_ports.len()
        ));
    }
    let before = ruleset::Counts::read()?;
    Ok(measure::Node {
        watch: None,
        sample,
        before,
    })
}

fn push(s: &mut Series, rep: Rep, i: usize, args: &RepairArgs) {
    if !args.quiet {
        let f = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.1}"));
        eprintln!(
            "{} #{}: committed {} ms, ports answer {} ms, own {} ms, {} changes{}",
            s.name,
            i + 1,
            f(rep.commit_ms),
            f(rep.answer_ms),
            f(rep.own_ms),
            rep.changes.map_or("?".into(), |c| c.to_string()),
            if rep.whole { "" } else { ", NOT WHOLE" }
        );
    }
    s.reps.push(rep);
}

/// The block printed and written to table.txt.
pub fn text(s: &Summary) -> String {
    let mut t = format!(
        "repair after `nft flush ruleset`, full chain (bridge ipMasq + ipamd + portmap), {} residents with 2 host ports each:\n",
        s.settings.resident
    );
    for n in &s.nodes {
        let rules = n.ruleset.map_or("?".into(), |c| c.text());
        t.push_str(&format!(
            "  {:<13} {} attached in {:.1} s; ruleset: {rules}; events lost {}\n",
            n.imp.name(),
            n.attached,
            n.attach_s,
            n.events_lost
        ));
        if let Some(e) = &n.error {
            t.push_str(&format!("    error: {e}\n"));
        }
    }
    t.push('\n');
    t + &report::table(&s.series, s.settings.sample as usize)
}
