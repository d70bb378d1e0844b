//! The lease operations, identical for the daemon and the in-process fallback. The daemon runs
//! queued operations as one batch under one lock and one fsync (group commit); the
//! in-process path runs a batch of one.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;

use super::indexed::View;
use super::state::Key;
use super::{Batch, Store};
use crate::api::{AllocateRequest, Allocation, LeaseInfo};
use crate::attachment::Attachment;
use crate::config::{canonicalize_range_sets, RangeSet};
use crate::journal::{Holder, Record, StoredLease};
use crate::pool::{describe, requested_set, want_once, Pool};
use crate::store::State;
use crate::{Error, ErrorKind};

/// One operation on a network's store.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Allocate(AllocateRequest),
    Release { cid: String, ifname: String },
    Check { cid: String, ifname: String },
    Gc(Vec<Attachment>),
    Status(Vec<RangeSet>),
    Leases,
    Reclaim,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Allocations(Vec<Allocation>),
    Done,
    Freed(usize),
    Leases(Vec<LeaseInfo>),
}

impl Store {
    /// Run `ops` in order under one lock. Each op succeeds or fails on its own.
    pub(crate) fn execute_batch(&mut self, ops: &[Op]) -> Batch {
        let mut durable = vec![false; ops.len()];
        let res = self.locked(|st| {
            Ok(ops
                .iter()
                .zip(durable.iter_mut())
                .map(|(op, d)| {
                    st.apply_op(op).map(|(reply, needs_sync)| {
                        *d = needs_sync;
                        reply
                    })
                })
                .collect::<Vec<_>>())
        });
        match res {
            Ok(results) => {
                let ticket = durable.iter().any(|d| *d).then(|| self.ticket()).flatten();
                Batch::new(results, ticket)
            }
            Err(e) => Batch::new(ops.iter().map(|_| Err(e.clone())).collect(), None),
        }
    }

    /// Run one op and wait for it to be durable.
    pub(crate) fn execute(&mut self, op: Op) -> Result<Reply, Error> {
        self.execute_batch(std::slice::from_ref(&op))
            .finish(|| self)
            .pop()
            .unwrap_or_else(|| Err(Error::internal("empty batch result")))
    }

    /// Must hold the lock. Returns the answer and whether it must be made durable first.
    pub(super) fn apply_op(&mut self, op: &Op) -> Result<(Reply, bool), Error> {
        let one_attachment = matches!(op, Op::Allocate(_) | Op::Release { .. } | Op::Check { .. });
        if self.base.is_some() && !one_attachment {
            // Only those three are answered through the snapshot's index.
            self.load(None)?;
        }
        match op {
            Op::Allocate(req) => match self.allocate_locked(req) {
                Err(e) if e.kind() == ErrorKind::Exhausted && self.may_reclaim() => {
                    let boot = self.opts.boot_id.clone();
                    self.release_where(|_, h| h.boot != boot)?;
                    self.allocate_locked(req)
                }
                other => other,
            }
            .map(|a| (Reply::Allocations(a), true)),
            Op::Release { cid, ifname } => {
                let key: Key = (cid.clone(), ifname.clone());
                if self.view().holder(&key)?.is_some() {
                    self.append(Record::Release { keys: vec![key] })?;
                }
                // Even with nothing to release, what we observed may come from a writer that
                // died before its fsync: make it durable before acknowledging.
                Ok((Reply::Done, true))
            }
            Op::Check { cid, ifname } => {
                let key: Key = (cid.clone(), ifname.clone());
                let held = match self.view().holder(&key)? {
                    Some(h) => existing(&h, &[])?,
                    None => Vec::new(),
                };
                Ok((Reply::Allocations(held), false))
            }
            Op::Gc(valid) => {
                let valid: HashSet<Key> = valid
                    .iter()
                    .map(|a| (a.container_id.clone(), a.ifname.clone()))
                    .collect();
                self.release_where(|key, _| !valid.contains(key))
            }
            Op::Status(range_sets) => {
                status_of(&self.state, self.boot_id(), range_sets).map(|r| (r, false))
            }
            Op::Leases => Ok((
                Reply::Leases(lease_infos(&self.network, &self.state)),
                false,
            )),
            Op::Reclaim => {
                let boot = self.boot_id().to_string();
                if boot.is_empty() {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        "the current boot ID is unknown; not reclaiming anything",
                    ));
                }
                self.release_where(|_, h| h.boot != boot)
            }
        }
    }

    /// Give `req.key` one address per range set, or return what it already holds.
    fn allocate_locked(&mut self, req: &AllocateRequest) -> Result<Vec<Allocation>, Error> {
        req.key.validate()?;
        if req.key.network != self.network {
            return Err(Error::internal(format!(
                "request for network {} sent to the store of {}",
                req.key.network, self.network
            )));
        }
        let key: Key = (req.key.container_id.clone(), req.key.ifname.clone());
        if let Some(h) = self.view().holder(&key)? {
            // Idempotent ADD. The lease may come from a writer that died before its fsync:
            // the caller makes it durable before acknowledging it again.
            return existing(&h, &req.requested);
        }
        let sets = canonicalize_range_sets(&req.range_sets)?;
        let chosen = choose(&self.view(), self.boot_id(), &key, &sets, &req.requested)?;
        let holder = Holder {
            cid: key.0,
            ifname: key.1,
            boot: self.boot_id().to_string(),
            ts: now_unix(),
            leases: chosen,
        };
        let allocations = holder.leases.iter().map(to_allocation).collect();
        self.append(Record::Alloc(holder))?;
        Ok(allocations)
    }

    /// Reclaiming on a full pool is allowed and would free something.
    fn may_reclaim(&self) -> bool {
        let boot = &self.opts.boot_id;
        // Through the index, a full set is answered by reading every lease instead.
        self.base.is_none()
            && self.opts.reclaim_when_full
            && !boot.is_empty()
            && self.state.holders.values().any(|h| &h.boot != boot)
    }

    fn release_where(
        &mut self,
        pred: impl Fn(&Key, &Holder) -> bool,
    ) -> Result<(Reply, bool), Error> {
        let mut keys = Vec::new();
        let mut freed = 0;
        for (k, h) in &self.state.holders {
            if pred(k, h) {
                keys.push(k.clone());
                freed += h.leases.len();
            }
        }
        if keys.is_empty() {
            return Ok((Reply::Freed(0), false));
        }
        self.append(Record::Release { keys })?;
        Ok((Reply::Freed(freed), true))
    }

    // Typed single-operation helpers for tests.

    #[cfg(test)]
    pub(crate) fn allocate(&mut self, req: &AllocateRequest) -> Result<Vec<Allocation>, Error> {
        match self.execute(Op::Allocate(req.clone()))? {
            Reply::Allocations(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    #[cfg(test)]
    pub(crate) fn release(&mut self, cid: &str, ifname: &str) -> Result<(), Error> {
        self.execute(Op::Release {
            cid: cid.into(),
            ifname: ifname.into(),
        })
        .map(|_| ())
    }

    #[cfg(test)]
    pub(crate) fn check(&mut self, cid: &str, ifname: &str) -> Result<Vec<Allocation>, Error> {
        match self.execute(Op::Check {
            cid: cid.into(),
            ifname: ifname.into(),
        })? {
            Reply::Allocations(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    #[cfg(test)]
    pub(crate) fn gc(&mut self, valid: &[Attachment]) -> Result<usize, Error> {
        freed(self.execute(Op::Gc(valid.to_vec()))?)
    }

    #[cfg(test)]
    pub(crate) fn reclaim_previous_boots(&mut self) -> Result<usize, Error> {
        freed(self.execute(Op::Reclaim)?)
    }

    #[cfg(test)]
    pub(crate) fn status(&mut self, range_sets: &[RangeSet]) -> Result<(), Error> {
        self.execute(Op::Status(range_sets.to_vec())).map(|_| ())
    }

    #[cfg(test)]
    pub(crate) fn leases(&mut self) -> Result<Vec<LeaseInfo>, Error> {
        match self.execute(Op::Leases)? {
            Reply::Leases(l) => Ok(l),
            other => Err(unexpected(&other)),
        }
    }
}

/// The answer to `op` for a network that has no store: as for an empty one. Nothing is
/// created for it, so reads of names no one allocated in leave no trace.
pub(crate) fn answer_empty(op: &Op, boot: &str) -> Result<Reply, Error> {
    match op {
        Op::Allocate(_) => Err(Error::internal("an allocation needs the network's store")),
        Op::Release { .. } => Ok(Reply::Done),
        Op::Check { .. } => Ok(Reply::Allocations(Vec::new())),
        Op::Gc(_) | Op::Reclaim => Ok(Reply::Freed(0)),
        Op::Status(range_sets) => status_of(&State::default(), boot, range_sets),
        Op::Leases => Ok(Reply::Leases(Vec::new())),
    }
}

/// STATUS: every range set must have an address left.
fn status_of(state: &State, boot: &str, range_sets: &[RangeSet]) -> Result<Reply, Error> {
    let sets = canonicalize_range_sets(range_sets)?;
    for set in &sets {
        let pool = Pool::new(set);
        let used = in_use(state, &pool);
        if used >= pool.capacity() {
            return Err(exhausted(state, boot, set, &pool, used));
        }
    }
    Ok(Reply::Done)
}

#[cfg(test)]
fn freed(r: Reply) -> Result<usize, Error> {
    match r {
        Reply::Freed(n) => Ok(n),
        other => Err(unexpected(&other)),
    }
}

pub(crate) fn unexpected(r: &Reply) -> Error {
    Error::internal(format!("unexpected store reply {r:?}"))
}

pub(crate) fn lease_infos(network: &str, state: &State) -> Vec<LeaseInfo> {
    let mut out = Vec::new();
    for h in state.holders.values() {
        for l in &h.leases {
            out.push(LeaseInfo {
                network: network.to_string(),
                address: l.addr.addr(),
                container_id: h.cid.clone(),
                ifname: h.ifname.clone(),
                boot_id: h.boot.clone(),
                created_unix: h.ts,
            });
        }
    }
    out
}

/// Addresses in use and still free in each range set (for /metrics).
pub(crate) fn usage(state: &State, sets: &[RangeSet]) -> (u128, u128) {
    let (mut used, mut free) = (0u128, 0u128);
    for set in sets {
        let pool = Pool::new(set);
        let u = in_use(state, &pool);
        used += u;
        free += pool.capacity().saturating_sub(u);
    }
    (used, free)
}

fn in_use(state: &State, pool: &Pool<'_>) -> u128 {
    state
        .by_addr
        .keys()
        .filter(|a| pool.range_for(**a).is_some())
        .count() as u128
}

/// The answer for a key that already holds leases (ADD is idempotent), unless it asks for
/// specific addresses it does not hold.
fn existing(h: &Holder, requested: &[IpAddr]) -> Result<Vec<Allocation>, Error> {
    let held: Vec<IpAddr> = h.leases.iter().map(|l| l.addr.addr()).collect();
    if let Some(r) = requested.iter().find(|r| !held.contains(r)) {
        let list: Vec<String> = held.iter().map(ToString::to_string).collect();
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "container {}/{} already holds {}; requested address {r} differs (delete the attachment first)",
                h.cid,
                h.ifname,
                list.join(", ")
            ),
        ));
    }
    let mut leases = h.leases.clone();
    leases.sort_by_key(|l| l.rs);
    Ok(leases.iter().map(to_allocation).collect())
}

fn to_allocation(l: &StoredLease) -> Allocation {
    Allocation {
        address: l.addr,
        gateway: l.gw,
    }
}

/// Pick one address per range set, honouring requested addresses; changes nothing.
fn choose(
    view: &View<'_>,
    boot: &str,
    key: &Key,
    sets: &[RangeSet],
    requested: &[IpAddr],
) -> Result<Vec<StoredLease>, Error> {
    let pools: Vec<Pool<'_>> = sets.iter().map(Pool::new).collect();
    let mut wanted: Vec<Option<IpAddr>> = vec![None; sets.len()];
    for &ip in requested {
        let i = requested_set(&pools, ip)?;
        pools[i].requested_range(ip)?;
        want_once(&mut wanted, &pools, i, ip)?;
        if let Some(holder) = view.holder_of(ip)? {
            if &holder != key {
                return Err(Error::conflict(format!(
                    "requested address {ip} is held by container {}/{}",
                    holder.0, holder.1
                )));
            }
        }
    }

    let mut out = Vec::with_capacity(sets.len());
    for (i, (set, pool)) in sets.iter().zip(&pools).enumerate() {
        let rs = u32::try_from(i).map_err(|_| Error::invalid("too many range sets"))?;
        let (ip, range_idx) = match wanted[i] {
            Some(ip) => (ip, pool.range_for(ip).unwrap_or(0)),
            None => {
                // No count of the addresses in use on this path: it is O(leases) per
                // allocation. The walk is bounded by the lease count and only fails on a
                // full set; the count is for the message.
                // Once a lookup has failed every address counts as used (no more reads;
                // the walk ends within its bound) and that error is returned.
                let failed = std::cell::RefCell::new(None);
                let free = pool.next_free(view.last(rs), view.lease_bound(), |a| {
                    if failed.borrow().is_some() {
                        return true;
                    }
                    view.is_used(a).unwrap_or_else(|e| {
                        *failed.borrow_mut() = Some(e);
                        true
                    })
                });
                if let Some(e) = failed.into_inner() {
                    return Err(e);
                }
                free.ok_or_else(|| match view.full() {
                    Some(state) => exhausted(state, boot, set, pool, in_use(state, pool)),
                    // The caller asks again with every lease (indexed.rs).
                    None => Error::new(
                        ErrorKind::Exhausted,
                        format!("no free address in {}", describe(set)),
                    ),
                })?
            }
        };
        let range = pool
            .range(range_idx)
            .ok_or_else(|| Error::internal("range index out of bounds"))?;
        let addr = IpNet::new(ip, range.subnet.prefix_len())
            .map_err(|e| Error::internal(format!("bad prefix for {ip}: {e}")))?;
        out.push(StoredLease {
            addr,
            gw: range.gateway,
            rs,
        });
    }
    Ok(out)
}

fn exhausted(state: &State, boot: &str, set: &RangeSet, pool: &Pool<'_>, used: u128) -> Error {
    let mut msg = format!("no free address in {} ({used} in use)", describe(set));
    // The classic host-local failure after a reboot: say what would free the addresses.
    let stale = state
        .holders
        .values()
        .filter(|h| !boot.is_empty() && h.boot != boot)
        .flat_map(|h| h.leases.iter())
        .filter(|l| pool.range_for(l.addr.addr()).is_some())
        .count();
    if stale > 0 {
        msg.push_str(&format!(
            "; {stale} of them were leased before the last reboot and are kept because reclaiming is off (ipamd daemon --reclaim-previous-boot=false): let the runtime run CNI GC, or restart the daemon without that flag"
        ));
    }
    Error::new(ErrorKind::Exhausted, msg)
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
