//! What the soak records about the daemon once a second: its memory, open
//! descriptors and threads from /proc, the size of the network's journal and
//! snapshot, and what it says about itself on `GET /metrics`.

use crate::daemon;
use serde::Serialize;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// Seconds since the soak started.
    pub t_s: f64,
    pub cycles: u64,
    /// Failed operations so far (every failed ADD or DEL attempt).
    pub failures: u64,
    /// None while no daemon runs (between a kill and the new start).
    pub pid: Option<u32>,
    pub rss_kib: Option<u64>,
    pub fds: Option<u64>,
    pub threads: Option<u64>,
    pub journal_bytes: Option<u64>,
    pub snapshot_bytes: Option<u64>,
    /// allocate + release requests this daemon instance answered so far.
    pub ipam_served: Option<u64>,
    /// Firewall operations this daemon instance answered so far.
    pub fw_served: Option<u64>,
    pub leases_in_use: Option<u64>,
}

/// One sample now. `store` is the network's directory in the data dir.
pub fn take(t_s: f64, cycles: u64, failures: u64, store: &Path) -> Sample {
    let pid = daemon::pid();
    let status = pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok());
    let field = |name: &str| status.as_deref().and_then(|s| status_field(s, name));
    let metrics = pid.and_then(|_| scrape());
    Sample {
        t_s,
        cycles,
        failures,
        pid,
        rss_kib: field("VmRSS:"),
        fds: pid.and_then(count_fds),
        threads: field("Threads:"),
        journal_bytes: file_size(&store.join("journal")),
        snapshot_bytes: file_size(&store.join("snapshot")),
        ipam_served: metrics.as_ref().map(|m| m.ipam),
        fw_served: metrics.as_ref().map(|m| m.fw),
        leases_in_use: metrics.and_then(|m| m.leases),
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

pub struct Metrics {
    pub ipam: u64,
    pub fw: u64,
    pub leases: Option<u64>,
}

/// `GET /metrics` from the daemon; None when it does not answer within a
/// second (e.g. it is being restarted).
pub fn scrape() -> Option<Metrics> {
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
    let mut ops = Vec::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if !series.starts_with("ipamd_ext_requests_total{") {
            continue;
        }
        if let Ok(v) = value.parse::<f64>() {
            ops.push((label(series, "op"), label(series, "outcome"), v as u64));
        }
    }
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

/// Sums the series that matter here out of the Prometheus text.
fn parse_metrics(body: &str) -> Metrics {
    let mut m = Metrics {
        ipam: 0,
        fw: 0,
        leases: None,
    };
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let v = v as u64;
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

pub fn write_csv(path: &Path, samples: &[Sample]) -> Result<(), String> {
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut out = String::from(
        "t_s,cycles,failures,pid,rss_kib,fds,threads,journal_bytes,snapshot_bytes,\
         ipam_served,fw_served,leases_in_use\n",
    );
    for s in samples {
        out.push_str(&format!(
            "{:.2},{},{},{},{},{},{},{},{},{},{},{}\n",
            s.t_s,
            s.cycles,
            s.failures,
            opt(s.pid.map(u64::from)),
            opt(s.rss_kib),
            opt(s.fds),
            opt(s.threads),
            opt(s.journal_bytes),
            opt(s.snapshot_bytes),
            opt(s.ipam_served),
            opt(s.fw_served),
            opt(s.leases_in_use),
        ));
    }
    std::fs::write(path, out).map_err(|e| format!("{}: {e}", path.display()))
}
