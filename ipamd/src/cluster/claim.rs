//! Claiming a block for a binding when its blocks are full: adopt a block etcd records as
//! this node's, else take a never-used (or voluntarily released) block, else, only then,
//! the quarantined block reclaimed longest ago. Each claim is one transaction that holds
//! only if the block is as read (absent, or the quarantined record read), the pool spec is
//! unchanged since read (a CIDR being drained cannot get a block from a stale read), and
//! this node's session key is on its live lease.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::etcd::{self, Guard, Write};
use super::node::{exhausted, lock, Binding, Node, Owned};
use super::records::{encode, BlockRecord, PoolSpec};
use super::show::{read_blocks, read_spec, ClaimedBlock};
use super::{block_key, blocks, node_key, pool_key};
use crate::log::Level;
use crate::{log_at, Error, ErrorKind};

/// The block a claim goes for.
enum Choice {
    Free(IpNet),
    /// A quarantined block and its record's mod revision.
    Quarantined(IpNet, i64, String),
}

impl Node {
    /// The pool's spec and its key's mod revision.
    pub(crate) async fn spec(&self, pool: &str) -> Result<(PoolSpec, i64), Error> {
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
    pub(crate) async fn claim_patiently(&self, b: &Binding, seen: u64) -> Result<(), Error> {
        let what = format!("pool {}: claiming a block", b.pool);
        etcd::patiently(&what, || self.claim(b, seen)).await
    }

    /// Give `b` one more block, unless another claim did since generation `seen`.
    async fn claim(&self, b: &Binding, seen: u64) -> Result<(), Error> {
        let _one = b.claim_turn().await;
        if b.generation.load(Ordering::SeqCst) != seen {
            return Ok(());
        }
        let session = self.wait_for_session(&b.pool).await?;
        let started = Instant::now();
        for _ in 0..16 {
            let (spec, pool_rev) = self.spec(&b.pool).await?;
            b.saw_spec(&spec);
            let claimed = read_blocks(&self.etcd, &b.pool).await?;
            // Blocks etcd says are ours come first; so does any block added meanwhile (the
            // session loop adopts this node's blocks after a restart).
            self.adopt(b, &claimed).await;
            if b.generation.load(Ordering::SeqCst) != seen {
                return Ok(());
            }
            let Some(choice) = self.choose(&b.pool, &spec, &claimed) else {
                return Err(exhausted(&b.pool, &spec, claimed.len()));
            };
            let (cidr, block_guard, from) = match &choice {
                Choice::Free(c) => (*c, Guard::Absent(block_key(&b.pool, c)), None),
                Choice::Quarantined(c, rev, from) => (
                    *c,
                    Guard::ModRevision(block_key(&b.pool, c), *rev),
                    Some(from.as_str()),
                ),
            };
            let guards = [
                block_guard,
                Guard::ModRevision(pool_key(&b.pool), pool_rev),
                Guard::Lease(node_key(self.name()), session),
            ];
            let key = block_key(&b.pool, &cidr);
            let record = encode(&BlockRecord::owned(self.name(), &b.network, 0))?;
            let put = vec![Write::Put(key.clone(), record, 0)];
            if let Some(rev) = self.etcd.write_if("claim", &key, &guards, put).await? {
                let claimed = Owned {
                    cidr,
                    mod_revision: rev,
                    pushed: Some(0),
                    empty_since: Some(Instant::now()),
                };
                b.serve(&mut *b.blocks.write().await, claimed);
                self.counters.claims.fetch_add(1, Ordering::Relaxed);
                let quarantine = from
                    .map(|n| {
                        format!(" (quarantined, reclaimed from node {n}: no free block was left)")
                    })
                    .unwrap_or_default();
                log_at!(
                    Level::Info,
                    "pool {}: claimed block {cidr}{quarantine} for network {} in {:?}",
                    b.pool,
                    b.network,
                    started.elapsed()
                );
                return Ok(());
            }
            // Lost a race for the block, or the pool changed (read again), or our session.
            let live = self.etcd.get(&node_key(self.name())).await?;
            if live.map(|kv| kv.lease) != Some(session) {
                // The session loop starts a new one; as after any expiry, the blocks are
                // confirmed before this node allocates from them again.
                self.standing.expired();
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
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "pool {}: every free block was claimed by another node first, 16 times; try again",
                b.pool
            ),
        ))
    }

    /// The session to claim under. Just started, or renewing after an expiry: the session
    /// loop is at it; wait for it as long as one etcd call may take.
    async fn wait_for_session(&self, pool: &str) -> Result<i64, Error> {
        let deadline = Instant::now() + self.opts.etcd.timeout;
        let mut session = self.session.load(Ordering::SeqCst);
        while session == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            session = self.session.load(Ordering::SeqCst);
        }
        if session == 0 {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "pool {pool}: this node ({}) needs a new block but has no etcd session yet (etcd {}): try again",
                    self.name(),
                    self.etcd.endpoints()
                ),
            ));
        }
        Ok(session)
    }

    /// A free block (never used, or given back), else the quarantined block reclaimed
    /// longest ago: a node that was only cut off keeps its addresses unused as long as
    /// possible. Never a block this node lost.
    fn choose(&self, pool: &str, spec: &PoolSpec, claimed: &[ClaimedBlock]) -> Option<Choice> {
        let lost: HashSet<IpNet> = lock(&self.lost)
            .iter()
            .filter(|l| l.pool == pool)
            .map(|l| l.cidr)
            .collect();
        let mut taken: HashSet<IpNet> = claimed.iter().map(|c| c.cidr).collect();
        taken.extend(&lost);
        let start = blocks::start_for(spec, self.name());
        if let Some(free) = blocks::first_free(spec, &taken, start) {
            return Some(Choice::Free(free));
        }
        claimed
            .iter()
            .filter(|c| !lost.contains(&c.cidr) && !blocks::is_draining(spec, &c.cidr))
            .filter(|c| blocks::index_of(spec, &c.cidr).is_some())
            .filter_map(|c| c.record.reclaimed.as_ref().map(|r| (r, c)))
            .min_by_key(|(r, c)| (r.at_ms, c.cidr))
            .map(|(r, c)| Choice::Quarantined(c.cidr, c.mod_revision, r.from.clone()))
    }

    /// Take into `b` the blocks etcd records as this node's for `b`'s network that it does
    /// not serve yet (claimed before a restart, or by a claim whose answer was lost), except
    /// those in limbo or lost. Returns how many were added.
    pub(crate) async fn adopt(&self, b: &Binding, claimed: &[ClaimedBlock]) -> usize {
        let mut skip: HashSet<IpNet> = lock(&self.limbo)
            .iter()
            .filter(|(p, _)| *p == b.pool)
            .map(|(_, o)| o.cidr)
            .collect();
        skip.extend(
            lock(&self.lost)
                .iter()
                .filter(|l| l.pool == b.pool)
                .map(|l| l.cidr),
        );
        let mut blocks = b.blocks.write().await;
        let mut added = 0;
        for c in claimed {
            if !c.record.is_owned_by(self.name(), &b.network) || skip.contains(&c.cidr) {
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
