//! Group commit: a change is written to the journal under the network's lock, and its writer
//! then waits here until an fsync that started after the write has finished. Whoever finds no
//! fsync running starts one covering everything written so far; the others wait for it and
//! are covered by it (or by the next one), so concurrent requests share one fsync.

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::journal;
use crate::Error;

#[derive(Default)]
pub(crate) struct GroupSync {
    inner: Mutex<Inner>,
    cv: Condvar,
}

#[derive(Default)]
struct Inner {
    file: Option<(Arc<File>, PathBuf)>,
    /// Sequence number of the last write.
    written: u64,
    /// Every write up to this sequence number is durable.
    synced: u64,
    syncing: bool,
    /// The last failed fsync and the writes it was meant to cover.
    failure: Option<(u64, Error)>,
}

/// Proof of a write that must be made durable before its answer goes out.
#[must_use = "a change is not durable until its ticket is waited on"]
pub(crate) struct Ticket {
    sync: Arc<GroupSync>,
    seq: u64,
}

impl GroupSync {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves only counters behind, which stay valid.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Point at a new journal file. Everything written before is durable already: either we
    /// just compacted (the fsync'd snapshot holds it) or another process did, having read our
    /// records under the lock.
    pub(crate) fn set_file(&self, file: Arc<File>, path: PathBuf) {
        let mut g = self.lock();
        g.file = Some((file, path));
        g.synced = g.written;
    }

    /// Everything written so far is durable (e.g. a snapshot containing it was fsync'd).
    pub(crate) fn mark_all_synced(&self) {
        let mut g = self.lock();
        g.synced = g.written;
        self.cv.notify_all();
    }

    /// A ticket that is durable once everything in the journal up to now is: used when an
    /// answer rests on records another process wrote and may not have fsync'd yet.
    pub(crate) fn barrier(self: &Arc<Self>) -> Ticket {
        self.wrote()
    }

    /// Register a write just appended to the journal.
    pub(crate) fn wrote(self: &Arc<Self>) -> Ticket {
        let mut g = self.lock();
        g.written += 1;
        Ticket {
            sync: Arc::clone(self),
            seq: g.written,
        }
    }
}

impl Ticket {
    /// Block until this write is durable.
    pub(crate) fn wait(self) -> Result<(), Error> {
        let gs = &self.sync;
        let mut g = gs.lock();
        loop {
            if g.synced >= self.seq {
                return Ok(());
            }
            if let Some((upto, err)) = &g.failure {
                if *upto >= self.seq {
                    return Err(err.clone());
                }
            }
            if g.syncing {
                g = gs.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let Some((file, path)) = g.file.clone() else {
                return Err(Error::internal("journal write without an open journal"));
            };
            g.syncing = true;
            let upto = g.written;
            drop(g);
            let res = journal::fsync_file(&file, &path);
            g = gs.lock();
            g.syncing = false;
            match res {
                Ok(()) => g.synced = g.synced.max(upto),
                Err(e) => g.failure = Some((upto, e)),
            }
            gs.cv.notify_all();
        }
    }
}
