//! Making a batch durable, and what the store believes when that fails.
//!
//! A batch's records are appended under the lock and fsync'd after it (one fsync for the
//! whole batch); no answer goes out before that fsync returns.
//!
//! When the fsync fails (EIO), the kernel may already have dropped the dirty pages: the
//! appended frames may be on disk, partly, or not at all, while the page cache still shows
//! them, and a second fsync would report success without writing them (the error is
//! reported once). So after a failed fsync:
//! - no answer of the batch is acknowledged: every one becomes the error (CNI code 5);
//! - the store rolls its state back to what it had before the batch, and rewrites the
//!   network's files from that state (a fresh snapshot and an empty journal, each written
//!   to a new file and fsync'd): their contents then no longer depend on the pages whose
//!   write failed. Other writers' records are kept. So are records of the batch that a
//!   compaction during it already put in a snapshot: leases whose ADD got an error, freed
//!   by the DEL a runtime sends after a failed ADD, or by GC;
//! - until that rewrite has succeeded, the network refuses every request (code 5). A file
//!   `unsynced` in the network's directory records the failed batch, so that any process
//!   (the daemon, a plugin's in-process fallback, a restarted daemon) does the rewrite
//!   before it reads the journal, instead of reading frames that may not be on disk.
//!
//! The same applies when a failed append cannot be undone (the partial frame stays), and
//! when a compaction fails (its own fsyncs may be what failed).
//!
//! One case is not covered: another process that reads the failed batch's frames between
//! the failed fsync and the rewrite and answers from them alone (a repeated ADD of the same
//! attachment), with an fsync that no longer reports the error. The caller of the failed
//! batch gets its error only after the rewrite, so a retry of that request cannot do this.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::DerefMut;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Loaded, Reply, Store};
use crate::journal::{self, Damage, ReadOutcome, HEADER_LEN};
use crate::log::Level;
use crate::{files, log_at, Error, ErrorKind};

/// The file that says a batch's fsync failed and the files must be rewritten without it.
pub(crate) const UNSYNCED: &str = "unsynced";

/// Proof of appended records that must be made durable before their answers go out.
#[must_use = "a change is not durable until its ticket is waited on"]
pub(crate) struct Ticket {
    file: Arc<File>,
    path: PathBuf,
    /// The frames this batch appended (None when it appended nothing).
    span: Option<Span>,
}

/// Frames `[start, end)` of one journal file (device, inode and generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Span {
    pub dev: u64,
    pub ino: u64,
    pub generation: u64,
    pub start: u64,
    pub end: u64,
}

impl Span {
    pub(crate) fn is_in(&self, dev: u64, ino: u64, generation: u64) -> bool {
        (self.dev, self.ino, self.generation) == (dev, ino, generation)
    }
}

impl Loaded {
    /// Bytes `[start, end)` of this journal.
    pub(super) fn span(&self, start: u64, end: u64) -> Span {
        Span {
            dev: self.dev,
            ino: self.ino,
            generation: self.generation,
            start,
            end,
        }
    }
}

/// A rewrite the store owes before it may answer anything.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Recovery {
    /// Frames to leave out (None: leave out nothing, only rewrite).
    pub span: Option<Span>,
    /// What failed, for messages.
    pub cause: String,
}

impl Recovery {
    pub(crate) fn refusal(&self, network: &str) -> Error {
        Error::new(
            ErrorKind::Io,
            format!(
                "network {network}: a write to its journal failed ({}) and its files have not been rewritten since; refusing requests until they are (tried again on every request)",
                self.cause
            ),
        )
    }
}

/// Results of a batch run under one lock; answers are valid only after [`Batch::finish`].
pub(crate) struct Batch {
    results: Vec<Result<Reply, Error>>,
    ticket: Option<Ticket>,
}

impl Batch {
    pub(crate) fn new(results: Vec<Result<Reply, Error>>, ticket: Option<Ticket>) -> Batch {
        Batch { results, ticket }
    }

    /// fsync once for the whole batch, then hand out the answers. If the fsync fails, every
    /// answer becomes that error, after `store()` has rolled the batch back (module comment).
    pub(crate) fn finish<S: DerefMut<Target = Store>>(
        self,
        store: impl FnOnce() -> S,
    ) -> Vec<Result<Reply, Error>> {
        let Batch {
            mut results,
            ticket,
        } = self;
        let Some(t) = ticket else {
            return results;
        };
        // One call covers every record appended before it, whoever wrote them: that is
        // what lets the daemon acknowledge a whole batch with one fsync.
        if let Err(e) = journal::fsync_file(&t.file, &t.path) {
            let e = store().after_failed_sync(t.span, e);
            for r in results.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(e.clone());
            }
        }
        results
    }
}

impl Store {
    /// A ticket for everything in the journal so far.
    pub(crate) fn ticket(&self) -> Option<Ticket> {
        self.loaded.as_ref().map(|l| Ticket {
            file: Arc::clone(&l.file),
            path: self.journal_path(),
            span: (l.len > l.batch_start).then_some(l.span(l.batch_start, l.len)),
        })
    }

    /// The batch of `span` could not be made durable: roll it back (module comment).
    /// Returns the error its callers get.
    fn after_failed_sync(&mut self, span: Option<Span>, err: Error) -> Error {
        log_at!(
            Level::Error,
            "network {}: {err}; nothing of the batch is acknowledged, and the network's files are rewritten without it",
            self.network
        );
        self.owe_recovery(Recovery {
            span,
            cause: err.to_string(),
        });
        match self.locked(|_| Ok(())) {
            Ok(()) => Error::new(
                ErrorKind::Io,
                format!("{err}; the change was not made (the store's files were rewritten without it)"),
            ),
            Err(e) => Error::new(
                ErrorKind::Io,
                format!("{err}; the change is not acknowledged, and rewriting the store's files failed too: {e}"),
            ),
        }
    }

    /// A failed append left a partial frame that could not be cut off. Must hold the lock.
    pub(super) fn failed_undo(&mut self, err: Error, undo: &std::io::Error, span: Span) -> Error {
        let cause = format!("{err}, and cutting off the partial record failed: {undo}");
        log_at!(Level::Error, "network {}: {cause}", self.network);
        self.owe_recovery(Recovery {
            span: Some(span),
            cause: cause.clone(),
        });
        Error::new(ErrorKind::Io, cause)
    }

    /// The compaction after appending `frame` failed (the new snapshot may be in place, the
    /// journal not): its record is not acknowledged, and the files are rewritten without it
    /// before anything else (unless the new snapshot already holds it: then it stays, an
    /// unacknowledged lease that DEL or GC frees). Must hold the lock.
    pub(super) fn failed_compaction(&mut self, err: Error, frame: Span) -> Error {
        log_at!(
            Level::Error,
            "network {}: compaction failed: {err}",
            self.network
        );
        self.owe_recovery(Recovery {
            span: Some(frame),
            cause: format!("compaction: {err}"),
        });
        err
    }

    /// A compaction made before any record was appended failed (the new snapshot may be
    /// in place, the journal not): nothing is read or answered until the files are
    /// rewritten. Must hold the lock.
    pub(super) fn failed_rewrite(&mut self, err: Error) -> Error {
        log_at!(
            Level::Error,
            "network {}: rewriting its files failed: {err}",
            self.network
        );
        self.owe_recovery(Recovery {
            span: None,
            cause: format!("compaction: {err}"),
        });
        err
    }

    /// Remember the rewrite, here and in [`UNSYNCED`] for other processes. That file is not
    /// fsync'd (the disk is failing): other processes see it as long as this boot lasts,
    /// which is as long as the page cache may show frames that are not on disk.
    fn owe_recovery(&mut self, r: Recovery) {
        let path = self.dir.join(UNSYNCED);
        let written = serde_json::to_vec(&r)
            .map_err(|e| Error::internal(e.to_string()))
            .and_then(|bytes| {
                let _ = std::fs::remove_file(&path);
                let mut f = files::create_new(&path)?;
                f.write_all(&bytes)
                    .map_err(|e| Error::io(format!("writing {}", path.display()), &e))
            });
        if let Err(e) = written {
            log_at!(
                Level::Error,
                "cannot record the pending rewrite in {}: {e}",
                path.display()
            );
        }
        self.recovery = Some(r);
    }

    /// Do the rewrite owed by this handle, or recorded by another process. Must hold the lock.
    pub(super) fn recover_pending(&mut self) -> Result<(), Error> {
        if self.recovery.is_none() {
            self.recovery = read_marker(&self.dir)?;
        }
        let Some(r) = self.recovery.clone() else {
            return Ok(());
        };
        let res = self.load(r.span.as_ref()).and_then(|()| self.compact());
        if let Err(e) = res {
            // Nothing read under a pending rewrite is trusted.
            self.loaded = None;
            let refusal = r.refusal(&self.network);
            return Err(Error::new(
                ErrorKind::Io,
                format!("{refusal}; rewriting failed: {e}"),
            ));
        }
        self.recovery = None;
        remove_marker(&self.dir);
        log_at!(
            Level::Warn,
            "network {}: files rewritten after a failed write ({}); the failed batch is not in them",
            self.network,
            r.cause
        );
        Ok(())
    }
}

/// The pending rewrite recorded in `dir`, if any.
pub(crate) fn read_marker(dir: &Path) -> Result<Option<Recovery>, Error> {
    let path = dir.join(UNSYNCED);
    if std::fs::symlink_metadata(&path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    files::open_nofollow(OpenOptions::new().read(true), &path)?
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
    // A marker cut short by a crash still says a rewrite is owed; what to leave out is
    // then unknown, so nothing is.
    Ok(Some(serde_json::from_slice(&bytes).unwrap_or(Recovery {
        span: None,
        cause: format!("recorded in {} (unreadable)", path.display()),
    })))
}

pub(crate) fn remove_marker(dir: &Path) {
    let path = dir.join(UNSYNCED);
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            log_at!(Level::Error, "cannot remove {}: {e}", path.display());
        }
    }
}

/// Decode the journal without the frames of `span` (whose file it must be).
pub(super) fn read_skipping(file: &File, path: &Path, span: &Span) -> Result<ReadOutcome, Error> {
    let len = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), &e))?
        .len();
    let (start, end) = (span.start.min(len), span.end.min(len));
    let before = journal::read_range(file, path, HEADER_LEN, Some(start))?;
    let mut out = journal::decode(&before, HEADER_LEN)?;
    if out.torn_bytes > 0 {
        // The records before the batch were whole when the batch was appended: bad bytes
        // there are damage, never a tail to cut off.
        out.damage.get_or_insert(Damage {
            at: out.end,
            next_valid: start,
        });
        return Ok(out);
    }
    let after = journal::read_from(file, path, end)?;
    out.records.extend(after.records);
    out.end = after.end;
    out.torn_bytes = after.torn_bytes;
    out.damage = after.damage;
    Ok(out)
}
