//! The daemon's open connections, so that a new client is served at once even when every
//! connection slot is taken: the one idle the longest is closed to make room. Idle means no
//! request in service (waiting for a first request, between keep-alive requests, or part
//! way through sending a head). One that never had a request served is dropped at once;
//! others are shut down gracefully, so a response already on its way is still written,
//! and dropped if that takes longer than a moment.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// One connection, shared by its task, its request handler and the table.
pub(super) struct Conn {
    /// Requests being served now.
    busy: AtomicUsize,
    /// Whether a request was ever served: one that never was has no answer to lose.
    used: AtomicBool,
    last_active: Mutex<Instant>,
    closing: AtomicBool,
    /// Tells the connection's task to shut the connection down gracefully.
    pub(super) close: Notify,
}

/// Marks a request in service for as long as it lives (also when its future is dropped).
pub(super) struct Busy(Arc<Conn>);

impl Conn {
    pub(super) fn busy(self: &Arc<Conn>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        self.used.store(true, Ordering::SeqCst);
        Busy(Arc::clone(self))
    }

    pub(super) fn never_used(&self) -> bool {
        !self.used.load(Ordering::SeqCst)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.last_active.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
pub(super) struct Conns {
    table: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
}

impl Conns {
    pub(super) fn register(&self) -> (u64, Arc<Conn>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            busy: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            last_active: Mutex::new(Instant::now()),
            closing: AtomicBool::new(false),
            close: Notify::new(),
        });
        self.lock().insert(id, Arc::clone(&conn));
        (id, conn)
    }

    pub(super) fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Ask the connection idle the longest to close; false when every one is busy.
    pub(super) fn close_longest_idle(&self) -> bool {
        let table = self.lock();
        let victim = table
            .values()
            .filter(|c| c.busy.load(Ordering::SeqCst) == 0 && !c.closing.load(Ordering::SeqCst))
            .min_by_key(|c| *c.last_active.lock().unwrap_or_else(|e| e.into_inner()));
        match victim {
            Some(c) => {
                c.closing.store(true, Ordering::SeqCst);
                // Kept until the task waits for it, if it is not waiting yet.
                c.close.notify_one();
                true
            }
            None => false,
        }
    }

    /// Shutdown: every connection finishes what it is serving and closes.
    pub(super) fn close_all(&self) {
        for c in self.lock().values() {
            c.closing.store(true, Ordering::SeqCst);
            c.close.notify_one();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}
