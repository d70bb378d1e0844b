//! The daemon's counters and latencies, exposed as Prometheus text.

use std::collections::BTreeMap;
use std::fmt::{Display, Write};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::journal::FSYNCS;
use crate::prometheus::{family, histogram, single};

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

/// A counter family whose series carry two labels.
struct Counters {
    name: &'static str,
    help: &'static str,
    labels: [&'static str; 2],
}

const REQUESTS: Counters = Counters {
    name: "ipamd_requests_total",
    help: "API requests by verb and outcome.",
    labels: ["verb", "outcome"],
};

const EXT_REQUESTS: Counters = Counters {
    name: "ipamd_ext_requests_total",
    help: "Extension operations (e.g. cnikit's firewall) by op and outcome.",
    labels: ["op", "outcome"],
};

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
        *lock(&self.requests).entry((verb, outcome)).or_default() += 1;
        let secs = took.as_secs_f64();
        let mut l = lock(&self.latency);
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
        *lock(&self.ext)
            .entry((op.to_string(), outcome))
            .or_default() += 1;
        self.observe("ext", outcome, took);
    }

    pub(crate) fn render(&self, usage: &[NetworkUsage]) -> String {
        let mut out = String::new();
        REQUESTS.render(&mut out, &lock(&self.requests));
        self.render_latency(&mut out);
        EXT_REQUESTS.render(&mut out, &lock(&self.ext));
        let help = "Addresses leased, per network.";
        let in_use = usage.iter().map(|u| (&u.network, u.in_use));
        per_network(&mut out, "ipamd_leases_in_use", help, in_use);
        let help = "Addresses still free in the network's last requested range sets.";
        let free = usage.iter().filter_map(|u| Some((&u.network, u.free?)));
        per_network(&mut out, "ipamd_leases_free", help, free);
        let help = "fsync calls made on lease store files.";
        let fsyncs = FSYNCS.load(Ordering::Relaxed);
        single(&mut out, "ipamd_fsyncs_total", "counter", help, fsyncs);
        out
    }

    fn render_latency(&self, out: &mut String) {
        let name = "ipamd_request_duration_seconds";
        let help = "API request latency, including fsync.";
        family(out, name, "histogram", help);
        for (verb, h) in lock(&self.latency).iter() {
            let buckets = BUCKETS.iter().copied().zip(h.counts);
            histogram(
                out,
                name,
                &format!("verb=\"{verb}\""),
                buckets,
                h.count,
                h.sum,
            );
        }
    }
}

impl Counters {
    fn render<A: Display, B: Display>(&self, out: &mut String, series: &BTreeMap<(A, B), u64>) {
        let Counters { name, help, labels } = self;
        let [a, b] = labels;
        family(out, name, "counter", help);
        for ((x, y), n) in series {
            let _ = writeln!(out, "{name}{{{a}=\"{x}\",{b}=\"{y}\"}} {n}");
        }
    }
}

/// A gauge family with a series per network.
fn per_network<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    values: impl Iterator<Item = (&'a String, u128)>,
) {
    family(out, name, "gauge", help);
    for (network, v) in values {
        let _ = writeln!(out, "{name}{{network=\"{network}\"}} {v}");
    }
}

/// A counter map, also after a panic while it was held: counts stay usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
