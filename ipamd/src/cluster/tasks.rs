//! The daemon's background work for the pools, each a loop on the daemon's runtime that
//! stops when the daemon's store is gone:
//! - the session: grant a lease, put `/cnikit/nodes/<node>` on it, keep it alive every
//!   third of the TTL, and grant a new one when etcd says it expired (after a partition),
//!   then confirm every block before allocating again (`fence`); on the first session,
//!   take back the blocks etcd records as this node's (a restart); each tick also reads
//!   the specs of the pools in use (a drain takes effect within a third of the TTL);
//! - the reclaimer (`reclaim`);
//! - with `--route-blocks`, the routes to other nodes' blocks (`routes`);
//! - usage: every [`SYNC_EVERY`], count each owned block's leases in the local store and
//!   write changed counts to the block records (compare-and-swap on their revision), and
//!   give back blocks that stayed empty for --block-release-after.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::etcd::Write;
use super::node::{count_in, lock, Binding, LostBlock, Node, Owned};
use super::records::{encode, now_ms, BlockRecord, Session};
use super::show::{read_all, read_blocks, read_spec};
use super::{absent_key, block_key, node_key, LocalStore};
use crate::log::Level;
use crate::{log_at, Error};

/// How often usage counts are pushed (the issue allows 10 s for `inUse` to catch up).
pub(crate) const SYNC_EVERY: Duration = Duration::from_secs(2);
/// Retry pause after a failed session call.
const SESSION_RETRY: Duration = Duration::from_millis(500);

/// Start the loops; they hold the store only weakly.
pub(crate) fn spawn<S: LocalStore>(
    node: Arc<Node>,
    store: Weak<S>,
    routes: Option<Arc<dyn super::RouteSync>>,
) {
    if let Some(sync) = routes {
        tokio::spawn(super::routes::route_loop(Arc::clone(&node), sync));
    }
    tokio::spawn(session_loop(Arc::clone(&node), store.clone()));
    tokio::spawn(super::reclaim::reclaim_loop(
        Arc::clone(&node),
        store.clone(),
    ));
    tokio::spawn(usage_loop(node, store));
}

async fn session_loop<S: LocalStore>(node: Arc<Node>, store: Weak<S>) {
    let ttl = node.opts.session_ttl.as_secs().max(2);
    let every = Duration::from_secs(ttl) / 3;
    let mut adopted = false;
    loop {
        let Some(live) = store.upgrade() else { return };
        let ok = match session_tick(&node, &*live, ttl, &mut adopted).await {
            Ok(()) => true,
            Err(e) => {
                log_at!(Level::Warn, "node {}: {e}", node.name());
                false
            }
        };
        drop(live);
        tokio::time::sleep(if ok { every } else { SESSION_RETRY }).await;
    }
}

async fn session_tick<S: LocalStore>(
    node: &Node,
    store: &S,
    ttl: u64,
    adopted: &mut bool,
) -> Result<(), Error> {
    renew(node, ttl).await?;
    if !*adopted {
        let n = adopt_all(node).await?;
        find_lost(node, store).await?;
        *adopted = true;
        log_at!(
            Level::Info,
            "node {}: joined etcd ({}), serving {n} block(s) it held before",
            node.name(),
            node.etcd.endpoints()
        );
    }
    confirm_if_needed(node, store).await?;
    refresh_specs(node).await
}

/// Keep the session alive, or start a new one.
async fn renew(node: &Node, ttl: u64) -> Result<(), Error> {
    let lease = node.session.load(Ordering::SeqCst);
    let sent = Instant::now();
    if lease != 0 && node.etcd.keep_alive(lease).await? {
        node.standing.renewed(sent);
        return Ok(());
    }
    if lease != 0 {
        log_at!(
            Level::Warn,
            "node {}: etcd session {lease:x} expired (etcd was out of reach for more than its TTL); starting a new one, and no new address until its blocks are confirmed",
            node.name()
        );
        node.standing.expired();
        node.session.store(0, Ordering::SeqCst);
    }
    let lease = node
        .etcd
        .grant(i64::try_from(ttl).unwrap_or(i64::MAX))
        .await?;
    let value = Session {
        node: node.name().to_string(),
        pid: std::process::id(),
        since: now_ms() / 1000,
        addresses: node.opts.node_addresses.clone(),
    };
    // The absence marker goes with the same write: it never outlives the absence, so a
    // later absence starts its own count.
    let writes = vec![
        Write::Put(node_key(node.name()), encode(&value)?, lease),
        Write::Delete(absent_key(node.name())),
    ];
    let key = node_key(node.name());
    node.etcd.write_if("session", &key, &[], writes).await?;
    node.standing.renewed(sent);
    node.session.store(lease, Ordering::SeqCst);
    Ok(())
}

/// After a new session replaced an expired one: keep each block etcd still records as this
/// node's, and mark the others lost (reporting the leases this node holds in them); only
/// then may the node allocate again.
async fn confirm_if_needed<S: LocalStore>(node: &Node, store: &S) -> Result<(), Error> {
    if !node.standing.awaits_confirmation() || node.session.load(Ordering::SeqCst) == 0 {
        return Ok(());
    }
    for b in node.bindings() {
        let claimed = read_blocks(&node.etcd, &b.pool).await?;
        let owned: Vec<Owned> = b.blocks.read().await.clone();
        for o in owned {
            match claimed.iter().find(|c| c.cidr == o.cidr) {
                Some(c) if c.record.is_owned_by(node.name(), &b.network) => {
                    set(&b, &o.cidr, |x| x.mod_revision = c.mod_revision).await;
                }
                _ => lose(node, store, &b, &o.cidr).await,
            }
        }
    }
    node.standing.confirmed();
    log_at!(
        Level::Info,
        "node {}: blocks confirmed with etcd under the new session; allocating again",
        node.name()
    );
    Ok(())
}

/// At start: the blocks this node holds leases in that etcd does not record as its own
/// (lost while it was down or before a restart) are lost blocks, as if found while running.
async fn find_lost<S: LocalStore>(node: &Node, store: &S) -> Result<(), Error> {
    let pools = read_all(&node.etcd).await?;
    for network in store.networks().await? {
        let mut seen = Vec::new();
        for addr in store.addresses(&network).await? {
            for (pool, spec, claimed) in &pools {
                if !spec.cidrs.iter().any(|c| c.contains(&addr)) {
                    continue;
                }
                let record = claimed.iter().find(|c| c.cidr.contains(&addr));
                let ours = record.is_some_and(|c| c.record.is_owned_by(node.name(), &network));
                let cidr = match record {
                    Some(c) => c.cidr,
                    None => ipnet::IpNet::new(addr, spec.block_size)
                        .map_err(|e| Error::internal(format!("block of {addr}: {e}")))?
                        .trunc(),
                };
                if !ours && !seen.contains(&(pool.clone(), cidr)) {
                    seen.push((pool.clone(), cidr));
                    let b = node.binding(pool, &network);
                    lose(node, store, &b, &cidr).await;
                }
            }
        }
    }
    Ok(())
}

/// Stop using a block etcd no longer records as this node's, for good.
async fn lose<S: LocalStore>(node: &Node, store: &S, b: &Binding, cidr: &ipnet::IpNet) {
    b.blocks.write().await.retain(|x| x.cidr != *cidr);
    let same = |l: &LostBlock| l.pool == b.pool && l.cidr == *cidr;
    {
        // The confirm pass and a usage push that found the record changed can both get
        // here: the first one records the loss, under the lock.
        let mut lost = lock(&node.lost);
        if lost.iter().any(same) {
            return;
        }
        lost.push(LostBlock {
            pool: b.pool.clone(),
            network: b.network.clone(),
            cidr: *cidr,
            held: 0,
        });
    }
    node.counters.lost.fetch_add(1, Ordering::Relaxed);
    let held: Vec<String> = match store.addresses(&b.network).await {
        Ok(addrs) => addrs
            .iter()
            .filter(|a| cidr.contains(*a))
            .map(ToString::to_string)
            .collect(),
        Err(e) => vec![format!("(leases unreadable: {e})")],
    };
    if let Some(l) = lock(&node.lost).iter_mut().find(|l| same(l)) {
        l.held = held.len();
    }
    log_at!(
        Level::Error,
        "pool {}: block {cidr} of network {} is no longer this node's in etcd (reclaimed while this node was cut off from etcd, or release-node --force); no new address comes from it. Its {} lease(s) here stay until their pods are deleted (DEL releases them locally), but another node may hand these addresses out: {}",
        b.pool,
        b.network,
        held.len(),
        held.join(", ")
    );
}

/// Count the leases still held in each lost block: once its pods are gone (DEL) the block
/// is no longer reported, though it is still never allocated from.
async fn count_lost<S: LocalStore>(node: &Node, store: &S) {
    let lost = node.lost_blocks();
    for l in lost.iter().filter(|l| l.held > 0) {
        let Ok(addrs) = store.addresses(&l.network).await else {
            continue;
        };
        let held = count_in(&l.cidr, &addrs) as usize;
        for x in lock(&node.lost)
            .iter_mut()
            .filter(|x| x.cidr == l.cidr && x.pool == l.pool)
        {
            x.held = held;
        }
    }
}

/// Learn the specs of the pools this node allocates from (draining CIDRs).
async fn refresh_specs(node: &Node) -> Result<(), Error> {
    let bindings = node.bindings();
    let mut pools: Vec<&str> = bindings.iter().map(|b| b.pool.as_str()).collect();
    pools.sort_unstable();
    pools.dedup();
    for pool in pools {
        // One get per pool: listing the pools would bring every block along.
        let Some((spec, _)) = read_spec(&node.etcd, pool).await? else {
            continue;
        };
        for b in bindings.iter().filter(|b| b.pool == pool) {
            b.saw_spec(&spec);
        }
    }
    Ok(())
}

/// Serve again every block etcd records as this node's, in every pool.
async fn adopt_all(node: &Node) -> Result<usize, Error> {
    let mut n = 0;
    for (pool, spec, claimed) in read_all(&node.etcd).await? {
        let mut networks: Vec<&str> = claimed
            .iter()
            .filter(|c| c.record.node == node.name())
            .map(|c| c.record.network.as_str())
            .collect();
        networks.sort_unstable();
        networks.dedup();
        for network in networks {
            let b = node.binding(&pool, network);
            b.saw_spec(&spec);
            n += node.adopt(&b, &claimed).await;
        }
    }
    Ok(n)
}

async fn usage_loop<S: LocalStore>(node: Arc<Node>, store: Weak<S>) {
    loop {
        tokio::time::sleep(SYNC_EVERY).await;
        let Some(store) = store.upgrade() else { return };
        retry_limbo(&node).await;
        count_lost(&node, &*store).await;
        for b in node.bindings() {
            if let Err(e) = sync_binding(&node, &*store, &b).await {
                log_at!(
                    Level::Debug,
                    "pool {} network {}: usage not pushed: {e}",
                    b.pool,
                    b.network
                );
            }
        }
    }
}

async fn sync_binding<S: LocalStore>(node: &Node, store: &S, b: &Binding) -> Result<(), Error> {
    let addrs = store.addresses(&b.network).await?;
    let snapshot: Vec<Owned> = b.blocks.read().await.clone();
    let release_after = node.opts.block_release_after;
    for o in snapshot {
        let n = count_in(&o.cidr, &addrs);
        if n == 0 {
            let since = o.empty_since.unwrap_or_else(Instant::now);
            set(b, &o.cidr, |x| x.empty_since = Some(since)).await;
            // A draining block goes as soon as it is empty: its CIDR leaves the pool then.
            if since.elapsed() >= release_after || b.drains(&o.cidr) {
                release(node, store, b, &o).await?;
                continue;
            }
        } else {
            set(b, &o.cidr, |x| x.empty_since = None).await;
        }
        if o.pushed == Some(n) {
            continue;
        }
        let record = BlockRecord::owned(node.name(), &b.network, n);
        let key = block_key(&b.pool, &o.cidr);
        let value = encode(&record)?;
        match node.etcd.replace(&key, o.mod_revision, value).await? {
            Some(rev) => {
                set(b, &o.cidr, |x| {
                    x.mod_revision = rev;
                    x.pushed = Some(n);
                })
                .await;
            }
            None => recheck(node, store, b, &o).await?,
        }
    }
    Ok(())
}

/// The block record changed under us: take its new revision if it is still ours, or stop
/// using the block if it is not.
async fn recheck<S: LocalStore>(
    node: &Node,
    store: &S,
    b: &Binding,
    o: &Owned,
) -> Result<(), Error> {
    let key = block_key(&b.pool, &o.cidr);
    let current = node.etcd.get(&key).await?;
    let ours = current.as_ref().and_then(|kv| {
        let r: BlockRecord = serde_json::from_slice(&kv.value).ok()?;
        r.is_owned_by(node.name(), &b.network)
            .then_some(kv.mod_revision)
    });
    match ours {
        Some(rev) => set(b, &o.cidr, |x| x.mod_revision = rev).await,
        None => lose(node, store, b, &o.cidr).await,
    }
    Ok(())
}

async fn set(b: &Binding, cidr: &ipnet::IpNet, f: impl FnOnce(&mut Owned)) {
    if let Some(x) = b.blocks.write().await.iter_mut().find(|x| x.cidr == *cidr) {
        f(x);
    }
}

/// Give an empty block back: out of service first (under the write lock, so no allocation
/// is choosing in it), checked empty again, then deleted in etcd if unchanged. A delete
/// whose outcome is unknown leaves the block in limbo: never used again, retried.
async fn release<S: LocalStore>(
    node: &Node,
    store: &S,
    b: &Binding,
    o: &Owned,
) -> Result<(), Error> {
    {
        let mut blocks = b.blocks.write().await;
        let addrs = store.addresses(&b.network).await?;
        if count_in(&o.cidr, &addrs) > 0 {
            return Ok(());
        }
        let Some(pos) = blocks.iter().position(|x| x.cidr == o.cidr) else {
            return Ok(());
        };
        let taken = blocks.remove(pos);
        node.limbo_push(&b.pool, taken);
    }
    retry_limbo(node).await;
    Ok(())
}

impl Node {
    fn limbo_push(&self, pool: &str, o: Owned) {
        self.limbo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((pool.to_string(), o));
    }
}

/// Try to delete every block in limbo; keep the ones without a definite answer.
async fn retry_limbo(node: &Node) {
    let pending: Vec<(String, Owned)> =
        std::mem::take(&mut *node.limbo.lock().unwrap_or_else(|e| e.into_inner()));
    for (pool, o) in pending {
        match node
            .etcd
            .delete_if(&block_key(&pool, &o.cidr), o.mod_revision)
            .await
        {
            Ok(deleted) => {
                if deleted {
                    node.counters.releases.fetch_add(1, Ordering::Relaxed);
                    log_at!(Level::Info, "pool {pool}: released empty block {}", o.cidr);
                }
            }
            Err(_) => node.limbo_push(&pool, o),
        }
    }
}
