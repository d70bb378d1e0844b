//! The reference `host-local` IPAM plugin's lease store, in its own on-disk format (see
//! `dir.rs`), so that a node can switch between the reference plugin and cnikit's either
//! way and keep every lease. Ranges, defaults and the round robin are the ones `config`
//! and `pool` already implement for ipamd.
//!
//! Every operation holds the directory's flock from the first read to the last write, and
//! nothing is acknowledged before it is on disk: lease files are fsynced before the
//! directory is, and an ADD that fails part-way removes the files it created.

mod choose;
mod dir;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::api::Allocation;
use crate::attachment::Attachment;
use crate::config::{canonicalize_range_sets, RangeSet};
use crate::pool::{describe, Pool};
use crate::{Error, ErrorKind};
use dir::{Dir, Locked, Owner};

/// The reference's default `dataDir`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// How long an operation waits for another process's lock before giving up.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// host-local's store for the networks under one `dataDir`.
#[derive(Debug, Clone)]
pub struct HostLocal {
    data_dir: PathBuf,
    lock_timeout: Duration,
}

impl HostLocal {
    pub fn new(data_dir: impl Into<PathBuf>) -> HostLocal {
        HostLocal {
            data_dir: data_dir.into(),
            lock_timeout: LOCK_TIMEOUT,
        }
    }

    /// The same store with another lock wait (tests).
    pub fn with_lock_timeout(mut self, timeout: Duration) -> HostLocal {
        self.lock_timeout = timeout;
        self
    }

    /// The directory of `network`'s leases.
    pub fn network_dir(&self, network: &str) -> PathBuf {
        self.data_dir.join(network)
    }

    /// One address per range set for `key` (requested ones where given); what `key`
    /// already holds in a set is returned again.
    pub fn allocate(
        &self,
        key: &Attachment,
        range_sets: &[RangeSet],
        requested: &[IpAddr],
    ) -> Result<Vec<Allocation>, Error> {
        key.validate()?;
        let sets = canonicalize_range_sets(range_sets)?;
        let dir = self.open(&key.network, true)?.ok_or_else(|| {
            Error::internal(format!("the directory of network {} vanished", key.network))
        })?;
        let locked = dir.lock(self.lock_timeout)?;
        let owner = Owner::attachment(&key.container_id, &key.ifname);
        let leases = locked.scan()?;
        let picks = choose::choose(&sets, &leases, &owner, requested, |i| {
            locked.last_reserved(i)
        })?;
        write_new(&locked, &owner, &picks)?;
        picks
            .iter()
            .zip(&sets)
            .map(|(p, set)| {
                let range = Pool::new(set)
                    .range(p.range)
                    .ok_or_else(|| Error::internal("range index out of bounds"))?;
                let address = IpNet::new(p.addr, range.subnet.prefix_len())
                    .map_err(|e| Error::internal(format!("prefix of {}: {e}", p.addr)))?;
                Ok(Allocation {
                    address,
                    gateway: range.gateway,
                })
            })
            .collect()
    }

    /// Free what `key` holds: its `ID\r\nIFNAME` leases, or, when it has none, leases
    /// holding only its container ID (written by host-local before 0.7), as the reference
    /// does. Returns how many were freed; an unknown network frees nothing and creates
    /// nothing.
    pub fn release(&self, key: &Attachment) -> Result<usize, Error> {
        let Some(dir) = self.open(&key.network, false)? else {
            return Ok(0);
        };
        let locked = dir.lock(self.lock_timeout)?;
        let leases = locked.scan()?;
        let mut mine: Vec<IpAddr> = leases
            .iter()
            .filter(|(_, o)| o.is_attachment(&key.container_id, &key.ifname))
            .map(|(a, _)| *a)
            .collect();
        if mine.is_empty() {
            mine = leases
                .iter()
                .filter(|(_, o)| o.is_container_only(&key.container_id))
                .map(|(a, _)| *a)
                .collect();
        }
        remove_all(&locked, &mine)?;
        Ok(mine.len())
    }

    /// The addresses `key` holds (falling back to ID-only leases, like `release`).
    pub fn held(&self, key: &Attachment) -> Result<Vec<IpAddr>, Error> {
        let Some(dir) = self.open(&key.network, false)? else {
            return Ok(Vec::new());
        };
        let locked = dir.lock(self.lock_timeout)?;
        let leases = locked.scan()?;
        let exact: Vec<IpAddr> = leases
            .iter()
            .filter(|(_, o)| o.is_attachment(&key.container_id, &key.ifname))
            .map(|(a, _)| *a)
            .collect();
        if !exact.is_empty() {
            return Ok(exact);
        }
        Ok(leases
            .iter()
            .filter(|(_, o)| o.is_container_only(&key.container_id))
            .map(|(a, _)| *a)
            .collect())
    }

    /// Free every lease of `network` not held by one of `valid` (CNI GC). An ID-only lease
    /// stays while any valid attachment has that container ID; files that are not regular
    /// files are left alone. Returns how many were freed.
    pub fn gc(&self, network: &str, valid: &[Attachment]) -> Result<usize, Error> {
        let Some(dir) = self.open(network, false)? else {
            return Ok(0);
        };
        let locked = dir.lock(self.lock_timeout)?;
        let leases = locked.scan()?;
        let stale: Vec<IpAddr> = leases
            .iter()
            .filter(|(_, o)| match o {
                Owner::Foreign => false,
                Owner::Unreadable => true,
                Owner::Attachment { .. } => !valid
                    .iter()
                    .any(|v| o.is_attachment(&v.container_id, &v.ifname)),
                Owner::Container(_) => !valid.iter().any(|v| o.is_container_only(&v.container_id)),
            })
            .map(|(a, _)| *a)
            .collect();
        remove_all(&locked, &stale)?;
        Ok(stale.len())
    }

    /// Whether an ADD could get an address from every set now: `Exhausted` naming the first
    /// full set otherwise.
    pub fn status(&self, network: &str, range_sets: &[RangeSet]) -> Result<(), Error> {
        let sets = canonicalize_range_sets(range_sets)?;
        let leases = match self.open(network, false)? {
            Some(dir) => dir.lock(self.lock_timeout)?.scan()?,
            None => Default::default(),
        };
        for set in &sets {
            let pool = Pool::new(set);
            let used = choose::in_set(&pool, &leases);
            if used >= pool.capacity() {
                return Err(Error::new(
                    ErrorKind::Exhausted,
                    format!(
                        "no IP addresses available in range set {} ({used} in use)",
                        describe(set)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn open(&self, network: &str, create: bool) -> Result<Option<Dir>, Error> {
        Dir::open(&self.data_dir, network, create)
    }
}

/// Create the lease files of the new picks, then the round-robin hints, then make the
/// directory durable; on any failure remove what this call created.
fn write_new(locked: &Locked<'_>, owner: &Owner, picks: &[choose::Pick]) -> Result<(), Error> {
    let mut created: Vec<IpAddr> = Vec::new();
    let result = (|| {
        for p in picks.iter().filter(|p| p.new) {
            if !locked.reserve(p.addr, owner)? {
                // Only a writer that does not take the lock can get here first.
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "{} appeared while it was being allocated: another process writes to {} without taking its lock",
                        p.addr,
                        locked.path().display()
                    ),
                ));
            }
            created.push(p.addr);
        }
        for (i, p) in picks.iter().enumerate().filter(|(_, p)| p.new) {
            locked.set_last_reserved(i, p.addr)?;
        }
        // Repeated ADDs sync too: the leases they return may come from an ADD that
        // crashed before its own sync.
        locked.sync()
    })();
    if let Err(e) = result {
        let undo = created
            .iter()
            .try_for_each(|a| locked.remove(*a))
            .and_then(|()| locked.sync());
        return Err(match undo {
            Ok(()) => e,
            Err(u) => Error::new(e.kind(), format!("{e}; undoing it failed too: {u}")),
        });
    }
    Ok(())
}

fn remove_all(locked: &Locked<'_>, addrs: &[IpAddr]) -> Result<(), Error> {
    if addrs.is_empty() {
        return Ok(());
    }
    for a in addrs {
        locked.remove(*a)?;
    }
    locked.sync()
}
