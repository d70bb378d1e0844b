//! The daemon's side of the pools: the blocks this node owns per (pool, network), and
//! allocation from them, claiming a block (`claim`) when the node's blocks are full.
//!
//! Allocation holds a read lock on the blocks of each pool it allocates from while the
//! store runs it; releasing a block takes the write lock, so a block is never released
//! while an allocation that may have chosen an address in it is still under way.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ipnet::IpNet;
use tokio::sync::RwLock;

use super::etcd::Etcd;
use super::fence::Standing;
use super::show::{read_blocks, ViewCache};
use super::{blocks, ClusterOptions, LocalStore, PoolSpec};
use crate::api::{AllocateRequest, Allocation};
use crate::config::RangeSet;
use crate::{Error, ErrorKind};

/// A block this node allocates from.
#[derive(Debug, Clone)]
pub(crate) struct Owned {
    pub cidr: IpNet,
    /// The block record's mod revision as last written or read by us: updates are
    /// compare-and-swap on it, so a record someone else changed is never overwritten.
    pub mod_revision: i64,
    /// The `inUse` last written to etcd.
    pub pushed: Option<u64>,
    /// Since when the block has held no lease (for --block-release-after).
    pub empty_since: Option<Instant>,
}

/// The blocks of one pool that feed one network's store on this node.
pub(crate) struct Binding {
    pub pool: String,
    pub network: String,
    pub blocks: RwLock<Vec<Owned>>,
    /// One claim at a time per binding; concurrent ADDs that found the blocks full wait for
    /// it and then use the new block instead of claiming one each.
    claim: tokio::sync::Mutex<()>,
    /// Bumped whenever a block is added.
    pub(crate) generation: AtomicU64,
    /// The pool's draining CIDRs as last read: their blocks take no new lease.
    draining: Mutex<Vec<IpNet>>,
    /// Whether the pool reclaims automatically (`reclaimAfter` > 0, as last read): then
    /// this node's blocks of it are fenced when its session could have expired.
    reclaims: AtomicBool,
}

impl Binding {
    fn new(pool: &str, network: &str) -> Binding {
        Binding {
            pool: pool.to_string(),
            network: network.to_string(),
            blocks: RwLock::default(),
            claim: tokio::sync::Mutex::default(),
            generation: AtomicU64::new(0),
            draining: Mutex::default(),
            reclaims: AtomicBool::new(false),
        }
    }

    /// The blocks new leases may come from: all but those of draining CIDRs.
    fn range_set(&self, blocks: &[Owned]) -> RangeSet {
        let draining = lock(&self.draining);
        blocks
            .iter()
            .filter(|b| !draining.iter().any(|d| d.contains(&b.cidr)))
            .map(|b| blocks::range(&b.cidr))
            .collect()
    }

    /// Whether `cidr` lies in a CIDR being drained.
    pub(crate) fn drains(&self, cidr: &IpNet) -> bool {
        lock(&self.draining).iter().any(|d| d.contains(cidr))
    }

    /// Learn the pool's spec (read by a claim or the session loop).
    pub(crate) fn saw_spec(&self, spec: &PoolSpec) {
        *lock(&self.draining) = spec.draining.clone();
        self.reclaims
            .store(spec.reclaim_after > 0, Ordering::SeqCst);
    }

    /// Serializes claims of this binding.
    pub(crate) async fn claim_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.claim.lock().await
    }

    /// Start allocating from `o` unless `blocks` (this binding's, write-locked) has it
    /// already; whether it was added. A claim and the session loop's adoption can both find
    /// the same block new: the adoption may read etcd after the claim's create and take the
    /// lock before the claim does.
    pub(crate) fn serve(&self, blocks: &mut Vec<Owned>, o: Owned) -> bool {
        if blocks.iter().any(|x| x.cidr == o.cidr) {
            return false;
        }
        blocks.push(o);
        // Under the write lock: an allocation that sees the block also sees the generation.
        self.generation.fetch_add(1, Ordering::SeqCst);
        true
    }
}

/// Counters for /metrics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub claims: AtomicU64,
    pub releases: AtomicU64,
    pub lost: AtomicU64,
    pub reclaimed: AtomicU64,
    /// Routes to other nodes' blocks in place after the last reconcile (a gauge).
    pub routes: AtomicU64,
}

impl Counters {
    pub(crate) fn set_routes(&self, n: usize) {
        self.routes
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// A block etcd no longer records as this node's (reclaimed while the node was cut off,
/// or `release-node --force`): never allocated from again by this daemon; its leases here
/// stay until their pods are deleted, and their DEL is local.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LostBlock {
    pub pool: String,
    pub network: String,
    pub cidr: IpNet,
    /// Leases this node still holds in it, as last counted.
    pub held: usize,
}

pub(crate) struct Node {
    pub(crate) opts: ClusterOptions,
    pub(crate) etcd: Etcd,
    /// The etcd lease of this node's session; 0 while there is none.
    pub(crate) session: AtomicI64,
    pub(crate) standing: Standing,
    /// Blocks lost (see [`LostBlock`]).
    pub(crate) lost: Mutex<Vec<LostBlock>>,
    /// Pool views for /metrics, read from etcd at most every few seconds.
    pub(crate) views: ViewCache,
    bindings: Mutex<HashMap<(String, String), Arc<Binding>>>,
    /// Blocks taken out of service to be released, whose deletion has not been confirmed
    /// (a timed-out delete may or may not have happened): never used again, retried.
    pub(crate) limbo: Mutex<Vec<(String, Owned)>>,
    pub(crate) counters: Counters,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Node {
    pub(crate) async fn new(opts: ClusterOptions) -> Result<Node, Error> {
        super::check_node(&opts.node)?;
        let etcd = Etcd::connect(&opts.etcd).await?;
        Ok(Node {
            etcd,
            session: AtomicI64::new(0),
            standing: Standing::new(opts.session_ttl),
            lost: Mutex::default(),
            views: ViewCache::default(),
            bindings: Mutex::default(),
            limbo: Mutex::default(),
            counters: Counters::default(),
            opts,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.opts.node
    }

    pub(crate) fn binding(&self, pool: &str, network: &str) -> Arc<Binding> {
        let mut all = lock(&self.bindings);
        let b = all
            .entry((pool.to_string(), network.to_string()))
            .or_insert_with(|| Arc::new(Binding::new(pool, network)));
        Arc::clone(b)
    }

    pub(crate) fn bindings(&self) -> Vec<Arc<Binding>> {
        lock(&self.bindings).values().cloned().collect()
    }

    /// Blocks owned, over all pools (for /metrics).
    pub(crate) async fn blocks_owned(&self) -> usize {
        let mut n = 0;
        for b in self.bindings() {
            n += b.blocks.read().await.len();
        }
        n
    }

    /// The blocks this node allocates from now, as it knows them itself (ahead of any
    /// watch of etcd: a claim adds its block here before the ADD that needed it returns).
    pub(crate) async fn owned_cidrs(&self) -> std::collections::BTreeSet<IpNet> {
        let mut all = std::collections::BTreeSet::new();
        for b in self.bindings() {
            all.extend(b.blocks.read().await.iter().map(|o| o.cidr));
        }
        all
    }

    /// ADD from cluster pools: one address per pool, from this node's blocks, claiming a
    /// block when a pool has none with room.
    pub(crate) async fn allocate<S: LocalStore>(
        &self,
        store: &S,
        req: AllocateRequest,
    ) -> Result<Vec<Allocation>, Error> {
        let network = req.key.network.clone();
        let bindings: Vec<Arc<Binding>> = req
            .pools
            .iter()
            .map(|p| self.binding(p, &network))
            .collect();
        if let Some(why) = self.fenced(&bindings) {
            return self.allocate_fenced(store, req, &why).await;
        }
        // Each round either allocates or adds a block to some pool (or fails): a few rounds
        // cover concurrent ADDs filling a fresh block before this one gets its address.
        let mut full_yet_room = 0;
        for _ in 0..8 {
            let mut guards = Vec::with_capacity(bindings.len());
            for b in &bindings {
                guards.push(b.blocks.read().await);
            }
            let sets: Vec<RangeSet> = (bindings.iter().zip(&guards))
                .map(|(b, g)| b.range_set(g))
                .collect();
            // No block, or every block draining: nothing to allocate from.
            let empty: Vec<usize> = (0..bindings.len())
                .filter(|&i| sets[i].is_empty())
                .collect();
            if !empty.is_empty() {
                let seen: Vec<u64> = empty
                    .iter()
                    .map(|&i| bindings[i].generation.load(Ordering::SeqCst))
                    .collect();
                drop(guards);
                // Idempotent ADD needs no block.
                if let Some(held) = again_if_held(store, &req).await? {
                    return Ok(held);
                }
                for (&i, gen) in empty.iter().zip(seen) {
                    self.claim_patiently(&bindings[i], gen).await?;
                }
                continue;
            }
            let seen: Vec<u64> = bindings
                .iter()
                .map(|b| b.generation.load(Ordering::SeqCst))
                .collect();
            let attempt = AllocateRequest {
                range_sets: sets.clone(),
                pools: Vec::new(),
                ..req.clone()
            };
            let res = store.allocate(attempt).await;
            drop(guards);
            match res {
                Err(e) if e.kind() == ErrorKind::Exhausted => {
                    let mut claimed_any = false;
                    for (i, set) in sets.into_iter().enumerate() {
                        if !store.has_room(&network, set).await? {
                            self.claim_patiently(&bindings[i], seen[i]).await?;
                            claimed_any = true;
                        }
                    }
                    // Every set has room again: a concurrent DEL released an address after
                    // the attempt. Try again rather than report a full pool; the same answer
                    // three times is the answer.
                    if !claimed_any {
                        full_yet_room += 1;
                        if full_yet_room == 3 {
                            return Err(e);
                        }
                    }
                }
                other => return other,
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "pool(s) {}: the blocks claimed for this ADD were filled by concurrent ADDs each time; try again",
                req.pools.join(", ")
            ),
        ))
    }

    /// STATUS: Ok while an ADD could get an address from every pool now.
    pub(crate) async fn status<S: LocalStore>(
        &self,
        store: &S,
        network: &str,
        pools: &[String],
    ) -> Result<(), Error> {
        let bindings: Vec<Arc<Binding>> = pools.iter().map(|p| self.binding(p, network)).collect();
        if let Some(why) = self.fenced(&bindings) {
            return Err(self.fenced_error(&why));
        }
        for pool in pools {
            let b = self.binding(pool, network);
            let set = b.range_set(&b.blocks.read().await);
            if !set.is_empty() && store.has_room(network, set).await? {
                continue;
            }
            // A new block would be needed: etcd must answer and have one.
            let (spec, _) = self.spec(pool).await?;
            let claimed = read_blocks(&self.etcd, pool).await?;
            let taken: HashSet<IpNet> = claimed.iter().map(|c| c.cidr).collect();
            let quarantined = claimed.iter().any(|c| c.record.reclaimed.is_some());
            if blocks::first_free(&spec, &taken, 0).is_none() && !quarantined {
                return Err(exhausted(pool, &spec, taken.len()));
            }
        }
        Ok(())
    }

    /// Why allocation from these bindings is fenced, if it is. Only pools that reclaim on
    /// their own are: a pool reclaimed by hand alone keeps serving while etcd is away
    /// (`release-node` refuses a node with a session and is the operator's call).
    pub(crate) fn fenced(&self, bindings: &[Arc<Binding>]) -> Option<String> {
        let reclaimable = bindings.iter().any(|b| b.reclaims.load(Ordering::SeqCst));
        if reclaimable {
            self.standing.fenced()
        } else {
            None
        }
    }

    /// ADD while fenced: only a key that holds its addresses already gets an answer.
    async fn allocate_fenced<S: LocalStore>(
        &self,
        store: &S,
        req: AllocateRequest,
        why: &str,
    ) -> Result<Vec<Allocation>, Error> {
        match again_if_held(store, &req).await? {
            Some(held) => Ok(held),
            None => Err(self.fenced_error(why)),
        }
    }

    fn fenced_error(&self, why: &str) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "node {} hands out no new address from its pool blocks: {why}; it resumes once it reaches etcd ({}) again and has confirmed its blocks (DEL, CHECK and repeated ADDs still work)",
                self.name(),
                self.etcd.endpoints()
            ),
        )
    }

    /// The blocks lost so far.
    pub(crate) fn lost_blocks(&self) -> Vec<LostBlock> {
        lock(&self.lost).clone()
    }
}

/// The answer of a repeated ADD (the key holds leases already: the store answers it before
/// looking at any range), or None for a new one.
async fn again_if_held<S: LocalStore>(
    store: &S,
    req: &AllocateRequest,
) -> Result<Option<Vec<Allocation>>, Error> {
    if store.held(req.key.clone()).await?.is_empty() {
        return Ok(None);
    }
    let again = AllocateRequest {
        range_sets: Vec::new(),
        pools: Vec::new(),
        ..req.clone()
    };
    store.allocate(again).await.map(Some)
}

pub(crate) fn exhausted(pool: &str, spec: &PoolSpec, claimed: usize) -> Error {
    Error::new(
        ErrorKind::Exhausted,
        format!(
            "pool {pool} ({}) is exhausted: all {claimed} blocks are claimed and this node's are full; free addresses, `cnikit ipamd pool update {pool} --add-cidr CIDR`, or release-node nodes that are gone",
            spec.cidr_list()
        ),
    )
}

/// Leases of a network that lie in one block.
pub(crate) fn count_in(block: &IpNet, addrs: &[std::net::IpAddr]) -> u64 {
    addrs.iter().filter(|a| block.contains(*a)).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(cidr: &str) -> Owned {
        Owned {
            cidr: cidr.parse().unwrap(),
            mod_revision: 7,
            pushed: Some(0),
            empty_since: None,
        }
    }

    #[test]
    fn a_block_claimed_and_adopted_at_once_is_served_once() {
        let b = Binding::new("p", "n");
        let mut blocks = Vec::new();
        assert!(b.serve(&mut blocks, owned("10.0.0.0/27")));
        assert!(!b.serve(&mut blocks, owned("10.0.0.0/27")));
        assert!(b.serve(&mut blocks, owned("10.0.0.32/27")));
        assert_eq!(blocks.len(), 2);
        assert_eq!(b.generation.load(Ordering::SeqCst), 2);
    }
}
