//! The lease store of one network: `data_dir/<network>/{lock,journal,snapshot}`.
//!
//! Every operation (or batch of operations, in the daemon) takes an exclusive flock on
//! `lock`, brings the in-memory state up to date with the files (another process may have
//! appended or compacted since we last looked), decides, appends its records, and lets go of
//! the lock. The fsync is done after the lock is released (see `commit.rs`), so other writers
//! are not held up by it; nothing is acknowledged before it. What the store believes when
//! that fsync fails is in `commit.rs`; how damaged files are refused, in `integrity.rs`.

mod commit;
mod indexed;
mod integrity;
mod ops;
mod state;
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::attachment::check_network;
use crate::files;
use crate::journal::{self, Record, HEADER_LEN};
use crate::log::Level;
use crate::{log_at, Error, ErrorKind};

use crate::repair_hint::fsck_hint;
#[cfg(test)]
pub(crate) use commit::UNSYNCED;
pub(crate) use commit::{read_marker, remove_marker, Batch};
pub(crate) use indexed::run_once;
pub(crate) use ops::usage;
pub(crate) use ops::{answer_empty, unexpected, Op, Reply};
pub(crate) use state::State;

const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Tunables of a store; injectable so tests can fake a reboot or force compaction.
#[derive(Debug, Clone)]
pub(crate) struct StoreOptions {
    /// This boot's ID, recorded in every lease ("" if unknown: then nothing is reclaimed).
    pub boot_id: String,
    /// Compact when the journal grows past this many bytes, or past the snapshot's size if
    /// that is larger: replay at load then costs at most about as much as reading the
    /// snapshot, and compaction work stays proportional to the records it folds in.
    pub compact_threshold: u64,
    /// Give up waiting for another process's lock after this long.
    pub lock_timeout: Duration,
    /// When a range set is full and some of its leases were made under another
    /// boot, free those and retry instead of failing. Their network namespaces
    /// died with that boot, so nothing uses them; this is what keeps a machine
    /// with no daemon (nobody reclaims at start) from host-local's "no IP
    /// addresses available" after reboots. A daemon told not to reclaim
    /// (`--reclaim-previous-boot=false`) turns this off too.
    pub reclaim_when_full: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            boot_id: current_boot_id(),
            compact_threshold: 64 << 10,
            lock_timeout: Duration::from_secs(10),
            reclaim_when_full: true,
        }
    }
}

pub(crate) fn current_boot_id() -> String {
    match std::fs::read_to_string(BOOT_ID_PATH) {
        Ok(s) => s.trim().to_string(),
        Err(e) => {
            log_at!(
                Level::Warn,
                "cannot read {BOOT_ID_PATH}: {e}; leases get no boot ID"
            );
            String::new()
        }
    }
}

/// What we know about the journal file we have read.
struct Loaded {
    dev: u64,
    ino: u64,
    generation: u64,
    /// Offset just past the last record we applied (== the file length when in sync).
    len: u64,
    /// Size of the snapshot the journal continues.
    snapshot_len: u64,
    /// Where the records of the current batch start (all before are this handle's fsync'd
    /// records or other writers').
    batch_start: u64,
    file: Arc<File>,
}

pub(crate) struct Store {
    network: String,
    dir: PathBuf,
    lock_file: File,
    opts: StoreOptions,
    state: State,
    /// Set while `state` holds only the journal's records, the snapshot's leases being
    /// looked up through its index (one in-process call: `indexed.rs`).
    base: Option<indexed::Base>,
    loaded: Option<Loaded>,
    /// Set after a failed fsync or a failed undo of a partial write: nothing is read or
    /// answered until the files are rewritten (see `commit.rs`).
    recovery: Option<commit::Recovery>,
}

impl Store {
    /// The network this store holds the leases of.
    #[cfg(test)]
    pub(crate) fn network(&self) -> &str {
        &self.network
    }

    /// Open (creating if needed) the store of `network` under `data_dir`. Nothing is read
    /// until the first operation, which does it under the lock.
    pub(crate) fn open(data_dir: &Path, network: &str, opts: StoreOptions) -> Result<Store, Error> {
        check_network(network)?;
        files::create_dir(data_dir, files::DATA_DIR_MODE)?;
        files::check_owner(data_dir)?;
        let dir = data_dir.join(network);
        if files::create_dir(&dir, files::NETWORK_DIR_MODE)? {
            // The new directory entry must survive a crash together with the first record.
            journal::fsync_dir(data_dir)?;
        }
        Store::open_in(dir, network, opts)
    }

    /// Open the store of `network` if it exists; None (and nothing created) otherwise, so
    /// that reads of unknown networks leave no trace.
    pub(crate) fn open_existing(
        data_dir: &Path,
        network: &str,
        opts: StoreOptions,
    ) -> Result<Option<Store>, Error> {
        check_network(network)?;
        let dir = data_dir.join(network);
        match std::fs::symlink_metadata(&dir) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unavailable_io(format!("stat {}", dir.display()), &e)),
        }
        files::check_owner(data_dir)?;
        Store::open_in(dir, network, opts).map(Some)
    }

    fn open_in(dir: PathBuf, network: &str, opts: StoreOptions) -> Result<Store, Error> {
        files::check_owner(&dir)?;
        let lock_path = dir.join("lock");
        let lock_file = files::open_lock(&lock_path)?;
        Ok(Store {
            network: network.to_string(),
            dir,
            lock_file,
            opts,
            state: State::default(),
            base: None,
            loaded: None,
            recovery: None,
        })
    }

    pub(crate) fn boot_id(&self) -> &str {
        &self.opts.boot_id
    }

    /// The in-memory state as of the last operation (for metrics; may lag other processes).
    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    /// Run `f` under the exclusive lock with the state brought up to date first.
    pub(crate) fn locked<T>(
        &mut self,
        f: impl FnOnce(&mut Store) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.locked_with(Store::refresh, f)
    }

    /// Run `f` under the exclusive lock after `load` has brought the state up to date.
    fn locked_with<T>(
        &mut self,
        load: fn(&mut Store) -> Result<(), Error>,
        f: impl FnOnce(&mut Store) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.acquire()?;
        let res = self
            .recover_pending()
            .and_then(|()| load(self))
            .and_then(|()| {
                if let Some(l) = self.loaded.as_mut() {
                    l.batch_start = l.len;
                }
                f(self)
            });
        if let Err(e) = self.lock_file.unlock() {
            // Closing the file would release it too; this only happens on a broken fd.
            log_at!(Level::Error, "cannot unlock {}: {e}", self.dir.display());
        }
        res
    }

    /// Take the flock, polling so that a stuck holder (e.g. a stopped process) turns into a
    /// clear error instead of a hang.
    fn acquire(&self) -> Result<(), Error> {
        let deadline = Instant::now() + self.opts.lock_timeout;
        // Holders keep the lock for microseconds (the fsync happens after unlocking), so
        // poll finely at first.
        let mut pause = Duration::from_micros(20);
        loop {
            match self.lock_file.try_lock() {
                Ok(()) => return Ok(()),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(unavailable_io(
                        format!("locking {}", self.dir.join("lock").display()),
                        &e,
                    ))
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "timed out after {:?} waiting for the lock on {} (another process holds it)",
                        self.opts.lock_timeout,
                        self.dir.join("lock").display()
                    ),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn journal_path(&self) -> PathBuf {
        self.dir.join("journal")
    }

    /// Bring the state up to date with the files. Must hold the lock.
    fn refresh(&mut self) -> Result<(), Error> {
        let path = self.journal_path();
        // Not following a link: a journal replaced by one must fail to open below, not
        // compare equal to the file we read.
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(format!("stat {}", path.display()), &e)),
        };
        let (Some(meta), Some(l), None) = (meta, self.loaded.as_ref(), self.base.as_ref()) else {
            return self.full_load();
        };
        if (meta.dev(), meta.ino()) != (l.dev, l.ino) || meta.len() < l.len {
            // Replaced by another process's compaction (or shortened by hand): start over.
            return self.full_load();
        }
        if meta.len() == l.len {
            return Ok(());
        }
        let start = l.len;
        let out = journal::read_from(&l.file, &path, start)?;
        self.drop_torn_tail(&out)?;
        for rec in out.records {
            self.state.apply(rec);
        }
        if let Some(l) = self.loaded.as_mut() {
            l.len = out.end;
        }
        Ok(())
    }

    /// Load snapshot + journal from scratch.
    fn full_load(&mut self) -> Result<(), Error> {
        self.load(None)
    }

    /// Load snapshot + journal from scratch, leaving out the frames of `skip` (a batch
    /// whose fsync failed) if the journal is still the file it was appended to.
    fn load(&mut self, skip: Option<&commit::Span>) -> Result<(), Error> {
        let snap_path = self.dir.join("snapshot");
        let (snap, snapshot_len) = crate::snapshot::read(&snap_path)?;
        let snap_gen = snap.as_ref().map_or(0, |s| s.generation);
        let path = self.journal_path();
        if std::fs::symlink_metadata(&path).is_err() {
            journal::write_atomic(&self.dir, "journal", &journal::header(snap_gen))?;
        }
        let mut file = open_journal(&path)?;
        let mut generation = journal::read_header(&file, &path)?;
        if generation < snap_gen {
            // Crash between the snapshot's rename and the journal's: the journal's records
            // are all in the snapshot already.
            journal::write_atomic(&self.dir, "journal", &journal::header(snap_gen))?;
            file = open_journal(&path)?;
            generation = snap_gen;
        } else if generation > snap_gen {
            return Err(Error::internal(format!(
                "{} is generation {generation} but the snapshot is generation {snap_gen}: the snapshot is missing or stale, refusing to guess the leases; {}",
                path.display(),
                fsck_hint(&self.dir)
            )));
        }
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), &e))?;
        let out = match skip {
            Some(span) if span.is_in(meta.dev(), meta.ino(), generation) => {
                commit::read_skipping(&file, &path, span)?
            }
            Some(_) => {
                log_at!(
                    Level::Warn,
                    "{}: replaced since the write that failed (compacted by another writer): the records of that write stay, unacknowledged, until DEL or GC frees them",
                    path.display()
                );
                journal::read_from(&file, &path, HEADER_LEN)?
            }
            None => journal::read_from(&file, &path, HEADER_LEN)?,
        };
        self.drop_torn_tail(&out)?;
        let mut state = snap.map(State::from_snapshot).unwrap_or_default();
        for rec in out.records {
            state.apply(rec);
        }
        self.state = state;
        self.base = None;
        self.loaded = Some(Loaded {
            dev: meta.dev(),
            ino: meta.ino(),
            generation,
            len: out.end,
            snapshot_len,
            batch_start: out.end,
            file: Arc::new(file),
        });
        Ok(())
    }

    /// A torn tail is a record whose writer died mid-write, so it was never acknowledged;
    /// cut it off so that the next record is not appended after garbage. Bad bytes with a
    /// valid frame after them are damage instead: refused, and left as they are.
    fn drop_torn_tail(&self, out: &journal::ReadOutcome) -> Result<(), Error> {
        if let Some(damage) = &out.damage {
            return Err(self.damaged_journal(damage));
        }
        if out.torn_bytes == 0 {
            return Ok(());
        }
        let path = self.journal_path();
        log_at!(
            Level::Warn,
            "{}: dropping {} bytes of an incomplete record at offset {} (a writer crashed mid-write)",
            path.display(),
            out.torn_bytes,
            out.end
        );
        let f = files::open_nofollow(OpenOptions::new().write(true), &path)?;
        f.set_len(out.end)
            .map_err(|e| Error::io(format!("truncating {}", path.display()), &e))?;
        journal::fsync_file(&f, &path)
    }

    /// Append a record (the commit point of a change) and apply it. Must hold the lock;
    /// the change is durable only once a ticket taken afterwards has been waited on.
    pub(crate) fn append(&mut self, rec: Record) -> Result<(), Error> {
        if let Some(r) = &self.recovery {
            return Err(r.refusal(&self.network));
        }
        let bytes = journal::encode(&rec)?;
        let path = self.journal_path();
        let Some(l) = self.loaded.as_mut() else {
            return Err(Error::internal("append before load"));
        };
        if let Err(e) = journal::append(&l.file, &path, &bytes) {
            let e = Error::io(format!("appending to {}", path.display()), &e);
            // Leave no partial record behind for the next writer to append after.
            let undo = l.file.set_len(l.len);
            let span = l.span(l.len, u64::MAX);
            return Err(match undo {
                Ok(()) => e,
                Err(undo) => self.failed_undo(e, &undo, span),
            });
        }
        let frame = l.span(l.len, l.len + bytes.len() as u64);
        l.len = frame.end;
        // A call through the index has `snapshot_len` 0: it re-reads the journal every
        // time, so that stays bounded whatever the snapshot's size.
        let over = l.len > self.opts.compact_threshold.max(l.snapshot_len);
        if let Some(base) = self.base.as_mut() {
            base.note(&rec);
        }
        self.state.apply(rec);
        if over {
            // Compaction needs every lease: read them all (this record included) first.
            let full = match self.base {
                Some(_) => self.load(None),
                None => Ok(()),
            };
            if let Err(e) = full.and_then(|()| self.compact()) {
                // Its fsyncs may be what failed: the same doubt as after a failed fsync.
                return Err(self.failed_compaction(e, frame));
            }
        }
        Ok(())
    }

    /// Rewrite the state as a snapshot of the next generation and start an empty journal.
    /// Must hold the lock.
    pub(crate) fn compact(&mut self) -> Result<(), Error> {
        let Some(generation) = self.loaded.as_ref().map(|l| l.generation + 1) else {
            return Err(Error::internal("compact before load"));
        };
        if self.base.is_some() {
            return Err(Error::internal(
                "compact with only the journal's leases in memory",
            ));
        }
        let snap = crate::snapshot::encode(&self.state.to_snapshot(generation))?;
        journal::write_atomic(&self.dir, "snapshot", &snap)?;
        // Before the journal: once that is replaced, the in-process path looks for it. A
        // crash in between leaves the old one, which no longer matches and is rewritten.
        crate::index::write(&self.dir, &snap, &self.network);
        journal::write_atomic(&self.dir, "journal", &journal::header(generation))?;
        let path = self.journal_path();
        let file = open_journal(&path)?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), &e))?;
        self.loaded = Some(Loaded {
            dev: meta.dev(),
            ino: meta.ino(),
            generation,
            len: HEADER_LEN,
            snapshot_len: snap.len() as u64,
            // What came before is in the snapshot, durable already.
            batch_start: HEADER_LEN,
            file: Arc::new(file),
        });
        log_at!(
            Level::Info,
            "network {}: compacted to generation {generation}",
            self.network
        );
        Ok(())
    }
}

fn open_journal(path: &Path) -> Result<File, Error> {
    files::open_nofollow(OpenOptions::new().read(true).append(true), path)
}

/// The store cannot be used at all (no permission, read-only file system...).
pub(crate) fn unavailable_io(context: String, e: &std::io::Error) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{context}: {e}"))
}

/// Network names with a store under `data_dir` (directories with a valid name).
pub(crate) fn list_networks(data_dir: &Path) -> Result<Vec<String>, Error> {
    let rd = match std::fs::read_dir(data_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("listing {}", data_dir.display()), &e)),
    };
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let Ok(name) = ent.file_name().into_string() else {
            continue;
        };
        let journal = std::fs::symlink_metadata(ent.path().join("journal"));
        if check_network(&name).is_ok() && journal.is_ok_and(|m| m.is_file()) {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}
