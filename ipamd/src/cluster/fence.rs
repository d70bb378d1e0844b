//! The node's standing with etcd: whether it may hand out new addresses from its blocks.
//!
//! Another daemon may reclaim this node's blocks once its session has been gone for the
//! pool's `reclaimAfter`. The session cannot be gone before its lease's TTL has passed since
//! the last renewal etcd granted, and etcd counts that TTL from no earlier than the moment
//! the renewal was sent. So the node stops allocating new addresses a little before TTL
//! after its last successful renewal was sent, and after a new session (the old one
//! expired) it allocates again only once it has confirmed, block by block, that etcd
//! still records each as its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The standing of this node's session.
#[derive(Debug)]
pub(crate) struct Standing {
    ttl: Duration,
    /// When the last renewal (or grant) that etcd answered was sent.
    renewed: Mutex<Option<Instant>>,
    /// False from the moment a session is found expired until every block was confirmed.
    confirmed: AtomicBool,
}

impl Standing {
    pub(crate) fn new(ttl: Duration) -> Standing {
        Standing {
            ttl,
            renewed: Mutex::new(None),
            confirmed: AtomicBool::new(true),
        }
    }

    /// A renewal sent at `sent` was answered: the lease lives until at least `sent` + TTL.
    pub(crate) fn renewed(&self, sent: Instant) {
        let mut r = self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none_or(|old| old < sent) {
            *r = Some(sent);
        }
    }

    /// The session expired: every block is in doubt until confirmed.
    pub(crate) fn expired(&self) {
        self.confirmed.store(false, Ordering::SeqCst);
    }

    /// Every block was checked against etcd under the current session.
    pub(crate) fn confirmed(&self) {
        self.confirmed.store(true, Ordering::SeqCst);
    }

    /// Whether a new session waits for its blocks to be confirmed.
    pub(crate) fn awaits_confirmation(&self) -> bool {
        !self.confirmed.load(Ordering::SeqCst)
    }

    /// How long before the TTL runs out the node stops: the node's clock and etcd's may
    /// run at slightly different rates, and a stop a second early costs nothing.
    fn margin(&self) -> Duration {
        (self.ttl / 10).min(Duration::from_secs(1))
    }

    /// None while the node may hand out new addresses; else why not. A node that never
    /// had a session owns no block yet, so there is nothing to fence.
    pub(crate) fn fenced(&self) -> Option<String> {
        if !self.confirmed.load(Ordering::SeqCst) {
            return Some(
                "its etcd session expired, and it has not yet confirmed with etcd that its blocks are still its own".into(),
            );
        }
        let last = (*self.renewed.lock().unwrap_or_else(|e| e.into_inner()))?;
        let quiet = last.elapsed();
        (quiet + self.margin() >= self.ttl).then(|| {
            format!(
                "it has not renewed its etcd session for {:.1} s (the session's TTL is {} s), so its blocks may have been reclaimed",
                quiet.as_secs_f64(),
                self.ttl.as_secs()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_once_the_session_could_have_expired() {
        let s = Standing::new(Duration::from_secs(2));
        assert!(s.fenced().is_none(), "no session yet: nothing owned");
        s.renewed(Instant::now());
        assert!(s.fenced().is_none());
        s.renewed(Instant::now() - Duration::from_millis(1850));
        assert!(
            s.fenced().is_none(),
            "an older renewal does not move it back"
        );
        let s = Standing::new(Duration::from_secs(2));
        s.renewed(Instant::now() - Duration::from_millis(1850));
        assert!(s.fenced().unwrap().contains("TTL is 2 s"));
    }

    #[test]
    fn a_new_session_allocates_only_once_confirmed() {
        let s = Standing::new(Duration::from_secs(30));
        s.renewed(Instant::now());
        s.expired();
        assert!(s.fenced().unwrap().contains("confirmed"));
        s.confirmed();
        assert!(s.fenced().is_none());
    }
}
