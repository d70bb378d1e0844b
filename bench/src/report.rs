//! The human table and the JSON file with the raw figures.

use crate::churn::Run;
use crate::setup::Impl;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// p50/p95/p99/max of a sample (nearest rank), in ms.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn summarize(values: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Some(Summary {
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
        max: v[v.len() - 1],
    })
}

/// Figures of one row: ADD and DEL summaries and pods/s.
fn figures(run: &Run) -> Option<[f64; 9]> {
    let a = summarize(&run.add_ms)?;
    let d = summarize(&run.del_ms)?;
    Some([
        a.p50,
        a.p95,
        a.p99,
        a.max,
        d.p50,
        d.p95,
        d.p99,
        d.max,
        run.pods_per_s(),
    ])
}

pub fn table(runs: &[Run]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:>3} {:<5} {:<13} {:>5} {:>4} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8} | {:>7}",
        "W", "var", "impl", "pods", "fail", "ADD p50", "p95", "p99", "max", "DEL p50", "p95", "p99", "max", "pods/s"
    );
    let _ = writeln!(t, "{}", "-".repeat(130));
    let mut last_group = None;
    for run in runs {
        let group = (run.workers, run.variant);
        if last_group.is_some_and(|g| g != group) {
            ratio_row(&mut t, runs, last_group);
        }
        last_group = Some(group);
        row(&mut t, run);
    }
    ratio_row(&mut t, runs, last_group);
    let _ = writeln!(
        t,
        "latencies in ms (whole chain as the runtime sees it, netns create/delete excluded); \
         ratio = reference/cnikit for latencies, cnikit/reference for pods/s (> 1: cnikit better)"
    );
    t
}

fn row(t: &mut String, run: &Run) {
    let head = format!(
        "{:>3} {:<5} {:<13} {:>5} {:>4} |",
        run.workers,
        run.variant.name(),
        run.imp.name(),
        run.add_ms.len(),
        run.failures
    );
    match figures(run) {
        Some(f) => {
            let _ = writeln!(
                t,
                "{head} {} | {} | {:>7.1}",
                four(&f[0..4]),
                four(&f[4..8]),
                f[8]
            );
        }
        None => {
            let why = run.first_error.as_deref().unwrap_or("no pod completed");
            let _ = writeln!(t, "{head} FAILED: {}", one_line(why, 150));
        }
    }
}

fn four(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:>8.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn ratio_row(t: &mut String, runs: &[Run], group: Option<(usize, crate::setup::Variant)>) {
    let Some((w, v)) = group else { return };
    let find = |imp: Impl| {
        runs.iter()
            .find(|r| r.workers == w && r.variant == v && r.imp == imp)
            .and_then(figures)
    };
    let (Some(r), Some(c)) = (find(Impl::Reference), find(Impl::Cnikit)) else {
        return;
    };
    let q: Vec<f64> = (0..8).map(|i| r[i] / c[i]).collect();
    let _ = writeln!(
        t,
        "{:>3} {:<5} {:<13} {:>5} {:>4} | {} | {} | {:>6.1}x",
        w,
        v.name(),
        "ratio",
        "",
        "",
        q[0..4]
            .iter()
            .map(|x| format!("{x:>7.1}x"))
            .collect::<Vec<_>>()
            .join(" "),
        q[4..8]
            .iter()
            .map(|x| format!("{x:>7.1}x"))
            .collect::<Vec<_>>()
            .join(" "),
        c[8] / r[8]
    );
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        flat
    } else {
        format!("{}…", flat.chars().take(max).collect::<String>())
    }
}

#[derive(Serialize)]
struct Document<'a> {
    machine: Machine,
    /// Stopped by Ctrl-C: the runs hold what finished.
    interrupted: bool,
    settings: &'a serde_json::Value,
    runs: Vec<RunOut<'a>>,
    /// `--resident`: how the residents were set up, torn down and checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    residents: Option<&'a serde_json::Value>,
}

#[derive(Serialize)]
struct RunOut<'a> {
    #[serde(flatten)]
    run: &'a Run,
    pods_per_s: f64,
    add: Option<Summary>,
    del: Option<Summary>,
}

#[derive(Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub kernel: String,
    pub cpu_model: String,
}

impl Machine {
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .unwrap_or("")
                .trim()
                .to_string(),
        }
    }
}

pub fn write_json(
    path: &Path,
    runs: &[Run],
    settings: &serde_json::Value,
    residents: Option<&serde_json::Value>,
) -> Result<(), String> {
    let doc = Document {
        residents,
        machine: Machine::probe(),
        interrupted: crate::sandbox::stopping(),
        settings,
        runs: runs
            .iter()
            .map(|run| RunOut {
                run,
                pods_per_s: run.pods_per_s(),
                add: summarize(&run.add_ms),
                del: summarize(&run.del_ms),
            })
            .collect(),
    };
    let text = serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
