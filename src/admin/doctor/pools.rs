//! The cluster-pool check of `cnikit doctor`, from the daemon's /metrics: blocks this node
//! lost while cut off from etcd (another node may hand out the addresses its pods still
//! use there) and a node that hands out no new address (fenced).

use super::Check;
use std::path::Path;
use std::time::Duration;

/// The checks, when the daemon at `socket` answers and serves cluster pools; none else.
pub fn pools(socket: &Path) -> Vec<Check> {
    use ipamd::client::{Daemon, Outcome};
    let daemon = Daemon::new(socket).with_timeouts(Duration::from_secs(2), Duration::from_secs(10));
    match daemon.send("GET", "/metrics", &[], None) {
        Outcome::Answered { status: 200, body } => judge(&String::from_utf8_lossy(&body)),
        _ => Vec::new(),
    }
}

/// The pure part: read the pool series of a /metrics text.
pub fn judge(metrics: &str) -> Vec<Check> {
    let value = |line: &str| line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
    let mut checks = Vec::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("ipamd_pool_blocks_lost{pool=\"") else {
            continue;
        };
        let (Some((pool, _)), Some(n)) = (rest.split_once('"'), value(line)) else {
            continue;
        };
        let check = format!("pool {pool}");
        checks.push(if n > 0.0 {
            Check::fail(
                check,
                format!(
                    "{n} block(s) of this node were reclaimed while it was cut off from etcd; its pods there keep addresses another node may hand out"
                ),
                format!(
                    "cnikit ipamd pool check {pool} --etcd-endpoints … lists those leases; delete their pods (their DEL releases them here)"
                ),
            )
        } else {
            Check::ok(check, "no block lost")
        });
    }
    if metrics.lines().any(|l| l == "ipamd_cluster_fenced 1") {
        checks.push(Check::warn(
            "pools",
            "this node hands out no new address from pools that reclaim: it cannot renew its etcd session, or has not yet confirmed its blocks",
            "check that the node reaches a quorum of etcd members: journalctl -u ipamd.service",
        ));
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_blocks_fail_and_fencing_warns() {
        let text = "# HELP x\nipamd_pool_blocks_lost{pool=\"pods4\"} 2\nipamd_pool_blocks_lost{pool=\"pods6\"} 0\nipamd_cluster_fenced 1\n";
        let checks = judge(text);
        let lines: Vec<String> = checks.iter().map(|c| c.line()).collect();
        assert_eq!(checks.len(), 3, "{lines:?}");
        assert!(
            lines[0].starts_with("fail  pool pods4: 2 block(s)"),
            "{lines:?}"
        );
        assert!(lines[0].contains("pool check pods4"));
        assert!(lines[1].starts_with("ok    pool pods6"), "{lines:?}");
        assert!(lines[2].starts_with("warn  pools:"), "{lines:?}");
        assert!(judge("ipamd_cluster_fenced 0\n").is_empty());
    }
}
