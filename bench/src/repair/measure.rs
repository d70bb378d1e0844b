//! One flush of a node's ruleset and how it came back: by the daemon's
//! watch, by `cnikit firewall restore`, or (the floor) by `nft -f` of the
//! ruleset saved before the flush. Runs on the main thread, which is in the
//! node's network namespace, as are the threads and processes it starts.

use super::events::Watch;
use super::probe::Sample;
use super::report::{self, Rep};
use super::ruleset::{self, Counts};
use crate::daemon;
use std::path::Path;
use std::time::{Duration, Instant};

/// Longest wait for any one step: a repair takes well under a second.
const WAIT: Duration = Duration::from_secs(30);

/// What every flush on one node compares against.
pub struct Node {
    /// Only while a series listens: with a listener for nftables events the
    /// kernel builds a notification per change of every batch after making
    /// it visible, and a batch's commit returns only after that.
    pub watch: Option<Watch>,
    pub sample: Sample,
    /// The ruleset with every resident attached.
    pub before: Counts,
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1e3
}

/// `nft flush ruleset` and the daemon's repair: timed from the flush's
/// commit (when the daemon's watch hears of it) to the repair's commit, and
/// until every sampled host port answers.
pub fn daemon_repair(node: &Node, log: &Path) -> Result<Rep, String> {
    let offset = std::fs::metadata(log).map_or(0, |m| m.len());
    let flush = ruleset::nft(&["flush", "ruleset"])?;
    let watch = node.watch.as_ref().ok_or("the daemon's node listens")?;
    // Missed (the kernel dropped events): its exit is a few µs later.
    let flushed = watch
        .commit_of(flush.pid, flush.started, WAIT)
        .unwrap_or(flush.exited);
    let answered = node.sample.until_all_answer(WAIT)?;
    let pid = daemon::pid().ok_or("the daemon is not running")?;
    let committed = watch.commit_of(pid, flushed, WAIT);
    let logged = wait_logged(log, offset, flush.pid)?;
    Ok(Rep {
        commit_ms: committed.map(|c| ms(flushed, c)),
        answer_ms: Some(ms(flushed, answered)),
        own_ms: Some(logged.ms as f64),
        changes: Some(logged.changes),
        restored: Some(logged.restored),
        attachments: Some(logged.attachments),
        whole: Counts::read()? == node.before,
    })
}

/// The daemon's log line about the repair after `pid`'s change, written
/// after `offset`.
fn wait_logged(log: &Path, offset: u64, pid: u32) -> Result<report::Logged, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let new = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default());
        if let Some(l) = report::logged_repair(&new, pid) {
            return Ok(l);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the daemon logged no repair after process {pid}'s flush (see {})",
                log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `nft flush ruleset`, then `cnikit firewall restore --json`, timed from
/// its start to its commit and exit, and until the sampled ports answer.
pub fn restore(node: &Node, cnikit: &Path) -> Result<Rep, String> {
    ruleset::nft(&["flush", "ruleset"])?;
    let program = cnikit.to_str().ok_or("the cnikit path is not UTF-8")?;
    let (ran, answered) = with_probes(&node.sample, || {
        ruleset::run(program, &["firewall", "restore", "--json"])
    });
    let (ran, printed) = ran?;
    let done: serde_json::Value =
        serde_json::from_slice(&printed).map_err(|e| format!("restore --json: {e}"))?;
    let count = |k: &str| done[k].as_u64().map(|n| n as usize);
    Ok(Rep {
        commit_ms: commit_ms(node, &ran),
        answer_ms: Some(ms(ran.started, answered?)),
        own_ms: Some(ms(ran.started, ran.exited)),
        changes: count("changes"),
        restored: done["restored"].as_array().map(Vec::len),
        attachments: count("attachments"),
        whole: Counts::read()? == node.before,
    })
}

/// The floor: `nft flush ruleset`, then `nft -f` of the ruleset saved with
/// every resident attached: the same objects in one batch, with nothing to
/// read or decide first.
pub fn floor(node: &Node, saved: &Path) -> Result<Rep, String> {
    ruleset::nft(&["flush", "ruleset"])?;
    let file = saved
        .to_str()
        .ok_or("the saved ruleset's path is not UTF-8")?;
    let (ran, answered) = with_probes(&node.sample, || ruleset::nft(&["-f", file]));
    let ran = ran?;
    Ok(Rep {
        commit_ms: commit_ms(node, &ran),
        answer_ms: Some(ms(ran.started, answered?)),
        own_ms: Some(ms(ran.started, ran.exited)),
        changes: None,
        restored: None,
        attachments: None,
        whole: Counts::read()? == node.before,
    })
}

/// From the start of `ran` to its commit, when listening.
fn commit_ms(node: &Node, ran: &ruleset::Ran) -> Option<f64> {
    let watch = node.watch.as_ref()?;
    let at = watch.commit_of(ran.pid, ran.started, WAIT)?;
    Some(ms(ran.started, at))
}

/// Runs `work` on a thread while this one sweeps the sampled ports: the
/// ports are probed during the work, as they are while the daemon repairs.
fn with_probes<T: Send>(
    sample: &Sample,
    work: impl FnOnce() -> T + Send,
) -> (T, Result<Instant, String>) {
    std::thread::scope(|s| {
        let worker = s.spawn(work);
        let answered = sample.until_all_answer(WAIT);
        let done = match worker.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        };
        (done, answered)
    })
}
