//! The lease operations, identical for the daemon and the in-process fallback: both call
//! these on a `Store`, under its lock, and wait on the returned ticket before answering.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;

use super::state::Key;
use super::{Store, Ticket};
use crate::api::{AllocateRequest, Allocation, Attachment, LeaseInfo};
use crate::config::{canonicalize_range_sets, RangeSet};
use crate::journal::{Holder, Record, StoredLease};
use crate::pool::{describe, Pool};
use crate::store::State;
use crate::{Error, ErrorKind};

impl Store {
    /// Give `req.key` one address per range set, or return what it already holds.
    pub(crate) fn allocate(
        &mut self,
        req: &AllocateRequest,
    ) -> Result<(Vec<Allocation>, Option<Ticket>), Error> {
        req.key.validate()?;
        self.check_network(&req.key.network)?;
        let sets = canonicalize_range_sets(&req.range_sets)?;
        let key: Key = (req.key.container_id.clone(), req.key.ifname.clone());
        self.locked(|st| {
            if let Some(h) = st.state.holders.get(&key) {
                // The lease may come from a writer that died before its fsync (a daemon
                // killed mid-request): make it durable before acknowledging it again.
                let allocs = existing(h, &req.requested)?;
                return Ok((allocs, Some(st.sync.barrier())));
            }
            let chosen = choose(&st.state, st.boot_id(), &key, &sets, &req.requested)?;
            let holder = Holder {
                cid: key.0.clone(),
                ifname: key.1.clone(),
                boot: st.boot_id().to_string(),
                ts: now_unix(),
                leases: chosen,
            };
            let allocations = holder.leases.iter().map(to_allocation).collect();
            let ticket = st.append(Record::Alloc(holder))?;
            Ok((allocations, Some(ticket)))
        })
    }

    /// Free everything `(cid, ifname)` holds; nothing to do is not an error.
    pub(crate) fn release(&mut self, cid: &str, ifname: &str) -> Result<Option<Ticket>, Error> {
        let key: Key = (cid.to_string(), ifname.to_string());
        self.locked(|st| {
            if !st.state.holders.contains_key(&key) {
                // As in allocate: the release we observe may not be durable yet.
                return Ok(Some(st.sync.barrier()));
            }
            st.append(Record::Release { keys: vec![key] }).map(Some)
        })
    }

    /// The leases `(cid, ifname)` holds, in range-set order (empty if none).
    pub(crate) fn check(&mut self, cid: &str, ifname: &str) -> Result<Vec<Allocation>, Error> {
        let key: Key = (cid.to_string(), ifname.to_string());
        self.locked(|st| {
            Ok(st
                .state
                .holders
                .get(&key)
                .map(|h| existing(h, &[]).unwrap_or_default())
                .unwrap_or_default())
        })
    }

    /// Free the leases of every attachment not in `valid`; returns the number of addresses.
    pub(crate) fn gc(&mut self, valid: &[Attachment]) -> Result<(usize, Option<Ticket>), Error> {
        let valid: HashSet<Key> = valid
            .iter()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect();
        self.release_where(|key, _| !valid.contains(key))
    }

    /// Free leases made during another boot: their containers cannot exist any more.
    pub(crate) fn reclaim_previous_boots(&mut self) -> Result<(usize, Option<Ticket>), Error> {
        let boot = self.boot_id().to_string();
        if boot.is_empty() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "the current boot ID is unknown; not reclaiming anything",
            ));
        }
        self.release_where(|_, h| h.boot != boot)
    }

    fn release_where(
        &mut self,
        pred: impl Fn(&Key, &Holder) -> bool,
    ) -> Result<(usize, Option<Ticket>), Error> {
        self.locked(|st| {
            let mut keys = Vec::new();
            let mut freed = 0;
            for (k, h) in &st.state.holders {
                if pred(k, h) {
                    keys.push(k.clone());
                    freed += h.leases.len();
                }
            }
            if keys.is_empty() {
                return Ok((0, None));
            }
            let ticket = st.append(Record::Release { keys })?;
            Ok((freed, Some(ticket)))
        })
    }

    /// Ok when an allocation could succeed now in every range set.
    pub(crate) fn status(&mut self, range_sets: &[RangeSet]) -> Result<(), Error> {
        let sets = canonicalize_range_sets(range_sets)?;
        self.locked(|st| {
            for set in &sets {
                let pool = Pool::new(set);
                let used = in_use(&st.state, &pool);
                if used >= pool.capacity() {
                    return Err(exhausted(&st.state, st.boot_id(), set, &pool, used));
                }
            }
            Ok(())
        })
    }

    pub(crate) fn leases(&mut self) -> Result<Vec<LeaseInfo>, Error> {
        self.locked(|st| Ok(lease_infos(&st.network, &st.state)))
    }

    fn check_network(&self, network: &str) -> Result<(), Error> {
        if network == self.network {
            Ok(())
        } else {
            Err(Error::internal(format!(
                "request for network {network} sent to the store of {}",
                self.network
            )))
        }
    }
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
    state: &State,
    boot: &str,
    key: &Key,
    sets: &[RangeSet],
    requested: &[IpAddr],
) -> Result<Vec<StoredLease>, Error> {
    let pools: Vec<Pool<'_>> = sets.iter().map(Pool::new).collect();
    let mut wanted: Vec<Option<IpAddr>> = vec![None; sets.len()];
    for &ip in requested {
        let Some(i) = pools.iter().position(|p| p.in_bounds(ip)) else {
            let all: Vec<String> = sets.iter().map(|s| describe(s)).collect();
            return Err(conflict(format!(
                "requested address {ip} is not in any range set ({})",
                all.join("; ")
            )));
        };
        if pools[i].range_for(ip).is_none() {
            let what = if pools[i].is_gateway(ip) {
                "the gateway"
            } else {
                "a network or broadcast address"
            };
            return Err(conflict(format!(
                "requested address {ip} is {what} of {}",
                describe(&sets[i])
            )));
        }
        if let Some(prev) = wanted[i] {
            return Err(conflict(format!(
                "requested addresses {prev} and {ip} are both in range set {}: at most one address per range set",
                describe(&sets[i])
            )));
        }
        if let Some(holder) = state.by_addr.get(&ip) {
            if holder != key {
                return Err(conflict(format!(
                    "requested address {ip} is held by container {}/{}",
                    holder.0, holder.1
                )));
            }
        }
        wanted[i] = Some(ip);
    }

    let mut out = Vec::with_capacity(sets.len());
    for (i, (set, pool)) in sets.iter().zip(&pools).enumerate() {
        let rs = u32::try_from(i).map_err(|_| Error::invalid("too many range sets"))?;
        let (ip, range_idx) = match wanted[i] {
            Some(ip) => (ip, pool.range_for(ip).unwrap_or(0)),
            None => {
                let used = in_use(state, pool);
                if used >= pool.capacity() {
                    return Err(exhausted(state, boot, set, pool, used));
                }
                let last = state.last.get(&rs).copied();
                pool.next_free(last, |a| state.by_addr.contains_key(&a))
                    .ok_or_else(|| exhausted(state, boot, set, pool, used))?
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

fn conflict(msg: String) -> Error {
    Error::new(ErrorKind::Conflict, msg)
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
            "; {stale} of them were leased before the last reboot: start the ipamd daemon (it reclaims them) or let the runtime run CNI GC"
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
