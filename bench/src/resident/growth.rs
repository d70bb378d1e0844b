//! The churn's figures without and with residents, and how much each setup
//! grew between them: the ratio `--resident` is run for.

use crate::churn::Run;
use crate::report::{self, summarize};
use std::fmt::Write as _;

/// The table of the rounds without residents, the table of those with them,
/// and the growth of each setup's p50s and rate.
pub fn tables(runs: &[Run], n: u32) -> String {
    let (base, with): (Vec<Run>, Vec<Run>) = runs.iter().cloned().partition(|r| r.residents == 0);
    let mut t = String::new();
    let _ = writeln!(t, "without residents (the same setups, in the same turns):");
    t.push_str(&report::table(&base));
    let _ = writeln!(t, "\nwith {n} residents:");
    t.push_str(&report::table(&with));
    t.push_str(&growth(&base, &with, n));
    t
}

fn growth(base: &[Run], with: &[Run], n: u32) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\ngrowth with {n} residents (p50 with them / p50 without, in the same turn):"
    );
    let _ = writeln!(
        t,
        "{:>3} {:<5} {:<13} | {:>8} {:>8} {:>6} | {:>8} {:>8} {:>6} | {:>6}",
        "W", "var", "impl", "ADD 0", "ADD N", "ratio", "DEL 0", "DEL N", "ratio", "pods/s"
    );
    for w in with {
        let Some(b) = base
            .iter()
            .find(|b| (b.workers, b.variant, b.imp) == (w.workers, w.variant, w.imp))
        else {
            continue;
        };
        let p50 =
            |r: &Run, add: bool| summarize(if add { &r.add_ms } else { &r.del_ms }).map(|s| s.p50);
        let (Some(a0), Some(a1), Some(d0), Some(d1)) =
            (p50(b, true), p50(w, true), p50(b, false), p50(w, false))
        else {
            continue;
        };
        let rate = if b.pods_per_s() > 0.0 {
            w.pods_per_s() / b.pods_per_s()
        } else {
            0.0
        };
        let _ = writeln!(
            t,
            "{:>3} {:<5} {:<13} | {a0:>8.2} {a1:>8.2} {:>5.2}x | {d0:>8.2} {d1:>8.2} {:>5.2}x | {rate:>5.2}x",
            w.workers,
            w.variant.name(),
            w.imp.name(),
            a1 / a0,
            d1 / d0,
        );
    }
    t
}
