//! Prometheus text exposition of the daemon's counters, kept by hand: a handful of series
//! does not justify a metrics crate.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use crate::journal::FSYNCS;

/// Latency histogram bucket bounds, in seconds (an fsync is ~0.1 ms on a good disk).
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

#[derive(Default)]
struct Hist {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

#[derive(Default)]
pub(crate) struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    latency: Mutex<BTreeMap<&'static str, Hist>>,
    /// Hosted-service operations by `<service>.<op>` and outcome.
    ext: Mutex<BTreeMap<(String, &'static str), u64>>,
}

/// Per-network gauges, computed at scrape time.
pub(crate) struct NetworkUsage {
    pub network: String,
    pub in_use: u128,
    /// None until the daemon has seen the network's range sets in a request.
    pub free: Option<u128>,
}

impl Metrics {
    pub(crate) fn observe(&self, verb: &'static str, outcome: &'static str, took: Duration) {
        {
            let mut r = self.requests.lock().unwrap_or_else(|e| e.into_inner());
            *r.entry((verb, outcome)).or_default() += 1;
        }
        let secs = took.as_secs_f64();
        let mut l = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        let h = l.entry(verb).or_default();
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                h.counts[i] += 1;
            }
        }
        h.sum += secs;
        h.count += 1;
    }

    /// A hosted-service operation: counted per op, timed under verb "ext".
    pub(crate) fn observe_ext(&self, op: &str, outcome: &'static str, took: Duration) {
        {
            let mut e = self.ext.lock().unwrap_or_else(|e| e.into_inner());
            *e.entry((op.to_string(), outcome)).or_default() += 1;
        }
        self.observe("ext", outcome, took);
    }

    pub(crate) fn render(&self, usage: &[NetworkUsage]) -> String {
        let mut out = String::new();
        out.push_str("# HELP ipamd_requests_total API requests by verb and outcome.\n");
        out.push_str("# TYPE ipamd_requests_total counter\n");
        {
            let r = self.requests.lock().unwrap_or_else(|e| e.into_inner());
            for ((verb, outcome), n) in r.iter() {
                let _ = writeln!(
                    out,
                    "ipamd_requests_total{{verb=\"{verb}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        out.push_str(
            "# HELP ipamd_request_duration_seconds API request latency, including fsync.\n",
        );
        out.push_str("# TYPE ipamd_request_duration_seconds histogram\n");
        {
            let l = self.latency.lock().unwrap_or_else(|e| e.into_inner());
            for (verb, h) in l.iter() {
                for (i, b) in BUCKETS.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "ipamd_request_duration_seconds_bucket{{verb=\"{verb}\",le=\"{b}\"}} {}",
                        h.counts[i]
                    );
                }
                let _ = writeln!(
                    out,
                    "ipamd_request_duration_seconds_bucket{{verb=\"{verb}\",le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(
                    out,
                    "ipamd_request_duration_seconds_sum{{verb=\"{verb}\"}} {}",
                    h.sum
                );
                let _ = writeln!(
                    out,
                    "ipamd_request_duration_seconds_count{{verb=\"{verb}\"}} {}",
                    h.count
                );
            }
        }
        out.push_str(
            "# HELP ipamd_ext_requests_total Extension operations (e.g. cnikit's firewall) by op and outcome.\n",
        );
        out.push_str("# TYPE ipamd_ext_requests_total counter\n");
        {
            let e = self.ext.lock().unwrap_or_else(|e| e.into_inner());
            for ((op, outcome), n) in e.iter() {
                let _ = writeln!(
                    out,
                    "ipamd_ext_requests_total{{op=\"{op}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP ipamd_leases_in_use Addresses leased, per network.\n");
        out.push_str("# TYPE ipamd_leases_in_use gauge\n");
        for u in usage {
            let _ = writeln!(
                out,
                "ipamd_leases_in_use{{network=\"{}\"}} {}",
                u.network, u.in_use
            );
        }
        out.push_str("# HELP ipamd_leases_free Addresses still free in the network's last requested range sets.\n");
        out.push_str("# TYPE ipamd_leases_free gauge\n");
        for u in usage {
            if let Some(free) = u.free {
                let _ = writeln!(out, "ipamd_leases_free{{network=\"{}\"}} {free}", u.network);
            }
        }
        out.push_str("# HELP ipamd_fsyncs_total fsync calls made on lease store files.\n");
        out.push_str("# TYPE ipamd_fsyncs_total counter\n");
        let _ = writeln!(out, "ipamd_fsyncs_total {}", FSYNCS.load(Ordering::Relaxed));
        out
    }
}
