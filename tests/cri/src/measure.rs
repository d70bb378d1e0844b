//! Item 8: sequential pod churn through the CRI, latency of each call as kubelet sees it.

use crate::cri::{Cri, PodSpec, R};
use k8s_cri::v1::Protocol;
use std::io::Write;
use std::time::Instant;

/// CLOCK_MONOTONIC in ns: the clock of the kernel's process events (proctrace.rs), so the
/// breakdown can place plugin execs between a call's start and end.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    // nearest rank
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// `count` pods (after one warm-up) with one TCP hostPort each: RunPodSandbox, StopPodSandbox,
/// RemovePodSandbox, one after another; prints p50/p99 in ms. `host_network`: pods in the
/// node's netns and without ports, so containerd calls no CNI plugin (the runtime's floor).
/// `calls`: a file to append "label pod call start_ns end_ns" to, one line per measured call,
/// for the breakdown (breakdown.rs).
pub async fn run(cri: &Cri, count: usize, label: &str, host_network: bool, calls: &str) -> R<()> {
    let (mut run, mut stop, mut remove) = (Vec::new(), Vec::new(), Vec::new());
    let mut log = String::new();
    let t_all = Instant::now();
    for i in 0..=count {
        let spec = PodSpec {
            name: format!("m-{label}-{i}").replace(['+', ' '], "-"),
            ports: if host_network {
                vec![]
            } else {
                vec![(Protocol::Tcp, 80, 8300)]
            },
            host_network,
        };
        let (t, n0) = (Instant::now(), mono_ns());
        let id = cri.run_sandbox(&spec).await?;
        let (t_run, n1) = (t.elapsed(), mono_ns());
        let t = Instant::now();
        cri.stop(&id).await?;
        let (t_stop, n2) = (t.elapsed(), mono_ns());
        let t = Instant::now();
        cri.remove(&id).await?;
        let (t_remove, n3) = (t.elapsed(), mono_ns());
        if i > 0 {
            let l = label.replace(' ', "_");
            log += &format!(
                "{l} {i} run {n0} {n1}\n{l} {i} stop {n1} {n2}\n{l} {i} remove {n2} {n3}\n"
            );
            run.push(t_run.as_secs_f64() * 1e3);
            stop.push(t_stop.as_secs_f64() * 1e3);
            remove.push(t_remove.as_secs_f64() * 1e3);
        }
    }
    if !calls.is_empty() {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(calls)
            .map_err(|e| format!("{calls}: {e}"))?;
        f.write_all(log.as_bytes())
            .map_err(|e| format!("{calls}: {e}"))?;
    }
    let line = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!("{:8.1} {:8.1}", pct(v, 50.0), pct(v, 99.0))
    };
    println!(
        "{label:<14} {count:5} | {} | {} | {} | {:.1} s",
        line(&mut run),
        line(&mut stop),
        line(&mut remove),
        t_all.elapsed().as_secs_f64()
    );
    Ok(())
}
