//! Cluster-wide address pools kept in etcd: a pool is cut into blocks, a node's daemon claims
//! blocks for itself with etcd transactions and hands out pod addresses from its own blocks
//! through the local journal, so the per-pod path never waits on etcd while a block has room.
//!
//! Key layout in etcd (values are JSON):
//!
//! ```text
//! /cnikit/pools/<pool>                {"cidr","cidrs","blockSize","reclaimAfter","draining"}
//! /cnikit/pools/<pool>/blocks/<cidr>  {"node","network","inUse"}  a block a node owns, or
//!                                     {"node":"","reclaimed":{"from","atMs"}}  quarantined
//! /cnikit/nodes/<node>                {"node","pid","since","addresses"}  the session, on its lease
//! /cnikit/absent/<node>               {"sinceMs"}   the reclaimer saw the node's session gone
//! /cnikit/reclaimer                   {"node"}      the one daemon reclaiming, on its lease
//! /cnikit/poolset                     a counter every pool create/update bumps
//! ```
//!
//! Rules, and why:
//! - Claiming is a transaction that writes the block key only if it is absent (or is the
//!   quarantined record read), the pool key is unchanged since read, and the claimer's
//!   session key is on its live lease. That transaction is the only arbiter: two nodes can
//!   never both own a block, whatever their clocks or caches say.
//! - Blocks are not attached to the node's lease: a partitioned node keeps serving its pods'
//!   addresses, so etcd never frees them by itself. A block is reclaimed only by the
//!   reclaimer (`reclaim`), only after its node's session has been seen gone for the pool's
//!   `reclaimAfter`, in a transaction that holds only if the session is still absent, the
//!   absence marker and the block unchanged; or by `pool release-node`.
//! - Fencing (`fence`): a node that could not renew its session stops handing out new
//!   addresses once the session could have expired, and after a new session confirms each
//!   block is still its own before allocating from it again. A reclaimed block is
//!   quarantined: claimed again only when no free block is left, oldest first.
//! - A block belongs to one (node, network): the network's store on that node is the only
//!   one allocating in it, so one block never feeds two stores.
//! - `inUse` is what the owning node last pushed (it catches up within seconds); it is
//!   informational, except that `pool delete` refuses while any block is in use.
//!
//! Modules: `records` (the etcd values), `etcd` (the client with a timeout on every call,
//! error mapping, metrics), `blocks` (block arithmetic), `admin` (`cnikit ipamd pool …`),
//! `show` (a pool's blocks, states and usage), `check` (`pool check`), `node` (the daemon's
//! view: owned blocks, claims), `fence` (the session's standing), `tasks` (session
//! keep-alive, usage push, release of empty blocks), `reclaim` (the reclaimer), `routes`
//! (`--route-blocks`: routes to other nodes' blocks), `metrics`.

mod admin;
mod blocks;
mod check;
mod claim;
mod etcd;
mod fence;
mod metrics;
mod node;
mod reclaim;
mod records;
mod routes;
mod show;
mod tasks;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use crate::api::{AllocateRequest, Allocation};
use crate::config::RangeSet;
use crate::Error;

pub use admin::{pool_command, PoolCommand, PoolOutcome};
pub use blocks::gateway as block_gateway;
pub use check::{check_pool_store, CheckReport};
pub(crate) use node::Node;
pub use records::{BlockRecord, PoolSpec, Reclaimed, Session};
pub use routes::{BlockRoute, RouteSync, SyncOutcome};
pub use show::{BlockShow, PoolShow, Usage};
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
    /// Published with the session: where other nodes route this node's blocks (at most
    /// one address per family).
    pub node_addresses: Vec<std::net::IpAddr>,
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
    /// The networks this node has stores of.
    fn networks(&self) -> impl Future<Output = Result<Vec<String>, Error>> + Send;
    /// Every address leased in `network` on this node.
    fn addresses(
        &self,
        network: &str,
    ) -> impl Future<Output = Result<Vec<std::net::IpAddr>, Error>> + Send;
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

pub(crate) fn block_key(pool: &str, block: &ipnet::IpNet) -> String {
    format!("{}{block}", blocks_prefix(pool))
}

pub(crate) fn node_key(node: &str) -> String {
    format!("{PREFIX}/nodes/{node}")
}

pub(crate) fn absent_key(node: &str) -> String {
    format!("{PREFIX}/absent/{node}")
}

/// Held by the one daemon that reclaims, attached to its session's lease.
pub(crate) fn reclaimer_key() -> String {
    format!("{PREFIX}/reclaimer")
}

/// Bumped by every pool create and update, which compare its version: two commands
/// adding overlapping CIDRs to two pools at once cannot both succeed.
pub(crate) fn poolset_key() -> String {
    format!("{PREFIX}/poolset")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_documented_layout() {
        let b: ipnet::IpNet = "10.1.0.64/26".parse().unwrap();
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
}
