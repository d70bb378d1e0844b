//! Which netfilter socket a firewall call uses. The socket itself (framing,
//! batches, acks, errors) is `netlink::Socket<Netfilter>`; this file only
//! decides how long one lives.
//!
//! A process keeps its netfilter sockets open until it exits, one set per
//! network namespace. Why: closing one makes the kernel take the nftables
//! commit mutex and wait until whatever any recent batch deleted is freed (an
//! RCU grace period, ≈10 ms here), which stalls every nftables user of the
//! netns. A plugin therefore closes at most one, at exit, after its work and
//! with no lock of ours held; the daemon never closes one.
//!
//! A call takes an idle socket of its namespace (or opens one) for itself
//! and puts it back when done, so concurrent calls (the daemon's threads) do
//! not wait for each other here; transactions still take turns on the lock
//! file (`store.rs`).

use super::Result;
use crate::netlink::{NetNs, Netfilter, Socket};
use std::sync::{Mutex, PoisonError};

pub(crate) use crate::netlink::Failure;

pub(crate) type Nfnl = Socket<Netfilter>;

/// Idle sockets with the id of the namespace they talk to.
static IDLE: Mutex<Vec<(u64, Nfnl)>> = Mutex::new(Vec::new());

/// Runs `f` with a socket of the calling thread's network namespace that no
/// one else uses meanwhile.
pub(crate) fn with_socket<T>(f: impl FnOnce(&mut Nfnl) -> Result<T>) -> Result<T> {
    let ns = NetNs::current_id()?;
    let idle = take_idle(ns);
    let mut nl = match idle {
        Some(nl) => nl,
        None => Nfnl::open()?,
    };
    let out = f(&mut nl);
    lock_idle().push((ns, nl));
    out
}

fn take_idle(ns: u64) -> Option<Nfnl> {
    let mut idle = lock_idle();
    let pos = idle.iter().position(|(id, _)| *id == ns)?;
    Some(idle.swap_remove(pos).1)
}

fn lock_idle() -> std::sync::MutexGuard<'static, Vec<(u64, Nfnl)>> {
    IDLE.lock().unwrap_or_else(PoisonError::into_inner)
}
