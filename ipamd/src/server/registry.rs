//! The daemon's open stores, one per network, each behind a mutex. Operations run on
//! blocking threads: the mutex serializes this process's writers for a network, the flock
//! inside the store serializes it with other processes, and the fsync is awaited after both
//! are released so that concurrent requests share it (group commit).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::api::{AllocateRequest, Allocation, Attachment, LeaseInfo, LeaseKey};
use crate::config::RangeSet;
use crate::store::{list_networks, usage, Store, StoreOptions, Ticket};
use crate::Error;

use super::metrics::{Metrics, NetworkUsage};

pub(crate) struct Slot {
    store: Mutex<Store>,
    /// Range sets of the latest request, to report free addresses in /metrics.
    range_sets: Mutex<Vec<RangeSet>>,
}

pub(crate) struct Registry {
    data_dir: PathBuf,
    opts: StoreOptions,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    pub(crate) metrics: Metrics,
    pub(crate) allowed_gid: Option<u32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking request leaves the store in a state the next refresh reconciles with the
    // files, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn durable<T>((value, ticket): (T, Option<Ticket>)) -> Result<T, Error> {
    if let Some(t) = ticket {
        t.wait()?;
    }
    Ok(value)
}

impl Registry {
    pub(crate) fn new(data_dir: PathBuf, opts: StoreOptions, allowed_gid: Option<u32>) -> Registry {
        Registry {
            data_dir,
            opts,
            slots: Mutex::new(HashMap::new()),
            metrics: Metrics::default(),
            allowed_gid,
        }
    }

    pub(crate) fn slot(&self, network: &str) -> Result<Arc<Slot>, Error> {
        let mut slots = lock(&self.slots);
        if let Some(s) = slots.get(network) {
            return Ok(Arc::clone(s));
        }
        let store = Store::open(&self.data_dir, network, self.opts.clone())?;
        let slot = Arc::new(Slot {
            store: Mutex::new(store),
            range_sets: Mutex::new(Vec::new()),
        });
        slots.insert(network.to_string(), Arc::clone(&slot));
        Ok(slot)
    }

    pub(crate) fn allocate(&self, req: &AllocateRequest) -> Result<Vec<Allocation>, Error> {
        req.key.validate()?;
        let slot = self.slot(&req.key.network)?;
        *lock(&slot.range_sets) = req.range_sets.clone();
        let res = lock(&slot.store).allocate(req)?;
        durable(res)
    }

    pub(crate) fn release(&self, key: &LeaseKey) -> Result<(), Error> {
        key.validate()?;
        let slot = self.slot(&key.network)?;
        let ticket = lock(&slot.store).release(&key.container_id, &key.ifname)?;
        durable(((), ticket))
    }

    pub(crate) fn check(&self, key: &LeaseKey) -> Result<Vec<Allocation>, Error> {
        key.validate()?;
        let slot = self.slot(&key.network)?;
        let res = lock(&slot.store).check(&key.container_id, &key.ifname);
        res
    }

    pub(crate) fn gc(&self, network: &str, valid: &[Attachment]) -> Result<usize, Error> {
        let slot = self.slot(network)?;
        let res = lock(&slot.store).gc(valid)?;
        durable(res)
    }

    pub(crate) fn status(&self, network: &str, range_sets: &[RangeSet]) -> Result<(), Error> {
        let slot = self.slot(network)?;
        *lock(&slot.range_sets) = range_sets.to_vec();
        let res = lock(&slot.store).status(range_sets);
        res
    }

    pub(crate) fn leases(&self, network: Option<&str>) -> Result<Vec<LeaseInfo>, Error> {
        let names = match network {
            Some(n) => vec![n.to_string()],
            None => list_networks(&self.data_dir)?,
        };
        let mut out = Vec::new();
        for n in names {
            let slot = self.slot(&n)?;
            let leases = lock(&slot.store).leases()?;
            out.extend(leases);
        }
        Ok(out)
    }

    /// Free leases of previous boots in every network on disk; returns the total freed.
    pub(crate) fn reclaim_previous_boots(&self) -> Result<usize, Error> {
        let mut total = 0;
        for n in list_networks(&self.data_dir)? {
            let slot = self.slot(&n)?;
            let res = lock(&slot.store).reclaim_previous_boots()?;
            let freed = durable(res)?;
            if freed > 0 {
                crate::log_at!(
                    crate::log::Level::Info,
                    "network {n}: reclaimed {freed} address(es) leased before the last reboot"
                );
            }
            total += freed;
        }
        Ok(total)
    }

    pub(crate) fn usage(&self) -> Vec<NetworkUsage> {
        let slots: Vec<(String, Arc<Slot>)> = lock(&self.slots)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let mut out: Vec<NetworkUsage> = slots
            .into_iter()
            .map(|(network, slot)| {
                let sets = lock(&slot.range_sets).clone();
                let store = lock(&slot.store);
                let in_use = store.state().by_addr.len() as u128;
                let free = (!sets.is_empty()).then(|| usage(store.state(), &sets).1);
                NetworkUsage {
                    network,
                    in_use,
                    free,
                }
            })
            .collect();
        out.sort_by(|a, b| a.network.cmp(&b.network));
        out
    }
}
