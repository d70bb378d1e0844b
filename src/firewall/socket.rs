//! Which netfilter socket a firewall call uses. The socket itself (framing,
//! batches, acks, errors) is `netlink::Socket<Netfilter>`; this file only
//! decides how long one lives.
//!
//! Sockets are kept open for as long as their owner lives (a plugin call's
//! backend, the daemon's firewall service), one set per network namespace.
//! Why: closing one makes the kernel take the nftables commit mutex and wait
//! until whatever any recent batch deleted is freed (an RCU grace period,
//! ≈10 ms here), which stalls every nftables user of the netns. A plugin
//! process therefore never closes one itself: its backend's sockets are made
//! with the call's `netlink::linger::DeferredClose`, which they go to when
//! dropped and which hands them to a detached child after the reply is
//! printed (see there); the daemon never closes one.
//!
//! A call takes an idle socket of its namespace (or opens one) for itself
//! and puts it back when done, so concurrent calls (the daemon's threads) do
//! not wait for each other here; transactions still take turns on the lock
//! file (`store.rs`).

use super::Result;
use crate::netlink::linger::DeferredClose;
use crate::netlink::{NetNs, Netfilter, Socket};
use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) use crate::netlink::Failure;

pub(crate) type Nfnl = Socket<Netfilter>;

/// The netfilter sockets of one owner: idle ones with the id of the
/// namespace they talk to. The default closes them when dropped.
#[derive(Default)]
pub struct Sockets {
    idle: Mutex<Vec<(u64, Nfnl)>>,
    /// A plugin call's, which takes them when these are dropped instead.
    close_after_reply: Option<DeferredClose>,
}

impl std::fmt::Debug for Sockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sockets")
            .field("idle", &self.lock_idle().len())
            .field("closed_after_reply", &self.close_after_reply.is_some())
            .finish()
    }
}

/// A plugin call's sockets outlive its reply (`netlink::linger`); elsewhere
/// (the daemon at shutdown, admin commands) they close here.
impl Drop for Sockets {
    fn drop(&mut self) {
        let idle = self.idle.get_mut().unwrap_or_else(PoisonError::into_inner);
        for (_, nl) in idle.drain(..) {
            match &self.close_after_reply {
                Some(deferred) => deferred.defer(nl.into_fd()),
                None => drop(nl),
            }
        }
    }
}

impl Sockets {
    /// Sockets of a plugin call: when dropped they go to `deferred`, which
    /// closes them after the call's reply is written.
    pub fn closed_after_reply(deferred: DeferredClose) -> Sockets {
        Sockets {
            idle: Mutex::default(),
            close_after_reply: Some(deferred),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: a plugin call's sockets are not closed when dropped but go to
    /// its `DeferredClose`, for the hand-off after the reply.
    #[test]
    fn a_plugin_calls_sockets_go_to_its_deferred_close_when_dropped() {
        let deferred = DeferredClose::new();
        let sockets = Sockets::closed_after_reply(deferred.clone());
        sockets.with(|_| Ok(())).expect("a netfilter socket");
        assert_eq!(deferred.deferred(), 0, "deferred while still in use");
        drop(sockets);
        assert_eq!(deferred.deferred(), 1);
    }
}
