//! Whether a long run stays flat: least-squares slopes, per 10,000 cycles,
//! of what the samples record about the daemon and the store files, and of
//! the median ADD and DEL latency in windows of 1,000 completed cycles. Each
//! slope is given over the whole run and over its second half (after the
//! warm-up: allocator, thread pool and socket pool filling up), with its
//! standard error.

use super::sample::Sample;
use serde::Serialize;
use std::fmt::Write as _;

/// Cycles per latency window.
pub const WINDOW: u64 = 1_000;
/// Slopes are given per this many cycles.
const PER: f64 = 10_000.0;

/// How long one cycle's plugin calls took.
#[derive(Debug, Clone, Copy)]
pub struct CycleTime {
    /// Completed cycles when this one completed (1 for the first).
    pub done: u64,
    /// The ADD call.
    pub add_ms: f32,
    /// The DEL calls until one succeeded (or the last retry failed).
    pub del_ms: f32,
}

/// ADD and DEL latency over one window of completed cycles.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// Completed cycles at the window's end.
    pub cycles_end: u64,
    pub n: usize,
    pub add_p50_ms: f64,
    pub add_p99_ms: f64,
    pub del_p50_ms: f64,
    pub del_p99_ms: f64,
}

/// The windows of `WINDOW` cycles, by completion order (the last may be
/// shorter).
pub fn windows(times: &[CycleTime]) -> Vec<Window> {
    let mut sorted = times.to_vec();
    sorted.sort_by_key(|c| c.done);
    sorted
        .chunk_by(|a, b| (a.done - 1) / WINDOW == (b.done - 1) / WINDOW)
        .map(|w| {
            let mut add: Vec<f32> = w.iter().map(|c| c.add_ms).collect();
            let mut del: Vec<f32> = w.iter().map(|c| c.del_ms).collect();
            add.sort_by(f32::total_cmp);
            del.sort_by(f32::total_cmp);
            Window {
                cycles_end: w.last().map_or(0, |c| c.done),
                n: w.len(),
                add_p50_ms: quantile(&add, 0.5),
                add_p99_ms: quantile(&add, 0.99),
                del_p50_ms: quantile(&del, 0.5),
                del_p99_ms: quantile(&del, 0.99),
            }
        })
        .collect()
}

fn quantile(sorted: &[f32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    f64::from(sorted[i])
}

/// A least-squares slope per 10,000 cycles and its standard error.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Slope {
    pub per_10k: f64,
    pub stderr: f64,
    /// Points it was fitted to.
    pub n: usize,
}

/// Over the whole run and over its second half (cycles ≥ half the last).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Trend {
    pub whole: Option<Slope>,
    pub second_half: Option<Slope>,
}

/// The slopes of a soak, each in the unit its name says.
#[derive(Debug, Clone, Serialize)]
pub struct Trends {
    pub rss_kib: Trend,
    pub fds: Trend,
    pub threads: Trend,
    pub journal_bytes: Trend,
    pub snapshot_bytes: Trend,
    /// Of the windows' medians.
    pub add_p50_ms: Trend,
    pub del_p50_ms: Trend,
}

/// The least-squares slope of y over x; None with fewer than 3 points or
/// no spread in x.
pub fn least_squares(points: &[(f64, f64)]) -> Option<Slope> {
    let n = points.len();
    if n < 3 {
        return None;
    }
    let nf = n as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let b = sxy / sxx;
    let a = my - b * mx;
    let ssr: f64 = points.iter().map(|p| (p.1 - a - b * p.0).powi(2)).sum();
    let se = (ssr / (nf - 2.0) / sxx).sqrt();
    Some(Slope {
        per_10k: b * PER,
        stderr: se * PER,
        n,
    })
}

fn trend(points: Vec<(f64, f64)>) -> Trend {
    let half = points.iter().map(|p| p.0).fold(0.0, f64::max) / 2.0;
    let late: Vec<_> = points.iter().copied().filter(|p| p.0 >= half).collect();
    Trend {
        whole: least_squares(&points),
        second_half: least_squares(&late),
    }
}

/// The slopes of the samples (x: completed cycles) and of the windows.
pub fn trends(samples: &[Sample], windows: &[Window]) -> Trends {
    let of = |f: fn(&Sample) -> Option<u64>| {
        trend(
            samples
                .iter()
                .filter_map(|s| Some((s.cycles as f64, f(s)? as f64)))
                .collect(),
        )
    };
    let win = |f: fn(&Window) -> f64| {
        trend(
            windows
                .iter()
                // A short last window is too noisy to weigh like the others.
                .filter(|w| w.n as u64 == WINDOW && f(w).is_finite())
                .map(|w| (w.cycles_end as f64, f(w)))
                .collect(),
        )
    };
    Trends {
        rss_kib: of(|s| s.daemon.as_ref()?.rss_kib),
        fds: of(|s| s.daemon.as_ref()?.fds),
        threads: of(|s| s.daemon.as_ref()?.threads),
        journal_bytes: of(|s| s.journal_bytes),
        snapshot_bytes: of(|s| s.snapshot_bytes),
        add_p50_ms: win(|w| w.add_p50_ms),
        del_p50_ms: win(|w| w.del_p50_ms),
    }
}

/// The slopes as summary.txt shows them.
pub fn text(t: &Trends, windows: &[Window]) -> String {
    let mut s = String::from(
        "slope per 10,000 cycles (least squares ± standard error): whole run | second half\n",
    );
    let one = |x: Option<Slope>, scale: f64| {
        x.map_or("n/a".into(), |x| {
            format!("{:+.3} ± {:.3}", x.per_10k / scale, x.stderr / scale)
        })
    };
    let rows: [(&str, &Trend, f64, &str); 7] = [
        ("daemon RSS", &t.rss_kib, 1024.0, "MiB"),
        ("daemon open fds", &t.fds, 1.0, "fds"),
        ("daemon threads", &t.threads, 1.0, "threads"),
        ("journal", &t.journal_bytes, 1024.0, "KiB"),
        ("snapshot", &t.snapshot_bytes, 1024.0, "KiB"),
        ("ADD p50", &t.add_p50_ms, 1.0, "ms"),
        ("DEL p50", &t.del_p50_ms, 1.0, "ms"),
    ];
    for (name, tr, scale, unit) in rows {
        let _ = writeln!(
            s,
            "  {name:<17} {:>24} | {:<24} {unit}",
            one(tr.whole, scale),
            one(tr.second_half, scale)
        );
    }
    let full: Vec<_> = windows.iter().filter(|w| w.n as u64 == WINDOW).collect();
    if let (Some(a), Some(b)) = (full.first(), full.last()) {
        let _ = writeln!(
            s,
            "  latency windows of {WINDOW} cycles: ADD p50 {:.1} → {:.1} ms, p99 {:.1} → {:.1} ms; \
             DEL p50 {:.1} → {:.1} ms, p99 {:.1} → {:.1} ms (first → last)",
            a.add_p50_ms,
            b.add_p50_ms,
            a.add_p99_ms,
            b.add_p99_ms,
            a.del_p50_ms,
            b.del_p50_ms,
            a.del_p99_ms,
            b.del_p99_ms
        );
    }
    s
}

/// windows.csv: one line per window.
pub fn windows_csv(windows: &[Window]) -> String {
    let mut s = String::from("cycles_end,n,add_p50_ms,add_p99_ms,del_p50_ms,del_p99_ms\n");
    for w in windows {
        let _ = writeln!(
            s,
            "{},{},{:.3},{:.3},{:.3},{:.3}",
            w.cycles_end, w.n, w.add_p50_ms, w.add_p99_ms, w.del_p50_ms, w.del_p99_ms
        );
    }
    s
}
