//! Cluster-wide address pools kept in etcd: a pool is cut into blocks, a node's daemon claims
//! blocks for itself with etcd transactions and hands out pod addresses from its own blocks
//! through the local journal, so the per-pod path never waits on etcd while a block has room.
//!
//! Key layout in etcd (values are JSON):
//!
//! ```text
//! /cnikit/pools/<pool>                  {"cidr", "blockSize"}            the pool (PoolSpec)
//! /cnikit/pools/<pool>/blocks/<cidr>    {"node", "network", "inUse"}     a claimed block
//! /cnikit/nodes/<node>                  {"node", "pid", "since"}         the node's session,
//!                                                                        attached to its lease
//! ```
//!
//! Rules, and why:
//! - A block exists in etcd only while some node owns it; claiming is a transaction that
//!   creates the key only if it does not exist and the pool key is the one the claimer read
//!   (same create revision). That transaction is the only arbiter: two nodes can never both
//!   own a block, whatever their clocks or caches say.
//! - Blocks are not attached to the node's lease: a partitioned node keeps serving its pods'
//!   addresses, so no timer may free its blocks. Only `pool release-node` does, and only
//!   once the node's session key (which is attached to the lease) has expired.
//! - A block belongs to one (node, network): the network's store on that node is the only
//!   one allocating in it, so one block never feeds two stores.
//! - `inUse` is what the owning node last pushed (it catches up within seconds); it is
//!   informational, except that `pool delete` refuses while any block is in use.
//!
//! Modules: `etcd` (the client with a timeout on every call, error mapping, metrics),
//! `blocks` (block arithmetic), `admin` (`cnikit ipamd pool …`), `node` (the daemon's view:
//! session, owned blocks, claims), `tasks` (keep-alive, usage push, release of empty blocks).

mod admin;
mod blocks;
mod etcd;
mod node;
mod tasks;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::api::{AllocateRequest, Allocation};
use crate::config::RangeSet;
use crate::Error;

pub use admin::{pool_command, BlockShow, PoolCommand, PoolOutcome, PoolShow};
pub(crate) use node::Node;
pub(crate) use tasks::spawn;

/// Where everything lives in etcd.
pub(crate) const PREFIX: &str = "/cnikit";

/// Default `--etcd-session-ttl`.
pub const DEFAULT_SESSION_TTL: u64 = 30;
/// Default `--block-release-after`.
pub const DEFAULT_BLOCK_RELEASE_AFTER: u64 = 300;
/// Default `--block-size` of an IPv4 pool (64 addresses per block).
pub const DEFAULT_BLOCK_SIZE_V4: u8 = 26;
/// Default `--block-size` of an IPv6 pool (also 64 addresses per block).
pub const DEFAULT_BLOCK_SIZE_V6: u8 = 122;

/// How to reach etcd: endpoints and, for a secured cluster, TLS files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// CA bundle that signed the etcd servers' certificates.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key, for etcd's `--client-cert-auth`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Bound of every single etcd call.
    pub timeout: Duration,
}

impl EtcdOptions {
    pub fn new(endpoints: Vec<String>) -> EtcdOptions {
        EtcdOptions {
            endpoints,
            timeout: Duration::from_secs(2),
            ..Default::default()
        }
    }
}

/// The daemon's cluster settings (`cnikit ipamd daemon --etcd-endpoints … --node …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterOptions {
    pub etcd: EtcdOptions,
    /// This node's name; blocks are claimed under it.
    pub node: String,
    /// TTL of the node's etcd lease (its session), kept alive while the daemon runs.
    pub session_ttl: Duration,
    /// A block with no lease in it for this long goes back to the pool.
    pub block_release_after: Duration,
}

/// A pool as stored under `/cnikit/pools/<pool>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    pub cidr: IpNet,
    pub block_size: u8,
}

/// A claimed block as stored under `/cnikit/pools/<pool>/blocks/<cidr>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockRecord {
    pub node: String,
    /// The CNI network whose store on `node` allocates in this block.
    pub network: String,
    #[serde(default)]
    pub in_use: u64,
}

/// The store the daemon allocates from: the cluster code runs the lease operations through
/// it (the daemon's registry implements it), so this module needs nothing of the server.
pub(crate) trait LocalStore: Send + Sync + 'static {
    /// Allocate `req` in the network's store from the range sets given.
    fn allocate(
        &self,
        req: AllocateRequest,
    ) -> impl Future<Output = Result<Vec<Allocation>, Error>> + Send;
    /// What the key holds already (idempotent ADD without needing any block).
    fn held(
        &self,
        key: crate::api::LeaseKey,
    ) -> impl Future<Output = Result<Vec<Allocation>, Error>> + Send;
    /// Ok when the network's store has a free address in `set`.
    fn has_room(
        &self,
        network: &str,
        set: RangeSet,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    /// Every address leased in `network` on this node.
    fn addresses(
        &self,
        network: &str,
    ) -> impl Future<Output = Result<Vec<std::net::IpAddr>, Error>> + Send;
}

impl Node {
    /// The cluster's /metrics families (Prometheus text).
    pub(crate) async fn render_metrics(&self) -> String {
        use crate::prometheus::{family, histogram, single};
        use std::sync::atomic::Ordering::Relaxed;
        let owned = self.blocks_owned().await;
        let st = &self.etcd.stats;
        let mut out = String::new();
        let help = "Pool blocks this node allocates from.";
        single(&mut out, "ipamd_cluster_blocks_owned", "gauge", help, owned);
        let c = &self.counters;
        for (name, help, v) in [
            (
                "ipamd_cluster_block_claims_total",
                "Blocks claimed in etcd.",
                c.claims.load(Relaxed),
            ),
            (
                "ipamd_cluster_block_releases_total",
                "Empty blocks given back.",
                c.releases.load(Relaxed),
            ),
            (
                "ipamd_cluster_blocks_lost_total",
                "Blocks found taken from this node (release-node --force).",
                c.lost.load(Relaxed),
            ),
            (
                "ipamd_cluster_etcd_requests_total",
                "etcd calls.",
                st.calls.load(Relaxed),
            ),
            (
                "ipamd_cluster_etcd_errors_total",
                "etcd calls that failed or timed out.",
                st.errors.load(Relaxed),
            ),
        ] {
            single(&mut out, name, "counter", help, v);
        }
        let name = "ipamd_cluster_etcd_latency_seconds";
        family(&mut out, name, "histogram", "Latency of etcd calls.");
        // Buckets before the count: a call is counted before its bucket, so a call that
        // ends during the scrape cannot make a bucket exceed +Inf.
        let buckets: Vec<(f64, u64)> = (st.buckets.iter().zip(etcd::BUCKETS_MS))
            .map(|(b, le_ms)| (le_ms as f64 / 1000.0, b.load(Relaxed)))
            .collect();
        let calls = st.calls.load(Relaxed);
        let sum = st.latency_us.load(Relaxed) as f64 / 1e6;
        histogram(&mut out, name, "", buckets, calls, sum);
        let up = u8::from(self.session.load(Relaxed) != 0);
        let help = "1 while this node holds an etcd session.";
        single(&mut out, "ipamd_cluster_session_up", "gauge", help, up);
        out
    }
}

/// This machine's host name: the default `--node`.
pub fn hostname() -> Result<String, Error> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we stop at the first NUL or the end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(Error::invalid(format!(
            "cannot read the host name for --node: {}",
            std::io::Error::last_os_error()
        )));
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    check_node(&name)?;
    Ok(name)
}

/// Node names become etcd key parts: host-name characters only.
pub fn check_node(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "node name {name:?} must be 1-253 characters of letters, digits, '-', '.', '_'"
        )))
    }
}

/// Pool names follow the network-name rules (letters, digits, `-`, `_`, `.`): they become
/// etcd key parts and appear in CNI configs next to network names.
pub fn check_pool(name: &str) -> Result<(), Error> {
    crate::attachment::check_network(name)
        .map_err(|e| Error::invalid(format!("pool name {name:?}: {}", e.message())))
}

pub(crate) fn pool_key(pool: &str) -> String {
    format!("{PREFIX}/pools/{pool}")
}

pub(crate) fn blocks_prefix(pool: &str) -> String {
    format!("{PREFIX}/pools/{pool}/blocks/")
}

pub(crate) fn block_key(pool: &str, block: &IpNet) -> String {
    format!("{}{block}", blocks_prefix(pool))
}

pub(crate) fn node_key(node: &str) -> String {
    format!("{PREFIX}/nodes/{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_documented_layout() {
        let b: IpNet = "10.1.0.64/26".parse().unwrap();
        assert_eq!(pool_key("p"), "/cnikit/pools/p");
        assert_eq!(block_key("p", &b), "/cnikit/pools/p/blocks/10.1.0.64/26");
        assert_eq!(node_key("n1"), "/cnikit/nodes/n1");
        // A pool key is not under another pool's block prefix, whatever the names.
        assert!(!block_key("p", &b).starts_with(&blocks_prefix("p2")));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_node("node-1.example").is_ok());
        assert!(check_node("").is_err());
        assert!(check_node("a/b").is_err());
        assert!(check_pool("v4pool").is_ok());
        assert!(check_pool("a/b").is_err());
    }

    #[test]
    fn block_record_json_shape() {
        let r = BlockRecord {
            node: "n1".into(),
            network: "pods".into(),
            in_use: 3,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"node":"n1","network":"pods","inUse":3}"#
        );
    }
}
