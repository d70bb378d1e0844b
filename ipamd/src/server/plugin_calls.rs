//! The daemon's end of [`crate::plugin_calls`]: the reports plugin processes send after
//! answering their runtime, kept as a duration histogram per (plugin, verb), error
//! counters per (plugin, verb, code) and call counters per (network, verb).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::plugin_calls::{decode, CallReport, MAX_REPORT};
use crate::prometheus::{family, histogram, single};

/// Plugin durations, seconds: a plugin call takes from about a millisecond (loopback) to
/// seconds (a DHCP exchange, an IPAM daemon that waits on etcd).
const BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// What reports can make the daemon keep: series beyond these are dropped and counted.
const MAX_SERIES: usize = 512;
const MAX_NETWORKS: usize = 64;

#[derive(Default)]
struct Hist {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct Calls {
    durations: BTreeMap<(String, String), Hist>,
    errors: BTreeMap<(String, String, u32), u64>,
    networks: BTreeMap<(String, String), u64>,
    dropped: u64,
}

#[derive(Default)]
pub(crate) struct PluginCalls {
    calls: Mutex<Calls>,
}

impl PluginCalls {
    /// Count one datagram: a report, or a dropped one.
    pub(crate) fn observe_datagram(&self, datagram: &[u8]) {
        match decode(datagram) {
            Some(r) => self.observe(&r),
            None => self.lock().dropped += 1,
        }
    }

    fn observe(&self, r: &CallReport) {
        let mut c = self.lock();
        let key = (r.plugin.clone(), r.verb.clone());
        if !c.durations.contains_key(&key) && c.durations.len() >= MAX_SERIES {
            c.dropped += 1;
            return;
        }
        let secs = r.micros as f64 / 1e6;
        let h = c.durations.entry(key.clone()).or_default();
        for (n, le) in h.counts.iter_mut().zip(BUCKETS) {
            *n += u64::from(secs <= le);
        }
        h.sum += secs;
        h.count += 1;
        if r.code != 0 && c.errors.len() < MAX_SERIES {
            *c.errors.entry((key.0, key.1, r.code)).or_default() += 1;
        }
        let net = (r.network.clone(), r.verb.clone());
        let known = c.networks.contains_key(&net);
        if !r.network.is_empty() && (known || c.networks.len() < MAX_NETWORKS) {
            *c.networks.entry(net).or_default() += 1;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn render(&self, out: &mut String) {
        let c = self.lock();
        let name = "ipamd_plugin_duration_seconds";
        let help = "CNI plugin calls on this node, from the plugin process's start to its answer, by plugin type and verb (reported by each plugin after it answered).";
        family(out, name, "histogram", help);
        for ((plugin, verb), h) in &c.durations {
            let labels = format!("plugin=\"{plugin}\",verb=\"{verb}\"");
            let buckets = BUCKETS.iter().copied().zip(h.counts);
            histogram(out, name, &labels, buckets, h.count, h.sum);
        }
        let name = "ipamd_plugin_errors_total";
        family(
            out,
            name,
            "counter",
            "CNI plugin calls that failed, by plugin type, verb and CNI error code.",
        );
        for ((plugin, verb, code), n) in &c.errors {
            let _ = writeln!(
                out,
                "{name}{{plugin=\"{plugin}\",verb=\"{verb}\",code=\"{code}\"}} {n}"
            );
        }
        let name = "ipamd_plugin_network_calls_total";
        family(
            out,
            name,
            "counter",
            "CNI plugin calls by network and verb (the first 64 networks seen).",
        );
        for ((network, verb), n) in &c.networks {
            let _ = writeln!(out, "{name}{{network=\"{network}\",verb=\"{verb}\"}} {n}");
        }
        let help = "Plugin reports dropped: malformed, or beyond the series kept.";
        single(
            out,
            "ipamd_plugin_reports_dropped_total",
            "counter",
            help,
            c.dropped,
        );
    }
}

/// Read reports until the daemon stops.
pub(crate) async fn receive(sock: tokio::net::UnixDatagram, calls: Arc<super::Registry>) {
    let mut buf = vec![0u8; MAX_REPORT + 1];
    loop {
        match sock.recv(&mut buf).await {
            Ok(n) if n <= MAX_REPORT => calls.plugin_calls.observe_datagram(&buf[..n]),
            Ok(_) => calls.plugin_calls.observe_datagram(b""),
            // Nothing a datagram socket returns here is worth stopping the counts for.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(plugin: &str, verb: &str, code: u32, micros: u64) -> Vec<u8> {
        let r = CallReport {
            plugin: plugin.into(),
            verb: verb.into(),
            network: "pods".into(),
            code,
            micros,
        };
        serde_json::to_vec(&r).unwrap()
    }

    #[test]
    fn reports_become_histograms_and_error_counts() {
        let calls = PluginCalls::default();
        calls.observe_datagram(&report("bridge", "ADD", 0, 3_000));
        calls.observe_datagram(&report("bridge", "ADD", 11, 20_000));
        calls.observe_datagram(b"{}");
        let mut out = String::new();
        calls.render(&mut out);
        let has = |line: &str| assert!(out.contains(line), "no {line:?} in\n{out}");
        has(
            "ipamd_plugin_duration_seconds_bucket{plugin=\"bridge\",verb=\"ADD\",le=\"0.005\"} 1\n",
        );
        has(
            "ipamd_plugin_duration_seconds_bucket{plugin=\"bridge\",verb=\"ADD\",le=\"0.025\"} 2\n",
        );
        has("ipamd_plugin_duration_seconds_count{plugin=\"bridge\",verb=\"ADD\"} 2\n");
        has("ipamd_plugin_errors_total{plugin=\"bridge\",verb=\"ADD\",code=\"11\"} 1\n");
        has("ipamd_plugin_network_calls_total{network=\"pods\",verb=\"ADD\"} 2\n");
        has("ipamd_plugin_reports_dropped_total 1\n");
    }

    #[test]
    fn series_are_bounded() {
        let calls = PluginCalls::default();
        for i in 0..MAX_SERIES + 10 {
            calls.observe_datagram(&report(&format!("p{i}"), "ADD", 0, 1));
        }
        assert_eq!(calls.lock().durations.len(), MAX_SERIES);
        assert_eq!(calls.lock().dropped, 10);
    }
}
