//! What the scale run (`scale.rs`) reads besides the daemons' answers: etcd's floor (bare
//! calls through etcd-client, the crate the daemon uses, from the bench), etcd's own
//! /metrics, the daemons' /metrics, and /proc figures of the child processes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::percentile;

/// A bench-side etcd client on its own single-threaded runtime.
pub(crate) struct Etcd {
    rt: tokio::runtime::Runtime,
    client: etcd_client::Client,
}

/// p50 and p99 of one kind of bare etcd call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Floor {
    pub p50: Duration,
    pub p99: Duration,
}

fn err(e: etcd_client::Error) -> String {
    format!("etcd (bench client): {e}")
}

impl Etcd {
    pub(crate) fn connect(endpoint: &str) -> Result<Etcd, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let client = rt
            .block_on(etcd_client::Client::connect([endpoint], None))
            .map_err(err)?;
        Ok(Etcd { rt, client })
    }

    /// The store's revision now: every write bumps it, reads and lease renewals do not.
    pub(crate) fn revision(&mut self) -> Result<i64, String> {
        let resp = self
            .rt
            .block_on(self.client.get("/cnikit/poolset", None))
            .map_err(err)?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }

    /// The value of `key`, if it exists.
    pub(crate) fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let resp = self.rt.block_on(self.client.get(key, None)).map_err(err)?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Keys under `prefix`, and their bytes (keys + values): what one list of it carries.
    pub(crate) fn list_size(&mut self, prefix: &str) -> Result<(usize, usize), String> {
        let opts = GetOptions::new().with_prefix();
        let resp = self
            .rt
            .block_on(self.client.get(prefix, Some(opts)))
            .map_err(err)?;
        let bytes = resp
            .kvs()
            .iter()
            .map(|kv| kv.key().len() + kv.value().len())
            .sum();
        Ok((resp.kvs().len(), bytes))
    }

    /// `n` sequential calls of each kind a claim makes, bare (see [`Etcd::claim_like`]).
    pub(crate) fn floors(
        &mut self,
        key: &str,
        prefix: &str,
        n: usize,
    ) -> Result<[Floor; 3], String> {
        let mut t: [Vec<Duration>; 3] = Default::default();
        for i in 0..n {
            let one = self.claim_like(key, prefix, &format!("floor-{i}"))?;
            for (v, d) in t.iter_mut().zip(one) {
                v.push(d);
            }
        }
        Ok(t.map(|mut v| {
            v.sort();
            Floor {
                p50: percentile(&v, 0.5),
                p99: percentile(&v, 0.99),
            }
        }))
    }

    /// The calls a claim makes, bare, each timed: a get of `key` (the pool's spec), a list
    /// of `prefix` (the pool's blocks) and a transaction writing a scratch key (named after
    /// `tag`, outside /cnikit) only if absent, as a claim writes its block.
    pub(crate) fn claim_like(
        &mut self,
        key: &str,
        prefix: &str,
        tag: &str,
    ) -> Result<[Duration; 3], String> {
        let value = br#"{"node":"node-000","network":"scale","inUse":0}"#.to_vec();
        let started = Instant::now();
        self.rt.block_on(self.client.get(key, None)).map_err(err)?;
        let get = started.elapsed();
        let started = Instant::now();
        let opts = GetOptions::new().with_prefix();
        self.rt
            .block_on(self.client.get(prefix, Some(opts)))
            .map_err(err)?;
        let list = started.elapsed();
        let scratch = format!("/cnikit-bench/{}/{tag}", std::process::id());
        let when = vec![Compare::create_revision(
            scratch.clone(),
            CompareOp::Equal,
            0,
        )];
        let txn = Txn::new()
            .when(when)
            .and_then(vec![TxnOp::put(scratch, value, None)]);
        let started = Instant::now();
        self.rt.block_on(self.client.txn(txn)).map_err(err)?;
        Ok([get, list, started.elapsed()])
    }
}

/// Run `work` while a second client makes the calls of a claim, bare, every 5 ms (etcd's
/// floor under the same load); returns what `work` returned and the probes' total times.
pub(crate) fn floor_during<T>(
    endpoint: &str,
    (key, prefix): (&str, &str),
    work: impl FnOnce() -> T,
) -> Result<(T, Vec<Duration>), String> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let probe = sc.spawn(|| -> Result<Vec<Duration>, String> {
            let mut etcd = Etcd::connect(endpoint)?;
            let mut out = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let one = etcd.claim_like(key, prefix, &format!("probe-{}", out.len()))?;
                out.push(one.iter().sum());
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(out)
        });
        let res = work();
        stop.store(true, Ordering::Relaxed);
        let times = probe.join().map_err(|_| "the etcd probe panicked")??;
        Ok((res, times))
    })
}

/// etcd's /metrics (HTTP/1.0, so that the answer is not chunked).
pub(crate) fn etcd_metrics(endpoint: &str) -> Result<String, String> {
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("etcd {addr}: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut out = String::new();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .and_then(|()| s.read_to_string(&mut out).map(|_| ()))
        .map_err(|e| format!("etcd /metrics: {e}"))?;
    Ok(out)
}

/// A daemon's /metrics text (the same GET as `metric`, all of it).
pub(crate) fn scrape(sock: &Path) -> Option<String> {
    let mut s = std::os::unix::net::UnixStream::connect(sock).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ipamd\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The sum of the samples of `name` whose labels contain each of `labels` (Prometheus text).
pub(crate) fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (lab, val) = match rest.strip_prefix('{') {
                Some(r) => r.split_once('}')?,
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            if !labels.iter().all(|x| lab.contains(x)) {
                return None;
            }
            val.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// etcd's gRPC calls started, by method (`grpc_server_started_total`).
pub(crate) fn calls_by_method(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("grpc_server_started_total{") else {
            continue;
        };
        let Some((labels, val)) = rest.split_once('}') else {
            continue;
        };
        let method = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("grpc_method=\""))
            .map(|m| m.trim_end_matches('"').to_string());
        if let (Some(m), Ok(v)) = (method, val.trim().parse::<f64>()) {
            *out.entry(m).or_default() += v;
        }
    }
    out
}

/// Resident memory of a process, kB (0 if gone).
pub(crate) fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) a process used so far, seconds.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// The 1, 5 and 15-minute load averages.
pub(crate) fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}
