//! Which netfilter socket a firewall call uses. The socket itself (framing,
//! batches, acks, errors) is `netlink::Socket<Netfilter>`; this file only
//! decides how long one lives.
//!
//! Sockets are kept open for as long as their owner lives (a plugin call's
//! backend, the daemon's firewall service), one set per network namespace.
//! Why: closing one makes the kernel take the nftables commit mutex and wait
//! until whatever any recent batch deleted is freed (an RCU grace period,
//! ≈10 ms here), which stalls every nftables user of the netns. A plugin
//! process therefore never closes one itself: when its backend is dropped the
//! sockets go to `netlink::linger`, which hands them to a detached child after
//! the reply is printed (see there); the daemon never closes one.
//!
//! A call takes an idle socket of its namespace (or opens one) for itself
//! and puts it back when done, so concurrent calls (the daemon's threads) do
//! not wait for each other here; transactions still take turns on the lock
//! file (`store.rs`).

use super::Result;
use crate::netlink::{linger, NetNs, Netfilter, Socket};
use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) use crate::netlink::Failure;

pub(crate) type Nfnl = Socket<Netfilter>;

/// The netfilter sockets of one owner: idle ones with the id of the
/// namespace they talk to.
#[derive(Default)]
pub struct Sockets {
    idle: Mutex<Vec<(u64, Nfnl)>>,
}

impl std::fmt::Debug for Sockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sockets")
            .field("idle", &self.lock_idle().len())
            .finish()
    }
}

/// A plugin process's sockets outlive its reply (`netlink::linger`); elsewhere
/// (the daemon at shutdown, admin commands) they close here.
impl Drop for Sockets {
    fn drop(&mut self) {
        let idle = self.idle.get_mut().unwrap_or_else(PoisonError::into_inner);
        for (_, nl) in idle.drain(..) {
            linger::close_later(nl.into_fd());
        }
    }
}

impl Sockets {
    /// Runs `f` with a socket of the calling thread's network namespace that
    /// no one else uses meanwhile.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Nfnl) -> Result<T>) -> Result<T> {
        let ns = NetNs::current_id()?;
        let mut nl = match self.take_idle(ns) {
            Some(nl) => nl,
            None => Nfnl::open()?,
        };
        let out = f(&mut nl);
        self.lock_idle().push((ns, nl));
        out
    }

    fn take_idle(&self, ns: u64) -> Option<Nfnl> {
        let mut idle = self.lock_idle();
        let pos = idle.iter().position(|(id, _)| *id == ns)?;
        Some(idle.swap_remove(pos).1)
    }

    fn lock_idle(&self) -> MutexGuard<'_, Vec<(u64, Nfnl)>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
