//! Reading a pool back from etcd: its spec, its blocks with their state, and its usage
//! (`pool show`, `pool check`, /metrics and the reclaimer all read through here).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde::Serialize;

use super::etcd::Etcd;
use super::records::{now_ms, Absence, BlockRecord, PoolSpec};
use super::{absent_key, blocks, blocks_prefix, node_key, pool_key};
use crate::{Error, ErrorKind};

/// `pool show --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolShow {
    pub name: String,
    /// The first CIDR (what one-CIDR pools showed).
    pub cidr: IpNet,
    pub cidrs: Vec<IpNet>,
    pub draining: Vec<IpNet>,
    pub block_size: u8,
    /// Seconds; 0 = manual reclaim only.
    pub reclaim_after: u64,
    pub usage: Usage,
    pub blocks: Vec<BlockShow>,
}

/// Addresses and blocks of the CIDRs new blocks come from (draining ones are left out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Leasable addresses (network, gateway and last of each block excluded).
    pub addresses: u64,
    /// Leases, as the owning nodes last pushed them.
    pub allocated: u64,
    pub free: u64,
    /// allocated / addresses × 100, rounded to one decimal.
    pub percent: f64,
    pub blocks: u64,
    /// Blocks some node owns (its session live or not).
    pub blocks_owned: u64,
    pub blocks_quarantined: u64,
    /// Never used or given back: what claims take first.
    pub blocks_free: u64,
}

/// One block of `pool show --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockShow {
    pub cidr: IpNet,
    /// The owner; empty when quarantined.
    pub node: String,
    pub network: String,
    pub in_use: u64,
    /// "owned" (the owner holds a session), "orphaned" (it does not), "quarantined"
    /// (reclaimed, claimed again only when no free block is left).
    pub state: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// Orphaned: how long the reclaimer has seen the owner without a session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub absent_for_seconds: Option<u64>,
    /// Quarantined: the node it was reclaimed from, and when (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaimed_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaimed_at_ms: Option<u64>,
}

/// A block as read from etcd.
#[derive(Debug, Clone)]
pub(crate) struct ClaimedBlock {
    pub cidr: IpNet,
    pub record: BlockRecord,
    pub mod_revision: i64,
}

#[cfg(test)]
impl ClaimedBlock {
    /// A block of network "pods" owned by `node`, as a test reads it from etcd.
    pub(crate) fn of(cidr: &str, node: &str, in_use: u64) -> ClaimedBlock {
        ClaimedBlock {
            cidr: cidr.parse().expect("a block CIDR"),
            record: BlockRecord::owned(node, "pods", in_use),
            mod_revision: 1,
        }
    }
}

/// The pool's spec and its key's mod revision (what a claim or update compares).
pub(crate) async fn read_spec(etcd: &Etcd, name: &str) -> Result<Option<(PoolSpec, i64)>, Error> {
    let Some(kv) = etcd.get(&pool_key(name)).await? else {
        return Ok(None);
    };
    let spec: PoolSpec = serde_json::from_slice(&kv.value).map_err(|e| {
        Error::internal(format!(
            "etcd key {} holds no pool spec ({e}); fix or delete it with etcdctl",
            kv.key
        ))
    })?;
    Ok(Some((spec, kv.mod_revision)))
}

/// Every pool: name and spec (keys that hold no spec are skipped).
pub(crate) async fn read_pools(etcd: &Etcd) -> Result<Vec<(String, PoolSpec)>, Error> {
    Ok(read_all(etcd)
        .await?
        .into_iter()
        .map(|(name, spec, _)| (name, spec))
        .collect())
}

/// Every pool with its blocks, from one list of `/cnikit/pools/` (etcd lists by prefix
/// only, so the specs come with the blocks anyway).
pub(crate) async fn read_all(
    etcd: &Etcd,
) -> Result<Vec<(String, PoolSpec, Vec<ClaimedBlock>)>, Error> {
    let prefix = format!("{}/pools/", super::PREFIX);
    let mut pools: BTreeMap<String, (Option<PoolSpec>, Vec<ClaimedBlock>)> = BTreeMap::new();
    for kv in etcd.list(&prefix).await? {
        let Some(rest) = kv.key.strip_prefix(&prefix) else {
            continue;
        };
        match rest.split_once("/blocks/") {
            None if !rest.contains('/') => {
                if let Ok(spec) = serde_json::from_slice::<PoolSpec>(&kv.value) {
                    pools.entry(rest.to_string()).or_default().0 = Some(spec);
                }
            }
            Some((pool, cidr)) => {
                let cidr = cidr.parse().ok();
                let record = serde_json::from_slice::<BlockRecord>(&kv.value).ok();
                if let (Some(cidr), Some(record)) = (cidr, record) {
                    let block = ClaimedBlock {
                        cidr,
                        record,
                        mod_revision: kv.mod_revision,
                    };
                    pools.entry(pool.to_string()).or_default().1.push(block);
                }
            }
            None => {}
        }
    }
    Ok(pools
        .into_iter()
        .filter_map(|(name, (spec, blocks))| spec.map(|s| (name, s, blocks)))
        .collect())
}

/// The pool's blocks (unparsable keys are reported and skipped: they are not ours).
pub(crate) async fn read_blocks(etcd: &Etcd, name: &str) -> Result<Vec<ClaimedBlock>, Error> {
    let prefix = blocks_prefix(name);
    let mut out = Vec::new();
    for kv in etcd.list(&prefix).await? {
        let cidr = kv.key.strip_prefix(&prefix).and_then(|c| c.parse().ok());
        let record = serde_json::from_slice::<BlockRecord>(&kv.value).ok();
        match (cidr, record) {
            (Some(cidr), Some(record)) => out.push(ClaimedBlock {
                cidr,
                record,
                mod_revision: kv.mod_revision,
            }),
            _ => crate::log_at!(
                crate::log::Level::Warn,
                "etcd key {} is not a block record; ignored",
                kv.key
            ),
        }
    }
    Ok(out)
}

/// Nodes whose session key exists (their daemon runs, or died less than a TTL ago).
pub(crate) async fn live_nodes(etcd: &Etcd) -> Result<HashSet<String>, Error> {
    let prefix = node_key("");
    Ok(etcd
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|kv| kv.key.strip_prefix(&prefix).map(str::to_string))
        .collect())
}

/// Absence markers: node → (since when, ms since the epoch; the marker's mod revision).
pub(crate) async fn absences(etcd: &Etcd) -> Result<HashMap<String, (u64, i64)>, Error> {
    let prefix = absent_key("");
    let mut out = HashMap::new();
    for kv in etcd.list(&prefix).await? {
        let Some(node) = kv.key.strip_prefix(&prefix) else {
            continue;
        };
        if let Ok(a) = serde_json::from_slice::<Absence>(&kv.value) {
            out.insert(node.to_string(), (a.since_ms, kv.mod_revision));
        }
    }
    Ok(out)
}

pub(crate) fn not_found(name: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("pool {name} does not exist (create it with `cnikit ipamd pool create {name} --cidr CIDR`)"),
    )
}

/// The pool as `pool show` gives it.
pub(crate) async fn show(etcd: &Etcd, name: &str) -> Result<PoolShow, Error> {
    super::check_pool(name)?;
    let Some((spec, _)) = read_spec(etcd, name).await? else {
        return Err(not_found(name));
    };
    let blocks = read_blocks(etcd, name).await?;
    let live = live_nodes(etcd).await?;
    let absent = absences(etcd).await?;
    Ok(view(name, &spec, blocks, &live, &absent, now_ms()))
}

/// The pool's blocks with their states, and its usage.
pub(crate) fn view(
    name: &str,
    spec: &PoolSpec,
    mut claimed: Vec<ClaimedBlock>,
    live: &HashSet<String>,
    absent: &HashMap<String, (u64, i64)>,
    now_ms: u64,
) -> PoolShow {
    claimed.sort_by_key(|b| (blocks::index_of(spec, &b.cidr), b.cidr));
    let shown: Vec<BlockShow> = claimed
        .into_iter()
        .map(|b| block_show(spec, b, live, absent, now_ms))
        .collect();
    PoolShow {
        name: name.to_string(),
        cidr: spec.cidrs[0],
        cidrs: spec.cidrs.clone(),
        draining: spec.draining.clone(),
        block_size: spec.block_size,
        reclaim_after: spec.reclaim_after,
        usage: usage(spec, &shown),
        blocks: shown,
    }
}

fn block_show(
    spec: &PoolSpec,
    b: ClaimedBlock,
    live: &HashSet<String>,
    absent: &HashMap<String, (u64, i64)>,
    now_ms: u64,
) -> BlockShow {
    let r = b.record;
    let (state, absent_for) = match (&r.reclaimed, live.contains(&r.node)) {
        (Some(_), _) => ("quarantined", None),
        (None, true) => ("owned", None),
        (None, false) => {
            let since = absent
                .get(&r.node)
                .map(|(ms, _)| now_ms.saturating_sub(*ms) / 1000);
            ("orphaned", since)
        }
    };
    BlockShow {
        draining: blocks::is_draining(spec, &b.cidr),
        cidr: b.cidr,
        node: r.node,
        network: r.network,
        in_use: r.in_use,
        state: state.to_string(),
        absent_for_seconds: absent_for,
        reclaimed_from: r.reclaimed.as_ref().map(|q| q.from.clone()),
        reclaimed_at_ms: r.reclaimed.as_ref().map(|q| q.at_ms),
    }
}

fn usage(spec: &PoolSpec, shown: &[BlockShow]) -> Usage {
    let counted: Vec<&BlockShow> = shown
        .iter()
        .filter(|b| !b.draining && blocks::index_of(spec, &b.cidr).is_some())
        .collect();
    let total_blocks = u64::try_from(blocks::claimable_count(spec)).unwrap_or(u64::MAX);
    let per_block = u64::try_from(blocks::capacity(spec)).unwrap_or(u64::MAX);
    let addresses = total_blocks.saturating_mul(per_block);
    let allocated: u64 = counted.iter().map(|b| b.in_use).sum();
    let quarantined = counted.iter().filter(|b| b.state == "quarantined").count() as u64;
    let percent = if addresses == 0 {
        0.0
    } else {
        (allocated as f64 * 1000.0 / addresses as f64).round() / 10.0
    };
    Usage {
        addresses,
        allocated,
        free: addresses.saturating_sub(allocated),
        percent,
        blocks: total_blocks,
        blocks_owned: counted.len() as u64 - quarantined,
        blocks_quarantined: quarantined,
        blocks_free: total_blocks.saturating_sub(counted.len() as u64),
    }
}

/// The pools as the reclaimer last read them, for /metrics: that daemon reads every block
/// each look anyway, so the pool-wide gauges cost etcd nothing more (a scrape of every node
/// reading the pool would cost nodes × blocks).
#[derive(Default)]
pub(crate) struct ViewCache {
    views: Mutex<BTreeMap<String, (Instant, PoolShow)>>,
}

impl ViewCache {
    /// Views older than this are left out: their reader lost the role or etcd.
    const FRESH: Duration = Duration::from_secs(10);

    /// Keep exactly `views` (pools deleted since are dropped).
    pub(crate) fn replace(&self, views: Vec<PoolShow>) {
        let now = Instant::now();
        *self.views.lock().unwrap_or_else(|e| e.into_inner()) = views
            .into_iter()
            .map(|v| (v.name.clone(), (now, v)))
            .collect();
    }

    /// Every pool's usage read within [`ViewCache::FRESH`].
    pub(crate) fn fresh(&self) -> Vec<(String, Usage)> {
        let views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        views
            .iter()
            .filter(|(_, (at, _))| at.elapsed() < Self::FRESH)
            .map(|(name, (_, v))| (name.clone(), v.usage))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_usage() {
        let spec = PoolSpec {
            cidrs: vec![
                "10.0.0.0/24".parse().unwrap(),
                "10.0.1.0/24".parse().unwrap(),
            ],
            block_size: 26,
            reclaim_after: 60,
            draining: vec!["10.0.1.0/24".parse().unwrap()],
        };
        let mut q = ClaimedBlock::of("10.0.0.128/26", "", 0);
        q.record = BlockRecord::quarantined("n3", 1_000);
        let claimed = vec![
            ClaimedBlock::of("10.0.1.0/26", "n1", 5),
            ClaimedBlock::of("10.0.0.64/26", "n2", 30),
            ClaimedBlock::of("10.0.0.0/26", "n1", 31),
            q,
        ];
        let live: HashSet<String> = ["n1".to_string()].into();
        let absent: HashMap<String, (u64, i64)> = [("n2".to_string(), (10_000, 3))].into();
        let v = view("p", &spec, claimed, &live, &absent, 70_000);
        let states: Vec<(String, &str)> = v
            .blocks
            .iter()
            .map(|b| (b.cidr.to_string(), b.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                ("10.0.0.0/26".into(), "owned"),
                ("10.0.0.64/26".into(), "orphaned"),
                ("10.0.0.128/26".into(), "quarantined"),
                ("10.0.1.0/26".into(), "owned"),
            ]
        );
        assert_eq!(v.blocks[1].absent_for_seconds, Some(60));
        assert!(v.blocks[3].draining);
        let u = v.usage;
        assert_eq!((u.addresses, u.allocated, u.free), (244, 61, 183));
        assert_eq!(u.percent, 25.0);
        assert_eq!(
            (
                u.blocks,
                u.blocks_owned,
                u.blocks_quarantined,
                u.blocks_free
            ),
            (4, 2, 1, 1)
        );
    }
}
