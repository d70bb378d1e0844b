//! The JSON values kept in etcd: a pool's spec, a block's record, a node's absence.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::Error;

/// A pool as stored under `/cnikit/pools/<pool>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StoredSpec", into = "StoredSpec")]
pub struct PoolSpec {
    /// Every CIDR of the pool in the order added, draining ones too until they go.
    pub cidrs: Vec<IpNet>,
    pub block_size: u8,
    /// Seconds a node's etcd session must have been gone before one live daemon reclaims
    /// its blocks; 0 = only `pool release-node` frees them.
    pub reclaim_after: u64,
    /// CIDRs no new block comes from; each leaves the pool when its last block is released.
    pub draining: Vec<IpNet>,
}

/// The stored form: `cidr` is the first CIDR, as builds before multi-CIDR pools read it
/// (they keep allocating from that one), `cidrs` all of them.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cidr: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cidrs: Vec<IpNet>,
    block_size: u8,
    #[serde(default)]
    reclaim_after: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    draining: Vec<IpNet>,
}

impl TryFrom<StoredSpec> for PoolSpec {
    type Error = String;
    fn try_from(s: StoredSpec) -> Result<PoolSpec, String> {
        let cidrs = match (s.cidrs.is_empty(), s.cidr) {
            (false, _) => s.cidrs,
            (true, Some(one)) => vec![one],
            (true, None) => return Err("a pool spec needs \"cidrs\" (or \"cidr\")".into()),
        };
        Ok(PoolSpec {
            cidrs,
            block_size: s.block_size,
            reclaim_after: s.reclaim_after,
            draining: s.draining,
        })
    }
}

impl From<PoolSpec> for StoredSpec {
    fn from(p: PoolSpec) -> StoredSpec {
        StoredSpec {
            cidr: p.cidrs.first().copied(),
            cidrs: p.cidrs,
            block_size: p.block_size,
            reclaim_after: p.reclaim_after,
            draining: p.draining,
        }
    }
}

impl PoolSpec {
    /// The CIDRs as one string, for messages.
    pub fn cidr_list(&self) -> String {
        let all: Vec<String> = self.cidrs.iter().map(ToString::to_string).collect();
        all.join(",")
    }
}

/// A block as stored under `/cnikit/pools/<pool>/blocks/<cidr>`: owned by (node, network),
/// or quarantined after a reclaim (`node` empty, `reclaimed` set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockRecord {
    pub node: String,
    /// The CNI network whose store on `node` allocates in this block.
    pub network: String,
    #[serde(default)]
    pub in_use: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimed: Option<Reclaimed>,
}

/// Where a quarantined block came from. Its `node` stays the empty string, so a build
/// that predates reclaim sees a block owned by nobody it knows and never claims it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reclaimed {
    /// The node whose session was gone.
    pub from: String,
    /// When, in milliseconds since the epoch (the reclaiming daemon's clock).
    pub at_ms: u64,
}

impl BlockRecord {
    pub(crate) fn owned(node: &str, network: &str, in_use: u64) -> BlockRecord {
        BlockRecord {
            node: node.to_string(),
            network: network.to_string(),
            in_use,
            reclaimed: None,
        }
    }

    /// Whether `node` allocates from this block for `network` (not quarantined).
    pub(crate) fn is_owned_by(&self, node: &str, network: &str) -> bool {
        self.reclaimed.is_none() && self.node == node && self.network == network
    }

    pub(crate) fn quarantined(from: &str, at_ms: u64) -> BlockRecord {
        BlockRecord {
            node: String::new(),
            network: String::new(),
            in_use: 0,
            reclaimed: Some(Reclaimed {
                from: from.to_string(),
                at_ms,
            }),
        }
    }
}

/// `/cnikit/nodes/<node>`: the node's session, on its etcd lease. `addresses` are where
/// other nodes route this node's blocks (`--route-blocks`): at most one per family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub node: String,
    #[serde(default)]
    pub pid: u32,
    /// Seconds since the epoch when the session began.
    #[serde(default)]
    pub since: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<std::net::IpAddr>,
}

/// `/cnikit/absent/<node>`: since when the reclaimer has seen the node hold blocks without a
/// session. Written by the reclaimer only while the session key is absent; deleted by the
/// node in the transaction that starts its next session, so it never outlives an absence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Absence {
    pub since_ms: u64,
}

/// Milliseconds since the epoch now.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(v).map_err(|e| Error::internal(format!("cannot encode: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_record_json_shape() {
        let r = BlockRecord::owned("n1", "pods", 3);
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"node":"n1","network":"pods","inUse":3}"#
        );
        let q = BlockRecord::quarantined("n1", 5);
        assert_eq!(
            serde_json::to_string(&q).unwrap(),
            r#"{"node":"","network":"","inUse":0,"reclaimed":{"from":"n1","atMs":5}}"#
        );
    }

    #[test]
    fn a_spec_of_one_cidr_reads_and_writes_as_before() {
        let old: PoolSpec =
            serde_json::from_str(r#"{"cidr":"10.0.0.0/16","blockSize":26}"#).unwrap();
        assert_eq!(old.cidrs, vec!["10.0.0.0/16".parse::<IpNet>().unwrap()]);
        assert_eq!(old.reclaim_after, 0);
        let two = PoolSpec {
            cidrs: vec![
                "10.0.0.0/16".parse().unwrap(),
                "10.1.0.0/16".parse().unwrap(),
            ],
            ..old
        };
        let text = serde_json::to_string(&two).unwrap();
        assert_eq!(
            text,
            r#"{"cidr":"10.0.0.0/16","cidrs":["10.0.0.0/16","10.1.0.0/16"],"blockSize":26,"reclaimAfter":0}"#
        );
        assert_eq!(serde_json::from_str::<PoolSpec>(&text).unwrap(), two);
        assert!(serde_json::from_str::<PoolSpec>(r#"{"blockSize":26}"#).is_err());
    }
}
