//! The repair benchmark's figures: one row per measured span, its median
//! over the flushes with the range beside it; and the daemon's own line
//! about each repair, read from its log.

use serde::Serialize;
use std::fmt::Write as _;

/// One flush and what followed it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rep {
    /// From the start (the flush's commit with the daemon; the process's
    /// start for `cnikit firewall restore` and `nft -f`) to the commit of
    /// the batch that put everything back. None: its commit was not seen.
    pub commit_ms: Option<f64>,
    /// From the same start until every sampled host port answered.
    pub answer_ms: Option<f64>,
    /// The daemon's own figure from its log, or the process's start → exit.
    pub own_ms: Option<f64>,
    pub changes: Option<usize>,
    /// Attachments that lacked something / attachments recorded.
    pub restored: Option<usize>,
    pub attachments: Option<usize>,
    /// The ruleset's counts afterwards equal those before the flush.
    pub whole: bool,
}

/// The repetitions of one way of putting the ruleset back.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// `cnikit-daemon`, `cnikit firewall restore` or `floor (nft -f)`.
    pub name: &'static str,
    pub reps: Vec<Rep>,
}

/// (median, min, max) of the values present.
pub fn stats(values: impl Iterator<Item = Option<f64>>) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.flatten().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Some((median, v[0], v[v.len() - 1]))
}

/// A row's label and the figure it shows of each repetition.
type Span = (&'static str, fn(&Rep) -> Option<f64>);

/// The table: one row per series and span.
pub fn table(series: &[Series], sampled: usize) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:<28} {:<44} {:>9} {:>15} {:>8} {:>5}",
        "how", "span", "median", "min – max", "changes", "whole"
    );
    for s in series {
        let spans: [Span; 3] = match s.name {
            DAEMON => [
                ("flush committed → repair committed", |r| r.commit_ms),
                ("repair as the daemon logs it", |r| r.own_ms),
                (SAMPLED, |r| r.answer_ms),
            ],
            FLOOR | FLOOR_LISTENED => [
                ("nft -f started → committed", |r| r.commit_ms),
                ("nft -f started → exited", |r| r.own_ms),
                (SAMPLED, |r| r.answer_ms),
            ],
            _ => [
                ("restore started → committed", |r| r.commit_ms),
                ("restore started → exited", |r| r.own_ms),
                (SAMPLED, |r| r.answer_ms),
            ],
        };
        for (span, get) in spans {
            row(&mut t, s, span, get, sampled);
        }
    }
    let _ = writeln!(
        t,
        "ms; median of {} flushes each; whole = the ruleset's counts after equal those before the flush, in every repetition",
        series.first().map_or(0, |s| s.reps.len())
    );
    t
}

pub const DAEMON: &str = "cnikit-daemon (watch)";
pub const RESTORE: &str = "cnikit firewall restore";
pub const RESTORE_LISTENED: &str = "restore, events listened";
pub const FLOOR: &str = "floor: nft -f saved ruleset";
pub const FLOOR_LISTENED: &str = "floor, events listened";
const SAMPLED: &str = "→ all sampled host ports answer";

fn row(t: &mut String, s: &Series, span: &str, get: fn(&Rep) -> Option<f64>, sampled: usize) {
    let Some((median, min, max)) = stats(s.reps.iter().map(get)) else {
        return;
    };
    let changes = stats(s.reps.iter().map(|r| r.changes.map(|c| c as f64)))
        .map_or("-".to_string(), |(m, _, _)| format!("{m:.0}"));
    let whole = if s.reps.iter().all(|r| r.whole) {
        "yes"
    } else {
        "NO"
    };
    let span = span.replace("sampled", &format!("{sampled} sampled"));
    let _ = writeln!(
        t,
        "{:<28} {:<44} {median:>9.1} {:>15} {changes:>8} {whole:>5}",
        s.name,
        span,
        format!("{min:.1} – {max:.1}")
    );
}

/// What the daemon logged about one repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    pub restored: usize,
    pub attachments: usize,
    pub changes: usize,
    pub ms: u64,
}

/// The daemon's line about the repair after process `pid`'s change:
/// "firewall: after a change by process PID (nft), put back what X of Y
/// attachments lacked (Z changes in one batch, T ms)".
pub fn logged_repair(log: &str, pid: u32) -> Option<Logged> {
    let cause = format!("after a change by process {pid} (");
    let line = log.lines().find(|l| l.contains(&cause))?;
    let (_, rest) = line.split_once("put back what ")?;
    let numbers: Vec<u64> = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [restored, attachments, changes, ms] = numbers[..] else {
        return None;
    };
    Some(Logged {
        restored: restored as usize,
        attachments: attachments as usize,
        changes: changes as usize,
        ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let v = [Some(3.0), None, Some(1.0), Some(2.0)];
        assert_eq!(stats(v.into_iter()), Some((2.0, 1.0, 3.0)));
        let v = [Some(4.0), Some(1.0)];
        assert_eq!(stats(v.into_iter()), Some((2.5, 1.0, 4.0)));
        assert_eq!(stats([None].into_iter()), None);
    }

    #[test]
    fn the_daemons_line_for_that_process() {
        let log = "ipamd info: ready\n\
            ipamd info: firewall: after a change by process 77 (nft), put back what 3 of 4 attachments lacked (9 changes in one batch, 12 ms)\n\
            ipamd info: firewall: after a change by process 78 (nft), put back what 1000 of 1000 attachments lacked (5004 changes in one batch, 85 ms)\n";
        let want = Logged {
            restored: 1000,
            attachments: 1000,
            changes: 5004,
            ms: 85,
        };
        assert_eq!(logged_repair(log, 78), Some(want));
        assert_eq!(logged_repair(log, 79), None);
    }
}
