//! `cnikit ipamd pool check`: an online consistency check of one pool against etcd and this
//! node's store, read as `ipamd leases` reads it (no lock, no pause of ADDs).

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::Serialize;

use super::etcd::{patiently, with_etcd, Etcd};
use super::records::now_ms;
use super::show::{absences, live_nodes, not_found, read_blocks, read_spec, ClaimedBlock};
use super::{blocks, EtcdOptions};
use crate::api::LeaseInfo;
use crate::Error;

/// What `pool check` found; empty `findings` = consistent.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    pub pool: String,
    pub node: String,
    pub blocks: usize,
    pub leases: usize,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// "orphaned", "reclaimOverdue", "outsidePool", "overlap", "inUseMismatch",
    /// "leaseInLostBlock".
    pub kind: String,
    pub block: Option<IpNet>,
    /// What was found and what to do, for a person.
    pub detail: String,
}

fn finding(kind: &str, block: Option<IpNet>, detail: String) -> Finding {
    Finding {
        kind: kind.to_string(),
        block,
        detail,
    }
}

/// Check pool `pool` as seen from node `node`, whose leases `leases` reads. A disagreement
/// of `inUse` with the leases is read again after the daemons' next usage push before it
/// is reported (the counts lag by design).
pub fn check_pool_store(
    opts: &EtcdOptions,
    pool: &str,
    node: &str,
    mut leases: impl FnMut() -> Result<Vec<LeaseInfo>, Error>,
) -> Result<CheckReport, Error> {
    super::check_pool(pool)?;
    super::check_node(node)?;
    with_etcd(opts, |etcd| async move {
        let what = format!("pool check {pool}");
        let first = leases()?;
        let mut report = patiently(&what, || check(&etcd, pool, node, &first)).await?;
        if report.findings.iter().any(|f| f.kind == "inUseMismatch") {
            tokio::time::sleep(super::tasks::SYNC_EVERY + Duration::from_secs(1)).await;
            let again = leases()?;
            report = patiently(&what, || check(&etcd, pool, node, &again)).await?;
        }
        Ok(report)
    })
}

async fn check(
    etcd: &Etcd,
    pool: &str,
    node: &str,
    leases: &[LeaseInfo],
) -> Result<CheckReport, Error> {
    let Some((spec, _)) = read_spec(etcd, pool).await? else {
        return Err(not_found(pool));
    };
    let claimed = read_blocks(etcd, pool).await?;
    let live = live_nodes(etcd).await?;
    let absent = absences(etcd).await?;
    let mut out = Vec::new();
    for b in &claimed {
        let owner = &b.record.node;
        if b.record.reclaimed.is_some() || live.contains(owner) {
            continue;
        }
        match absent.get(owner) {
            Some((since, _)) if spec.reclaim_after > 0 => {
                let gone = now_ms().saturating_sub(*since) / 1000;
                // Two looks of the reclaimer past the due time.
                if gone > spec.reclaim_after.saturating_add(4) {
                    out.push(finding("reclaimOverdue", Some(b.cidr), format!(
                        "block {} of node {owner}: the node has had no etcd session for {gone} s, past the pool's reclaimAfter {} s, and the block is not reclaimed: is any cnikit ipamd daemon with a session running?",
                        b.cidr, spec.reclaim_after
                    )));
                }
            }
            _ => out.push(finding("orphaned", Some(b.cidr), format!(
                "block {} of node {owner}: the node has no etcd session{}",
                b.cidr,
                if spec.reclaim_after > 0 {
                    " and no reclaimer has seen it gone yet: is any cnikit ipamd daemon with a session running?"
                } else {
                    "; the pool reclaims only by hand: `cnikit ipamd pool release-node` once the node is gone for good, or set --reclaim-after"
                }
            ))),
        }
    }
    out.extend(shape_findings(&spec, &claimed));
    out.extend(usage_findings(node, &claimed, leases));
    out.extend(lost_lease_findings(&spec, node, &claimed, leases));
    Ok(CheckReport {
        pool: pool.to_string(),
        node: node.to_string(),
        blocks: claimed.len(),
        leases: leases.len(),
        findings: out,
    })
}

/// Blocks outside the pool's CIDRs (or of another size), and blocks that overlap.
fn shape_findings(spec: &super::PoolSpec, claimed: &[ClaimedBlock]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, b) in claimed.iter().enumerate() {
        if blocks::index_of(spec, &b.cidr).is_none() {
            out.push(finding("outsidePool", Some(b.cidr), format!(
                "block {} is not a /{} block of the pool's CIDRs ({}); no claim makes such a block: was the key written by hand?",
                b.cidr, spec.block_size, spec.cidr_list()
            )));
        }
        if let Some(o) = claimed[..i]
            .iter()
            .find(|o| blocks::overlap(&o.cidr, &b.cidr))
        {
            out.push(finding(
                "overlap",
                Some(b.cidr),
                format!(
                    "blocks {} and {} overlap: addresses in both may be handed out twice",
                    o.cidr, b.cidr
                ),
            ));
        }
    }
    out
}

/// This node's blocks whose `inUse` disagrees with its leases.
fn usage_findings(node: &str, claimed: &[ClaimedBlock], leases: &[LeaseInfo]) -> Vec<Finding> {
    claimed
        .iter()
        .filter(|b| b.record.node == node && b.record.reclaimed.is_none())
        .filter_map(|b| {
            let held = in_block(leases, &b.cidr, &b.record.network).count() as u64;
            (held != b.record.in_use).then(|| finding("inUseMismatch", Some(b.cidr), format!(
                "block {} of network {}: etcd says {} address(es) in use, this node's journal holds {held}; the daemon pushes counts every few seconds: is it running and reaching etcd?",
                b.cidr, b.record.network, b.record.in_use
            )))
        })
        .collect()
}

/// This node's leases in the pool's CIDRs that lie in no block it owns for their network.
fn lost_lease_findings(
    spec: &super::PoolSpec,
    node: &str,
    claimed: &[ClaimedBlock],
    leases: &[LeaseInfo],
) -> Vec<Finding> {
    let mut out = Vec::new();
    for l in leases
        .iter()
        .filter(|l| spec.cidrs.iter().any(|c| c.contains(&l.address)))
    {
        let block = claimed.iter().find(|b| b.cidr.contains(&l.address));
        let ours = block.is_some_and(|b| b.record.is_owned_by(node, &l.network));
        if ours {
            continue;
        }
        let whose = match block {
            None => "a block no node owns".to_string(),
            Some(b) if b.record.reclaimed.is_some() => {
                format!("block {}, reclaimed from this node and quarantined", b.cidr)
            }
            Some(b) => format!(
                "block {} of node {} (network {})",
                b.cidr, b.record.node, b.record.network
            ),
        };
        out.push(finding("leaseInLostBlock", block.map(|b| b.cidr), format!(
            "{} of container {} (network {}) lies in {whose}: this node lost the block (reclaimed while cut off from etcd, or release-node --force); another node may hand the address out: delete the pod, whose DEL releases it here",
            l.address, l.container_id, l.network
        )));
    }
    out
}

fn in_block<'a>(
    leases: &'a [LeaseInfo],
    block: &'a IpNet,
    network: &'a str,
) -> impl Iterator<Item = &'a IpAddr> {
    leases
        .iter()
        .filter(move |l| l.network == network && block.contains(&l.address))
        .map(|l| &l.address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{BlockRecord, PoolSpec};

    /// A pool of 10.0.0.0/24 in /26 blocks.
    fn spec(reclaim_after: u64) -> PoolSpec {
        PoolSpec {
            cidrs: vec!["10.0.0.0/24".parse().unwrap()],
            block_size: 26,
            reclaim_after,
            draining: Vec::new(),
        }
    }

    fn lease(addr: &str) -> LeaseInfo {
        LeaseInfo {
            network: "pods".into(),
            address: addr.parse().unwrap(),
            container_id: format!("c-{addr}"),
            ifname: "eth0".into(),
            boot_id: String::new(),
            created_unix: 0,
        }
    }

    fn kinds(f: &[Finding]) -> Vec<(&str, String)> {
        f.iter()
            .map(|f| {
                (
                    f.kind.as_str(),
                    f.block.map(|b| b.to_string()).unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn blocks_outside_the_pool_and_overlapping_are_found() {
        let spec = spec(0);
        let claimed = [
            ClaimedBlock::of("10.0.0.0/26", "a", 0),
            ClaimedBlock::of("10.0.0.0/27", "b", 0),
            ClaimedBlock::of("10.9.0.0/26", "c", 0),
        ];
        assert_eq!(
            kinds(&shape_findings(&spec, &claimed)),
            [
                ("outsidePool", "10.0.0.0/27".into()),
                ("overlap", "10.0.0.0/27".into()),
                ("outsidePool", "10.9.0.0/26".into())
            ]
        );
    }

    #[test]
    fn usage_and_lost_leases_are_found_for_this_node_only() {
        let spec = spec(60);
        let mut quarantined = ClaimedBlock::of("10.0.0.128/26", "", 0);
        quarantined.record = BlockRecord::quarantined("a", 1);
        let claimed = [
            ClaimedBlock::of("10.0.0.0/26", "a", 2),
            ClaimedBlock::of("10.0.0.64/26", "b", 5),
            quarantined,
        ];
        let leases = [
            lease("10.0.0.2"),
            lease("10.0.0.70"),
            lease("10.0.0.130"),
            lease("10.0.0.200"),
            lease("10.7.0.1"),
        ];
        assert_eq!(
            kinds(&usage_findings("a", &claimed, &leases)),
            [("inUseMismatch", "10.0.0.0/26".into())]
        );
        let lost = lost_lease_findings(&spec, "a", &claimed, &leases);
        assert_eq!(
            kinds(&lost),
            [
                ("leaseInLostBlock", "10.0.0.64/26".into()),
                ("leaseInLostBlock", "10.0.0.128/26".into()),
                ("leaseInLostBlock", String::new())
            ]
        );
        assert!(lost[1].detail.contains("quarantined"), "{}", lost[1].detail);
        assert!(usage_findings("c", &claimed, &leases).is_empty());
    }
}
