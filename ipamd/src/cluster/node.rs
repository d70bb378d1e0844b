//! The daemon's side of the pools: this node's etcd session, the blocks it owns per (pool,
//! network), and claiming a block when an allocation finds the node's blocks full.
//!
//! Allocation holds a read lock on the blocks of each pool it allocates from while the
//! store runs it; releasing a block takes the write lock, so a block is never released
//! while an allocation that may have chosen an address in it is still under way.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ipnet::IpNet;
use tokio::sync::RwLock;

use super::admin::{read_blocks, read_spec};
use super::etcd::{self, Etcd, Guard};
use super::{block_key, blocks, node_key, pool_key, BlockRecord, ClusterOptions, LocalStore};
use crate::api::{AllocateRequest, Allocation};
use crate::config::RangeSet;
use crate::log::Level;
use crate::{log_at, Error, ErrorKind};

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
    generation: AtomicU64,
}

impl Binding {
    fn new(pool: &str, network: &str) -> Binding {
        Binding {
            pool: pool.to_string(),
            network: network.to_string(),
            blocks: RwLock::default(),
            claim: tokio::sync::Mutex::default(),
            generation: AtomicU64::new(0),
        }
    }

    fn range_set(blocks: &[Owned]) -> RangeSet {
        blocks.iter().map(|b| blocks::range(&b.cidr)).collect()
    }

    /// Start allocating from `o` unless `blocks` (this binding's, write-locked) has it
    /// already; whether it was added. A claim and the session loop's adoption can both find
    /// the same block new: the adoption may read etcd after the claim's create and take the
    /// lock before the claim does.
    fn serve(&self, blocks: &mut Vec<Owned>, o: Owned) -> bool {
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
}

pub(crate) struct Node {
    pub(crate) opts: ClusterOptions,
    pub(crate) etcd: Etcd,
    /// The etcd lease of this node's session; 0 while there is none.
    pub(crate) session: AtomicI64,
    bindings: Mutex<HashMap<(String, String), Arc<Binding>>>,
    /// Blocks taken out of service to be released, whose deletion has not been confirmed
    /// (a timed-out delete may or may not have happened): never used again, retried.
    pub(crate) limbo: Mutex<Vec<(String, Owned)>>,
    pub(crate) counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Node {
    pub(crate) async fn new(opts: ClusterOptions) -> Result<Node, Error> {
        super::check_node(&opts.node)?;
        let etcd = Etcd::connect(&opts.etcd).await?;
        Ok(Node {
            opts,
            etcd,
            session: AtomicI64::new(0),
            bindings: Mutex::default(),
            limbo: Mutex::default(),
            counters: Counters::default(),
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
        // Each round either allocates or adds a block to some pool (or fails): a few rounds
        // cover concurrent ADDs filling a fresh block before this one gets its address.
        for _ in 0..8 {
            let mut guards = Vec::with_capacity(bindings.len());
            for b in &bindings {
                guards.push(b.blocks.read().await);
            }
            let empty: Vec<usize> = (0..bindings.len())
                .filter(|&i| guards[i].is_empty())
                .collect();
            if !empty.is_empty() {
                let seen: Vec<u64> = empty
                    .iter()
                    .map(|&i| bindings[i].generation.load(Ordering::SeqCst))
                    .collect();
                drop(guards);
                // Idempotent ADD needs no block: the store answers a key that holds leases
                // before it looks at any range.
                if !store.held(req.key.clone()).await?.is_empty() {
                    let again = AllocateRequest {
                        range_sets: Vec::new(),
                        pools: Vec::new(),
                        ..req.clone()
                    };
                    return store.allocate(again).await;
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
            let sets: Vec<RangeSet> = guards.iter().map(|g| Binding::range_set(g)).collect();
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
                    if !claimed_any {
                        return Err(e);
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
        for pool in pools {
            let b = self.binding(pool, network);
            let set = Binding::range_set(&b.blocks.read().await);
            if !set.is_empty() && store.has_room(network, set).await? {
                continue;
            }
            // A new block would be needed: etcd must answer and have one.
            let (spec, _) = self.spec(pool).await?;
            let claimed: HashSet<IpNet> = read_blocks(&self.etcd, pool)
                .await?
                .into_iter()
                .map(|c| c.cidr)
                .collect();
            if blocks::first_free(&spec, &claimed, 0).is_none() {
                return Err(exhausted(pool, &spec.cidr, claimed.len()));
            }
        }
        Ok(())
    }

    async fn spec(&self, pool: &str) -> Result<(super::PoolSpec, i64), Error> {
        read_spec(&self.etcd, pool).await?.ok_or_else(|| {
            Error::invalid(format!(
                "pool {pool} does not exist in etcd ({}); create it with `cnikit ipamd pool create {pool} --cidr CIDR --etcd-endpoints …`",
                self.etcd.endpoints()
            ))
        })
    }

    /// [`Node::claim`], tried again while etcd is briefly unavailable (for up to
    /// [`etcd::PATIENCE`]): a runtime would otherwise fail the pod and retry it only after
    /// its own back-off. A claim is safe to repeat: it adopts a block its lost answer made.
    async fn claim_patiently(&self, b: &Binding, seen: u64) -> Result<(), Error> {
        let what = format!("pool {}: claiming a block", b.pool);
        etcd::patiently(&what, || self.claim(b, seen)).await
    }

    /// Give `b` one more block (unless another claim did since generation `seen`): adopt a
    /// block etcd says is ours, or claim a free one with a transaction that succeeds only
    /// if the block is unclaimed, the pool is the one read, and our session is live.
    async fn claim(&self, b: &Binding, seen: u64) -> Result<(), Error> {
        let _one = b.claim.lock().await;
        if b.generation.load(Ordering::SeqCst) != seen {
            return Ok(());
        }
        // Just started, or renewing after an expiry: the session loop is at it; wait for it
        // as long as one etcd call may take.
        let deadline = Instant::now() + self.opts.etcd.timeout;
        let mut session = self.session.load(Ordering::SeqCst);
        while session == 0 && Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            session = self.session.load(Ordering::SeqCst);
        }
        if session == 0 {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "pool {}: this node ({}) needs a new block but has no etcd session yet (etcd {}): try again",
                    b.pool,
                    self.name(),
                    self.etcd.endpoints()
                ),
            ));
        }
        let (spec, pool_rev) = self.spec(&b.pool).await?;
        let started = Instant::now();
        for _ in 0..16 {
            let claimed = read_blocks(&self.etcd, &b.pool).await?;
            // Blocks etcd says are ours come first; so does any block added meanwhile (the
            // session loop adopts this node's blocks after a restart).
            self.adopt(b, &claimed).await;
            if b.generation.load(Ordering::SeqCst) != seen {
                return Ok(());
            }
            let taken: HashSet<IpNet> = claimed.iter().map(|c| c.cidr).collect();
            let Some(cidr) =
                blocks::first_free(&spec, &taken, blocks::start_for(&spec, self.name()))
            else {
                return Err(exhausted(&b.pool, &spec.cidr, taken.len()));
            };
            let record = BlockRecord {
                node: self.name().to_string(),
                network: b.network.clone(),
                in_use: 0,
            };
            let guards = [
                Guard::CreateRevision(pool_key(&b.pool), pool_rev),
                Guard::Lease(node_key(self.name()), session),
            ];
            let key = block_key(&b.pool, &cidr);
            match self
                .etcd
                .create(&key, super::admin::encode(&record)?, &guards)
                .await?
            {
                Some(rev) => {
                    let claimed = Owned {
                        cidr,
                        mod_revision: rev,
                        pushed: Some(0),
                        empty_since: Some(Instant::now()),
                    };
                    b.serve(&mut *b.blocks.write().await, claimed);
                    self.counters.claims.fetch_add(1, Ordering::Relaxed);
                    log_at!(
                        Level::Info,
                        "pool {}: claimed block {cidr} for network {} in {:?}",
                        b.pool,
                        b.network,
                        started.elapsed()
                    );
                    return Ok(());
                }
                None => {
                    // Lost a race for the block, or the pool or our session changed.
                    if self.spec(&b.pool).await?.1 != pool_rev {
                        return Err(Error::invalid(format!(
                            "pool {} was deleted or re-created while claiming a block",
                            b.pool
                        )));
                    }
                    let live = self.etcd.get(&node_key(self.name())).await?;
                    if live.map(|kv| kv.lease) != Some(session) {
                        self.session.store(0, Ordering::SeqCst);
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            format!(
                                "pool {}: this node's etcd session expired; it is being renewed, try again",
                                b.pool
                            ),
                        ));
                    }
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "pool {}: every free block was claimed by another node first, 16 times; try again",
                b.pool
            ),
        ))
    }

    /// Take into `b` the blocks etcd records as this node's for `b`'s network that it does
    /// not serve yet (claimed before a restart, or by a claim whose answer was lost).
    /// Returns how many were added.
    pub(crate) async fn adopt(&self, b: &Binding, claimed: &[super::admin::ClaimedBlock]) -> usize {
        let limbo: HashSet<IpNet> = lock(&self.limbo)
            .iter()
            .filter(|(p, _)| *p == b.pool)
            .map(|(_, o)| o.cidr)
            .collect();
        let mut blocks = b.blocks.write().await;
        let mut added = 0;
        for c in claimed {
            let mine = c.record.node == self.name() && c.record.network == b.network;
            if !mine || limbo.contains(&c.cidr) {
                continue;
            }
            let before = Owned {
                cidr: c.cidr,
                mod_revision: c.mod_revision,
                pushed: Some(c.record.in_use),
                empty_since: None,
            };
            if b.serve(&mut blocks, before) {
                log_at!(
                    Level::Info,
                    "pool {}: serving block {} of network {} again (claimed before)",
                    b.pool,
                    c.cidr,
                    b.network
                );
                added += 1;
            }
        }
        added
    }
}

fn exhausted(pool: &str, cidr: &IpNet, claimed: usize) -> Error {
    Error::new(
        ErrorKind::Exhausted,
        format!(
            "pool {pool} ({cidr}) is exhausted: all {claimed} blocks are claimed and this node's are full; free addresses, add a pool, or release-node nodes that are gone"
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
