//! Item 8: sequential pod churn through the CRI, latency of each call as kubelet sees it.

use crate::cri::{Cri, PodSpec, R};
use k8s_cri::v1::Protocol;
use std::time::Instant;

fn pct(sorted: &[f64], p: f64) -> f64 {
    // nearest rank
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// `count` pods (after one warm-up) with one TCP hostPort each: RunPodSandbox, StopPodSandbox,
/// RemovePodSandbox, one after another; prints p50/p99 in ms. `host_network`: pods in the
/// node's netns and without ports, so containerd calls no CNI plugin (the runtime's floor).
pub async fn run(cri: &Cri, count: usize, label: &str, host_network: bool) -> R<()> {
    let (mut run, mut stop, mut remove) = (Vec::new(), Vec::new(), Vec::new());
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
        let t = Instant::now();
        let id = cri.run_sandbox(&spec).await?;
        let t_run = t.elapsed();
        let t = Instant::now();
        cri.stop(&id).await?;
        let t_stop = t.elapsed();
        let t = Instant::now();
        cri.remove(&id).await?;
        let t_remove = t.elapsed();
        if i > 0 {
            run.push(t_run.as_secs_f64() * 1e3);
            stop.push(t_stop.as_secs_f64() * 1e3);
            remove.push(t_remove.as_secs_f64() * 1e3);
        }
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
