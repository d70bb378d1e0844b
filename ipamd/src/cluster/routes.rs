//! `--route-blocks`: keep a route to every other node's blocks via that node's address.
//!
//! The map comes from etcd (a list of `/cnikit/`, then a watch from the list's revision):
//! block keys say which node owns a block, session keys where that node is. The kernel
//! side is the caller's ([`RouteSync`]: this crate knows nothing of netlink); it is asked
//! to make the routes of cnikit's own protocol exactly the wanted ones whenever the wanted
//! set changes, and every [`RESYNC_EVERY`] anyway (a link that went down and up lost them).
//!
//! A node whose session is gone keeps its routes until its blocks are released or
//! reclaimed: it may be cut off from etcd only and still serve its pods. Its address is
//! the last one seen (kept across relists); a daemon that never saw it keeps whatever
//! route it finds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::EventType;
use ipnet::IpNet;

use super::node::Node;
use super::records::{BlockRecord, Session};
use super::PREFIX;
use crate::log::Level;
use crate::{log_at, Error};

/// A full reconcile with the kernel, besides the one after every change of the map.
pub const RESYNC_EVERY: Duration = Duration::from_secs(10);
/// A new list of etcd, in case a watch stalled without an error.
const RELIST_EVERY: Duration = Duration::from_secs(60);
/// Pause before listing again after a failed list or a broken watch.
const RETRY: Duration = Duration::from_millis(500);

/// A route the daemon wants: `dst` (another node's block) via `via` (that node's address);
/// `via` None: the owner's address is unknown here, keep a route found, add none.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockRoute {
    pub dst: IpNet,
    pub via: Option<IpAddr>,
}

/// What one reconcile did, and what it could not do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    pub added: usize,
    pub removed: usize,
    /// Routes of cnikit's protocol in place after the reconcile.
    pub installed: usize,
    /// Addresses with no connected route to them: their routes were not installed.
    pub unreachable: Vec<IpAddr>,
    /// Destinations another route (not cnikit's) holds already: left alone.
    pub taken: Vec<IpNet>,
    /// Gateway addresses of other nodes' blocks a local bridge still had, removed.
    pub cleared: Vec<IpNet>,
}

/// The kernel side of `--route-blocks`, given by the binary.
pub trait RouteSync: Send + Sync + fmt::Debug + 'static {
    /// Make the routes of cnikit's protocol in the main table exactly `want`, touching
    /// no other route, and remove from local links the gateway addresses of the blocks in
    /// `want` (a bridge keeps them after its node gave the block back). Blocking; called
    /// on a blocking thread.
    fn sync(&self, want: &[BlockRoute]) -> Result<SyncOutcome, String>;
}

/// Who owns which block, and where the nodes are, as etcd says.
#[derive(Debug, Default)]
pub(crate) struct ClusterMap {
    /// Owned (not quarantined) blocks → owner.
    blocks: BTreeMap<IpNet, String>,
    /// Each node's addresses, as its last session published them (kept after it ends).
    addresses: HashMap<String, Vec<IpAddr>>,
}

impl ClusterMap {
    /// Before a new list: the blocks are read again whole; the addresses stay, so that a
    /// node whose session ended before the list is still routed to where it was.
    fn forget_blocks(&mut self) {
        self.blocks.clear();
    }

    /// Apply one key's new value (None: deleted). Keys other than blocks and sessions
    /// are ignored.
    pub(crate) fn apply(&mut self, key: &str, value: Option<&[u8]>) {
        if let Some(block) = block_of(key) {
            let owner = value
                .and_then(|v| serde_json::from_slice::<BlockRecord>(v).ok())
                .filter(|r| r.reclaimed.is_none() && !r.node.is_empty())
                .map(|r| r.node);
            match owner {
                Some(node) => self.blocks.insert(block, node),
                None => self.blocks.remove(&block),
            };
        } else if let Some(node) = key.strip_prefix(&format!("{PREFIX}/nodes/")) {
            // A session's end keeps the addresses: see the module's comment.
            if let Some(s) = value.and_then(|v| serde_json::from_slice::<Session>(v).ok()) {
                self.addresses.insert(node.to_string(), s.addresses);
            }
        }
    }

    /// The routes `me` wants: every block of another node, via its address of the
    /// block's family.
    pub(crate) fn want(&self, me: &str) -> Vec<BlockRoute> {
        let others = self.blocks.iter().filter(|(_, node)| node.as_str() != me);
        others
            .map(|(dst, node)| BlockRoute {
                dst: *dst,
                via: self.addresses.get(node).and_then(|all| {
                    all.iter()
                        .copied()
                        .find(|a| a.is_ipv4() == dst.addr().is_ipv4())
                }),
            })
            .collect()
    }
}

/// The block of a block key (`/cnikit/pools/<pool>/blocks/<cidr>`).
fn block_of(key: &str) -> Option<IpNet> {
    let rest = key.strip_prefix(&format!("{PREFIX}/pools/"))?;
    let (_, cidr) = rest.split_once("/blocks/")?;
    cidr.parse().ok()
}

/// The daemon's loop: list, reconcile, then follow the watch; again from a new list when
/// the watch ends or every [`RELIST_EVERY`].
pub(crate) async fn route_loop(node: Arc<Node>, sync: Arc<dyn RouteSync>) {
    let mut reported = Reported::default();
    let mut map = ClusterMap::default();
    loop {
        if let Err(e) = follow(&node, &sync, &mut map, &mut reported).await {
            log_at!(
                Level::Warn,
                "node {}: routes to other nodes' blocks: {e}",
                node.name()
            );
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn follow(
    node: &Node,
    sync: &Arc<dyn RouteSync>,
    map: &mut ClusterMap,
    reported: &mut Reported,
) -> Result<(), Error> {
    let prefix = format!("{PREFIX}/");
    let (kvs, revision) = node.etcd.list_at(&prefix).await?;
    map.forget_blocks();
    for kv in &kvs {
        map.apply(&kv.key, Some(&kv.value));
    }
    let mut want = map.want(node.name());
    reconcile(node, sync, &want, reported).await;
    let mut stream = node.etcd.watch(&prefix, revision + 1).await?;
    let relist = tokio::time::sleep(RELIST_EVERY);
    tokio::pin!(relist);
    let mut resync = tokio::time::interval(RESYNC_EVERY);
    resync.tick().await;
    loop {
        tokio::select! {
            msg = stream.message() => {
                let resp = msg
                    .map_err(|e| Error::new(crate::ErrorKind::Unavailable, format!("etcd watch: {e}")))?
                    .ok_or_else(|| Error::new(crate::ErrorKind::Unavailable, "etcd ended the watch"))?;
                if resp.canceled() {
                    return Err(Error::new(crate::ErrorKind::Unavailable, format!(
                        "etcd cancelled the watch ({}; compacted at {})",
                        resp.cancel_reason(), resp.compact_revision())));
                }
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let key = String::from_utf8_lossy(kv.key());
                    let value = (ev.event_type() == EventType::Put).then(|| kv.value());
                    map.apply(&key, value);
                }
                let now = map.want(node.name());
                if now != want {
                    want = now;
                    reconcile(node, sync, &want, reported).await;
                }
            }
            _ = resync.tick() => reconcile(node, sync, &want, reported).await,
            _ = &mut relist => return Ok(()),
        }
    }
}

/// What was logged already, so that a lasting problem is logged once, not every resync.
#[derive(Debug, Default)]
struct Reported {
    unreachable: BTreeSet<IpAddr>,
    taken: BTreeSet<IpNet>,
    failing: bool,
}

async fn reconcile(node: &Node, sync: &Arc<dyn RouteSync>, want: &[BlockRoute], r: &mut Reported) {
    // A block this node has just claimed may still be another's in the watched map (its
    // release and the claim are in flight): never route it away or clear its gateway.
    let mine = node.owned_cidrs().await;
    let w: Vec<BlockRoute> = want
        .iter()
        .filter(|b| !mine.contains(&b.dst))
        .cloned()
        .collect();
    let s = Arc::clone(sync);
    let outcome = tokio::task::spawn_blocking(move || s.sync(&w))
        .await
        .unwrap_or_else(|e| Err(format!("the route sync stopped: {e}")));
    let name = node.name();
    let o = match outcome {
        Ok(o) => o,
        Err(e) => {
            if !std::mem::replace(&mut r.failing, true) {
                log_at!(
                    Level::Error,
                    "node {name}: cannot set the routes to other nodes' blocks: {e}"
                );
            }
            return;
        }
    };
    r.failing = false;
    node.counters.set_routes(o.installed);
    if o.added + o.removed > 0 {
        log_at!(
            Level::Info,
            "node {name}: routes to other nodes' blocks: {} added, {} removed, {} in place",
            o.added,
            o.removed,
            o.installed
        );
    }
    for g in &o.cleared {
        log_at!(Level::Info, "node {name}: removed {g}, a gateway address of a block another node owns now, from a local link (it kept the block's traffic here)");
    }
    for a in &o.unreachable {
        if r.unreachable.insert(*a) {
            log_at!(Level::Warn, "node {name}: node address {a} has no connected route here (another L2 segment?): its blocks are not routed; see docs/cluster-pools.md, \"Routes between nodes\"");
        }
    }
    r.unreachable.retain(|a| o.unreachable.contains(a));
    for t in &o.taken {
        if r.taken.insert(*t) {
            log_at!(Level::Warn, "node {name}: a route to {t} that is not cnikit's is in the main table: left alone, and that block is not routed by cnikit");
        }
    }
    r.taken.retain(|t| o.taken.contains(t));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(node: &str, addrs: &[&str]) -> Vec<u8> {
        let s = Session {
            node: node.into(),
            pid: 1,
            since: 0,
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        };
        serde_json::to_vec(&s).unwrap()
    }

    fn block(node: &str) -> Vec<u8> {
        serde_json::to_vec(&BlockRecord::owned(node, "pods", 1)).unwrap()
    }

    fn route(dst: &str, via: Option<&str>) -> BlockRoute {
        BlockRoute {
            dst: dst.parse().unwrap(),
            via: via.map(|v| v.parse().unwrap()),
        }
    }

    #[test]
    fn other_nodes_blocks_go_via_their_address_of_the_family() {
        let mut m = ClusterMap::default();
        m.apply(
            "/cnikit/nodes/a",
            Some(&session("a", &["10.0.0.1", "fd00::1"])),
        );
        m.apply(
            "/cnikit/nodes/b",
            Some(&session("b", &["10.0.0.2", "fd00::2"])),
        );
        m.apply("/cnikit/pools/p4/blocks/10.244.0.0/26", Some(&block("a")));
        m.apply("/cnikit/pools/p4/blocks/10.244.0.64/26", Some(&block("b")));
        m.apply("/cnikit/pools/p6/blocks/fd00:244::/122", Some(&block("b")));
        m.apply(
            "/cnikit/pools/p4",
            Some(b"{\"cidr\":\"10.244.0.0/16\",\"blockSize\":26}"),
        );
        m.apply("/cnikit/absent/b", Some(b"{\"sinceMs\":1}"));
        assert_eq!(
            m.want("a"),
            vec![
                route("10.244.0.64/26", Some("10.0.0.2")),
                route("fd00:244::/122", Some("fd00::2")),
            ]
        );
    }

    #[test]
    fn release_and_reclaim_drop_routes_and_an_ended_session_keeps_them() {
        let mut m = ClusterMap::default();
        m.apply("/cnikit/nodes/b", Some(&session("b", &["10.0.0.2"])));
        m.apply("/cnikit/pools/p/blocks/10.244.0.0/26", Some(&block("b")));
        m.apply("/cnikit/pools/p/blocks/10.244.0.64/26", Some(&block("b")));
        m.apply("/cnikit/nodes/b", None);
        // A relist that finds no session of b: its blocks come again, its address stays.
        m.forget_blocks();
        m.apply("/cnikit/pools/p/blocks/10.244.0.0/26", Some(&block("b")));
        m.apply("/cnikit/pools/p/blocks/10.244.0.64/26", Some(&block("b")));
        assert!(
            m.want("a").iter().all(|r| r.via.is_some()),
            "b's address is kept"
        );
        assert_eq!(
            m.want("a").len(),
            2,
            "a node cut off from etcd keeps its routes"
        );
        m.apply("/cnikit/pools/p/blocks/10.244.0.0/26", None);
        let q = serde_json::to_vec(&BlockRecord::quarantined("b", 5)).unwrap();
        m.apply("/cnikit/pools/p/blocks/10.244.0.64/26", Some(&q));
        assert!(m.want("a").is_empty());
    }

    #[test]
    fn an_unknown_or_familyless_address_keeps_what_is_there() {
        let mut m = ClusterMap::default();
        m.apply("/cnikit/nodes/b", Some(&session("b", &["10.0.0.2"])));
        m.apply("/cnikit/pools/p6/blocks/fd00:244::/122", Some(&block("b")));
        m.apply("/cnikit/pools/p/blocks/10.244.0.0/26", Some(&block("c")));
        assert_eq!(
            m.want("a"),
            vec![route("10.244.0.0/26", None), route("fd00:244::/122", None)]
        );
    }
}
