//! What the soak records about the daemon once a second: its memory, open
//! descriptors and threads from /proc, the size of the network's journal and
//! snapshot, and what it says about itself on `GET /metrics`.

use crate::daemon;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the soak started.
    pub t_s: f64,
    pub cycles: u64,
    /// Failed operations so far (every failed ADD or DEL attempt).
    pub failures: u64,
    /// None while no daemon runs (between a kill and the new start).
    pub daemon: Option<DaemonSample>,
    /// The network's store files: there with or without a daemon.
    pub journal_bytes: Option<u64>,
    pub snapshot_bytes: Option<u64>,
}

/// The running daemon as /proc and its `GET /metrics` show it.
#[derive(Debug, Clone)]
pub struct DaemonSample {
    pub pid: u32,
    /// None when the process went away before /proc was read.
    pub rss_kib: Option<u64>,
    pub fds: Option<u64>,
    pub threads: Option<u64>,
    /// None when it did not answer (e.g. it is being restarted).
    pub metrics: Option<Metrics>,
}

impl Sample {
    pub fn metrics(&self) -> Option<&Metrics> {
        self.daemon.as_ref()?.metrics.as_ref()
    }
}

/// One sample now. `store` is the network's directory in the data dir.
pub fn take(t_s: f64, cycles: u64, failures: u64, store: &Path) -> Sample {
    Sample {
        t_s,
        cycles,
        failures,
        daemon: daemon::pid().map(daemon_sample),
        journal_bytes: file_size(&store.join("journal")),
        snapshot_bytes: file_size(&store.join("snapshot")),
    }
}

fn daemon_sample(pid: u32) -> DaemonSample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
    let field = |name: &str| status.as_deref().and_then(|s| status_field(s, name));
    // Scraped before the fds are counted, so that the count is never the scrape's own
    // connection more.
    let metrics = scrape();
    DaemonSample {
        pid,
        rss_kib: field("VmRSS:"),
        fds: count_fds(pid),
        threads: field("Threads:"),
        metrics,
    }
}

/// "VmRSS:     1234 kB" → 1234.
fn status_field(status: &str, name: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

fn count_fds(pid: u32) -> Option<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(dir.count() as u64)
}

fn file_size(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// What the daemon says about itself, summed over the series that matter here.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// allocate + release requests this daemon instance answered so far.
    pub ipam: u64,
    /// Firewall operations this daemon instance answered so far.
    pub fw: u64,
    /// Leases in use over all networks; None when no series reports them.
    pub leases: Option<u64>,
}

/// `GET /metrics` from the daemon; None when it does not answer within a
/// second.
fn scrape() -> Option<Metrics> {
    scrape_text().map(|body| parse_metrics(&body))
}

/// The firewall operations the daemon answered, by op and outcome, e.g.
/// `("firewall.portmap-del-keys", "ok", 1128)`: shows whether DELs went
/// by key (prevResult and mappings given) or by tag.
pub fn firewall_ops() -> Option<Vec<(String, String, u64)>> {
    let body = scrape_text()?;
    let label = |series: &str, name: &str| -> String {
        let start = format!("{name}=\"");
        series
            .split_once(&start)
            .and_then(|(_, rest)| rest.split_once('"'))
            .map_or(String::new(), |(v, _)| v.to_string())
    };
    let mut ops: Vec<_> = series_values(&body)
        .filter(|(series, _)| series.starts_with("ipamd_ext_requests_total{"))
        .map(|(series, v)| (label(series, "op"), label(series, "outcome"), v))
        .collect();
    ops.sort();
    Some(ops)
}

fn scrape_text() -> Option<String> {
    let mut s = std::os::unix::net::UnixStream::connect(daemon::SOCKET).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ipamd\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    Some(body.to_string())
}

/// The value lines of Prometheus text: (series with its labels, value);
/// comments and lines that do not parse are skipped.
fn series_values(body: &str) -> impl Iterator<Item = (&str, u64)> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series, value.parse::<f64>().ok()? as u64))
        })
}

/// Sums the series that matter here out of the Prometheus text.
fn parse_metrics(body: &str) -> Metrics {
    let mut m = Metrics {
        ipam: 0,
        fw: 0,
        leases: None,
    };
    for (series, v) in series_values(body) {
        if series.starts_with("ipamd_requests_total{")
            && (series.contains("verb=\"allocate\"") || series.contains("verb=\"release\""))
        {
            m.ipam += v;
        } else if series.starts_with("ipamd_ext_requests_total{") {
            m.fw += v;
        } else if series.starts_with("ipamd_leases_in_use{") {
            *m.leases.get_or_insert(0) += v;
        }
    }
    m
}
