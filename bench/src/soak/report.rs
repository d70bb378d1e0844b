//! The soak's figures: summary.txt (also printed) and summary.json, the
//! sample and restart CSVs, every failure, and the plot.

use super::check::Check;
use super::sample::Sample;
use super::trend::{self, Trends, Window};
use super::{plot, Failure, Restart, SoakArgs};
use crate::report::Machine;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

pub struct Report<'a> {
    pub args: &'a SoakArgs,
    pub cnikit: &'a Path,
    pub interrupted: bool,
    pub duration_s: f64,
    pub cycles_done: u64,
    pub samples: &'a [Sample],
    pub restarts: &'a [Restart],
    pub failures: &'a [Failure],
    /// ADD/DEL latency per window of completed cycles.
    pub windows: &'a [Window],
    pub checks: &'a [Check],
    pub nft_rules: Option<usize>,
    /// The last daemon's wait status after the final SIGTERM.
    pub final_status: Option<String>,
    pub daemon_log: String,
}

/// min / max / last of one quantity over the samples a daemon was up for.
#[derive(Debug, Clone, Copy, Serialize)]
struct Range {
    min: u64,
    max: u64,
    end: u64,
}

fn range(samples: &[Sample], f: impl Fn(&Sample) -> Option<u64>) -> Option<Range> {
    let v: Vec<u64> = samples.iter().filter_map(f).collect();
    Some(Range {
        min: *v.iter().min()?,
        max: *v.iter().max()?,
        end: *v.last()?,
    })
}

#[derive(Serialize)]
struct Figures<'a> {
    machine: Machine,
    settings: &'a SoakArgs,
    cnikit: &'a Path,
    interrupted: bool,
    duration_s: f64,
    cycles_done: u64,
    cycles_per_s: f64,
    failures: usize,
    add_failures: usize,
    del_failures: usize,
    /// Cycles whose DEL failed on every attempt.
    del_given_up: usize,
    rss_kib: Option<Range>,
    fds: Option<Range>,
    threads: Option<Range>,
    journal_bytes: Option<Range>,
    snapshot_bytes: Option<Range>,
    /// Slopes per 10,000 cycles (trend.rs).
    trends: Trends,
    /// allocate + release requests the daemon instances answered, summed
    /// over their last scrapes; 2 per cycle were made (more with retries).
    ipam_served_by_daemons: u64,
    fw_served_by_daemons: u64,
    nft_rules_at_end: Option<usize>,
    final_daemon_status: Option<&'a str>,
    daemon_log_lines: usize,
    restarts: &'a [Restart],
    checks: &'a [Check],
    first_failures: &'a [Failure],
    clean: bool,
}

impl Report<'_> {
    /// Nothing failed and nothing leaked.
    pub fn clean(&self) -> bool {
        self.failures.is_empty()
            && self.checks.iter().all(Check::clean)
            && !self.interrupted
            && self.cycles_done == self.args.cycles
    }

    fn figures(&self) -> Figures<'_> {
        let count = |op: &str| self.failures.iter().filter(|f| f.op == op).count();
        let given_up = self
            .failures
            .iter()
            .filter(|f| f.op == "DEL" && f.attempt == self.args.del_retries)
            .count();
        let last = self.samples.iter().rev().find(|s| s.daemon.is_some());
        let served = |f: fn(&Restart) -> Option<u64>, g: fn(&Sample) -> Option<u64>| {
            self.restarts.iter().filter_map(f).sum::<u64>() + last.and_then(g).unwrap_or(0)
        };
        Figures {
            machine: Machine::probe(),
            settings: self.args,
            cnikit: self.cnikit,
            interrupted: self.interrupted,
            duration_s: self.duration_s,
            cycles_done: self.cycles_done,
            cycles_per_s: self.cycles_done as f64 / self.duration_s.max(1e-9),
            failures: self.failures.len(),
            add_failures: count("ADD"),
            del_failures: count("DEL"),
            del_given_up: given_up,
            rss_kib: range(self.samples, |s| s.daemon.as_ref()?.rss_kib),
            fds: range(self.samples, |s| s.daemon.as_ref()?.fds),
            threads: range(self.samples, |s| s.daemon.as_ref()?.threads),
            journal_bytes: range(self.samples, |s| s.journal_bytes),
            snapshot_bytes: range(self.samples, |s| s.snapshot_bytes),
            trends: trend::trends(self.samples, self.windows),
            ipam_served_by_daemons: served(|r| r.ipam_served, |s| Some(s.metrics()?.ipam)),
            fw_served_by_daemons: served(|r| r.fw_served, |s| Some(s.metrics()?.fw)),
            nft_rules_at_end: self.nft_rules,
            final_daemon_status: self.final_status.as_deref(),
            daemon_log_lines: self.daemon_log.lines().count(),
            restarts: self.restarts,
            checks: self.checks,
            first_failures: &self.failures[..self.failures.len().min(50)],
            clean: self.clean(),
        }
    }

    pub fn write(&self, out: &Path) -> Result<(), String> {
        let fig = self.figures();
        let mut text = self.text(&fig);
        let w = |name: &str, bytes: &[u8]| {
            let p = out.join(name);
            std::fs::write(&p, bytes).map_err(|e| format!("{}: {e}", p.display()))
        };
        w("soak.csv", samples_csv(self.samples).as_bytes())?;
        w("restarts.csv", restarts_csv(self.restarts).as_bytes())?;
        w("failures.txt", failures_txt(self.failures).as_bytes())?;
        w("windows.csv", trend::windows_csv(self.windows).as_bytes())?;
        let json = serde_json::to_vec_pretty(&fig).map_err(|e| e.to_string())?;
        w("summary.json", &json)?;
        let svg = out.join("soak.svg");
        plot::write(&svg, self.samples, self.restarts).map_err(|e| format!("soak.svg: {e}"))?;
        let plotted = match plot::to_png(&svg, &out.join("soak.png")) {
            Ok(()) => "soak.svg, soak.png".to_string(),
            Err(e) => format!("soak.svg (no PNG: {e})"),
        };
        let _ = writeln!(
            text,
            "files in {}: soak.csv, windows.csv, restarts.csv, failures.txt, \
             summary.json, summary.txt, daemon.log, {plotted}",
            out.display()
        );
        w("summary.txt", text.as_bytes())?;
        print!("{text}");
        Ok(())
    }

    fn text(&self, f: &Figures) -> String {
        let a = self.args;
        let mut t = String::new();
        let kills = self
            .restarts
            .iter()
            .filter(|r| r.signal == "SIGKILL")
            .count();
        let _ = writeln!(
            t,
            "soak: {} of {} cycles, {} workers, {}{}",
            f.cycles_done,
            a.cycles,
            a.workers,
            if a.restart_every == 0 {
                "daemon never restarted".to_string()
            } else {
                format!(
                    "daemon restarted every {} cycles ({} restarts: {} SIGTERM, {kills} SIGKILL{})",
                    a.restart_every,
                    self.restarts.len(),
                    self.restarts.len() - kills,
                    if a.down_ms > 0 {
                        format!(", kept down {} ms each", a.down_ms)
                    } else {
                        String::new()
                    }
                )
            },
            if self.interrupted {
                " — INTERRUPTED"
            } else {
                ""
            }
        );
        let _ = writeln!(
            t,
            "duration {:.1} s, {:.1} cycles/s",
            f.duration_s, f.cycles_per_s
        );
        let _ = writeln!(
            t,
            "failures: {} (ADD {}, DEL attempts {}, DEL given up after {} retries {})",
            f.failures, f.add_failures, f.del_failures, a.del_retries, f.del_given_up
        );
        // KiB → MiB and bytes → KiB alike.
        let per_1024 = |r: Option<Range>| {
            r.map_or("n/a".into(), |r| {
                let m = |v: u64| v as f64 / 1024.0;
                format!(
                    "min {:.1}  max {:.1}  at end {:.1}",
                    m(r.min),
                    m(r.max),
                    m(r.end)
                )
            })
        };
        let num = |r: Option<Range>| {
            r.map_or("n/a".into(), |r| {
                format!("min {}  max {}  at end {}", r.min, r.max, r.end)
            })
        };
        let _ = writeln!(t, "daemon RSS MiB     {}", per_1024(f.rss_kib));
        let _ = writeln!(t, "daemon open fds    {}", num(f.fds));
        let _ = writeln!(t, "daemon threads     {}", num(f.threads));
        let _ = writeln!(t, "journal KiB        {}", per_1024(f.journal_bytes));
        let _ = writeln!(t, "snapshot KiB       {}", per_1024(f.snapshot_bytes));
        t.push_str(&trend::text(&f.trends, self.windows));
        let _ = writeln!(
            t,
            "IPAM requests answered by the daemons: {} (2 per cycle made: {}); the rest ran \
             in-process while no daemon answered",
            f.ipam_served_by_daemons,
            2 * f.cycles_done
        );
        let _ = writeln!(
            t,
            "firewall operations answered by the daemons: {}; nft rules in cnikit's tables at \
             end: {}; last daemon: {}; daemon.log: {} lines",
            f.fw_served_by_daemons,
            f.nft_rules_at_end.map_or("n/a".into(), |n| n.to_string()),
            f.final_daemon_status.unwrap_or("n/a"),
            f.daemon_log_lines
        );
        for r in self.restarts {
            let near = self
                .failures
                .iter()
                .filter(|x| x.t_s >= r.t_s - 1.0 && x.t_s <= r.t_s + r.down_ms / 1000.0 + 2.0)
                .count();
            let _ = writeln!(
                t,
                "  restart at {:>7.1} s, {:>6} cycles: {} pid {}→{}, exited in {:.0} ms \
                 ({}), down {:.0} ms, failures around it {near}",
                r.t_s,
                r.cycles,
                r.signal,
                r.old_pid.map_or("?".into(), |p| p.to_string()),
                r.new_pid.map_or("?".into(), |p| p.to_string()),
                r.exit_ms,
                r.status,
                r.down_ms
            );
        }
        for f in self.failures.iter().take(5) {
            let _ = writeln!(
                t,
                "  failure at {:.1} s, cycle {}: {} (attempt {}): {}",
                f.t_s, f.cycle, f.op, f.attempt, f.error
            );
        }
        let _ = writeln!(t, "leak checks:");
        for c in self.checks {
            let found = c.found.map_or("CHECK FAILED".into(), |n| n.to_string());
            let _ = writeln!(t, "  {:<22} {:>6}  {}", c.what, found, c.detail);
        }
        let verdict = if f.clean {
            "CLEAN: no failure, nothing leaked"
        } else {
            "NOT CLEAN: see failures and leak checks above"
        };
        let _ = writeln!(t, "{verdict}");
        t
    }
}

/// A CSV field of a quantity that may be missing: empty then.
fn opt(v: Option<impl ToString>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// `header`, then one line per item.
fn lines<T>(header: &str, items: &[T], line: impl Fn(&T) -> String) -> String {
    let mut s = String::from(header);
    for item in items {
        s.push_str(&line(item));
        s.push('\n');
    }
    s
}

fn samples_csv(samples: &[Sample]) -> String {
    let header = "t_s,cycles,failures,pid,rss_kib,fds,threads,journal_bytes,snapshot_bytes,\
                  ipam_served,fw_served,leases_in_use\n";
    lines(header, samples, |x| {
        let d = x.daemon.as_ref();
        let m = x.metrics();
        format!(
            "{:.2},{},{},{},{},{},{},{},{},{},{},{}",
            x.t_s,
            x.cycles,
            x.failures,
            opt(d.map(|d| d.pid)),
            opt(d.and_then(|d| d.rss_kib)),
            opt(d.and_then(|d| d.fds)),
            opt(d.and_then(|d| d.threads)),
            opt(x.journal_bytes),
            opt(x.snapshot_bytes),
            opt(m.map(|m| m.ipam)),
            opt(m.map(|m| m.fw)),
            opt(m.and_then(|m| m.leases)),
        )
    })
}

fn restarts_csv(restarts: &[Restart]) -> String {
    let header = "t_s,cycles,signal,old_pid,new_pid,exit_ms,down_ms,status,ipam_served,fw_served\n";
    lines(header, restarts, |r| {
        let status = r.status.replace('"', "'");
        let (old, new) = (opt(r.old_pid), opt(r.new_pid));
        let served = (opt(r.ipam_served), opt(r.fw_served));
        format!(
            "{:.2},{},{},{old},{new},{:.1},{:.1},\"{status}\",{},{}",
            r.t_s, r.cycles, r.signal, r.exit_ms, r.down_ms, served.0, served.1
        )
    })
}

fn failures_txt(failures: &[Failure]) -> String {
    lines("", failures, |f| {
        let error = f.error.replace('\n', " ");
        let (t, cycle, op, attempt) = (f.t_s, f.cycle, &f.op, f.attempt);
        format!("{t:.2}s cycle {cycle} {op} attempt {attempt}: {error}")
    })
}
