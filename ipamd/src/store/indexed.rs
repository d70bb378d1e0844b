//! One in-process ADD, DEL or CHECK, reading only what it needs.
//!
//! A plugin process makes one call and exits, so it cannot keep the state in memory as the
//! daemon does; reading the whole snapshot every call made its cost grow with the leases.
//! Instead it reads the journal (bounded: the in-process path compacts it past
//! `compact_threshold` whatever the snapshot's size) into a state of its own, and asks the
//! snapshot's index (`crate::index`) about the rest: is this key held, is this address free.
//! The journal's records come after the snapshot, so they win: a key they allocate or
//! release is answered from them alone.
//!
//! Anything the index cannot answer with certainty sends the call to the whole snapshot, as
//! before: a missing, stale or damaged index (then a new one is written, so the next call
//! is cheap again; an old release's store gets its index this way), a full range set
//! (reclaiming and the message need every lease), and every other operation.

use std::cell::RefCell;
use std::collections::HashSet;
use std::net::IpAddr;

use super::state::Key;
use super::{answer_empty, open_journal, Batch, Loaded, Op, Reply, State, Store, StoreOptions};
use crate::index::{key_hash, Index};
use crate::journal::{self, Holder, Record, HEADER_LEN};
use crate::log::Level;
use crate::{log_at, Error, ErrorKind};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

/// The snapshot as seen through its index, under the journal's records.
pub(crate) struct Base {
    index: Index,
    /// Keys the journal allocated or released since the snapshot: the snapshot's word on
    /// them is stale.
    touched: HashSet<Key>,
    touched_hashes: HashSet<u64>,
    /// Why a lookup failed, if one did: the call is then made again from the whole snapshot.
    failure: RefCell<Option<String>>,
}

impl Base {
    fn new(index: Index) -> Base {
        Base {
            index,
            touched: HashSet::new(),
            touched_hashes: HashSet::new(),
            failure: RefCell::new(None),
        }
    }

    /// Take note of the keys `rec` changes (before it is applied).
    pub(super) fn note(&mut self, rec: &Record) {
        let keys: Vec<Key> = match rec {
            Record::Alloc(h) => vec![(h.cid.clone(), h.ifname.clone())],
            Record::Release { keys } => keys.clone(),
        };
        for k in keys {
            self.touched_hashes.insert(key_hash(&k.0, &k.1));
            self.touched.insert(k);
        }
    }

    /// An index lookup's failure, remembered so that the call is made again without it.
    fn failed(&self, why: String) -> Error {
        let e = Error::new(
            ErrorKind::Io,
            format!("the snapshot's index cannot be used: {why}"),
        );
        *self.failure.borrow_mut() = Some(why);
        e
    }
}

/// The leases an operation decides on: the whole state, or the journal's over the index.
pub(crate) enum View<'a> {
    Full(&'a State),
    Indexed { delta: &'a State, base: &'a Base },
}

impl View<'_> {
    /// The whole state, when this view has it.
    pub(crate) fn full(&self) -> Option<&State> {
        match self {
            View::Full(s) => Some(s),
            View::Indexed { .. } => None,
        }
    }

    /// What `key` holds.
    pub(crate) fn holder(&self, key: &Key) -> Result<Option<Holder>, Error> {
        let (delta, base) = match self {
            View::Full(s) => return Ok(s.holders.get(key).cloned()),
            View::Indexed { delta, base } => (delta, base),
        };
        if let Some(h) = delta.holders.get(key) {
            return Ok(Some(h.clone()));
        }
        if base.touched.contains(key) {
            return Ok(None);
        }
        let found = base.index.holder(&key.0, &key.1);
        let mut h = match found {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(None),
            Err(why) => return Err(base.failed(why)),
        };
        // Only a hand-edited journal gives a held address to another key; replaying it
        // moves the address, and so does this.
        h.leases
            .retain(|l| delta.by_addr.get(&l.addr.addr()).is_none_or(|k| k == key));
        Ok(Some(h))
    }

    /// Who holds `ip`.
    pub(crate) fn holder_of(&self, ip: IpAddr) -> Result<Option<Key>, Error> {
        let (delta, base) = match self {
            View::Full(s) => return Ok(s.by_addr.get(&ip).cloned()),
            View::Indexed { delta, base } => (delta, base),
        };
        if let Some(k) = delta.by_addr.get(&ip) {
            return Ok(Some(k.clone()));
        }
        let held = base.index.addr(ip).and_then(|found| {
            found
                .map(|at| base.index.holder_at(at).map(|h| (h.cid, h.ifname)))
                .transpose()
        });
        match held {
            Ok(Some(key)) if !base.touched.contains(&key) => Ok(Some(key)),
            Ok(_) => Ok(None),
            Err(why) => Err(base.failed(why)),
        }
    }

    /// Whether `ip` is held by anyone; reads the holder only when the journal touched a key
    /// with its hash.
    pub(crate) fn is_used(&self, ip: IpAddr) -> Result<bool, Error> {
        let (delta, base) = match self {
            View::Full(s) => return Ok(s.by_addr.contains_key(&ip)),
            View::Indexed { delta, base } => (delta, base),
        };
        if delta.by_addr.contains_key(&ip) {
            return Ok(true);
        }
        match base.index.addr(ip) {
            Ok(None) => Ok(false),
            Ok(Some(at)) if !base.touched_hashes.contains(&at.hash) => Ok(true),
            Ok(Some(_)) => self.holder_of(ip).map(|k| k.is_some()),
            Err(why) => Err(base.failed(why)),
        }
    }

    /// The round-robin position of range set `rs`.
    pub(crate) fn last(&self, rs: u32) -> Option<IpAddr> {
        match self {
            View::Full(s) => s.last.get(&rs).copied(),
            View::Indexed { delta, base } => delta
                .last
                .get(&rs)
                .or_else(|| base.index.last.get(&rs))
                .copied(),
        }
    }

    /// At least the number of addresses held.
    pub(crate) fn lease_bound(&self) -> usize {
        match self {
            View::Full(s) => s.by_addr.len(),
            View::Indexed { delta, base } => delta.by_addr.len() + base.index.addr_count(),
        }
    }
}

impl Store {
    pub(crate) fn view(&self) -> View<'_> {
        match &self.base {
            Some(base) => View::Indexed {
                delta: &self.state,
                base,
            },
            None => View::Full(&self.state),
        }
    }

    /// Run an ADD, DEL or CHECK reading only the leases it needs (module comment), and
    /// wait for it to be durable. The handle reads everything again for its next operation.
    pub(crate) fn execute_indexed(&mut self, op: Op) -> Result<Reply, Error> {
        let mut durable = false;
        let res = self
            .locked_with(Store::load_indexed, |st| {
                let first = st.apply_op(&op);
                let failure = st.base.as_ref().and_then(|b| b.failure.borrow().clone());
                let redo = match &first {
                    Err(e) => {
                        st.base.is_some() && (e.kind() == ErrorKind::Exhausted || failure.is_some())
                    }
                    Ok(_) => false,
                };
                if !redo {
                    return first;
                }
                match failure {
                    Some(why) => st.load_and_reindex(&why)?,
                    // A full range set: reclaiming, and the message, need every lease.
                    None => st.load(None)?,
                }
                st.apply_op(&op)
            })
            .map(|(reply, needs_sync)| {
                durable = needs_sync;
                reply
            });
        let ticket = (res.is_ok() && durable).then(|| self.ticket()).flatten();
        let out = Batch::new(vec![res], ticket)
            .finish(|| &mut *self)
            .pop()
            .unwrap_or_else(|| Err(Error::internal("empty batch result")));
        if self.base.take().is_some() {
            self.loaded = None;
        }
        out
    }

    /// Bring the handle up to date through the index (module comment). Must hold the lock.
    fn load_indexed(&mut self) -> Result<(), Error> {
        if std::fs::symlink_metadata(self.dir.join("snapshot"))
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            // Never compacted: the journal, bounded, is everything.
            return self.load(None);
        }
        let index = match Index::open(&self.dir) {
            Ok(index) => index,
            Err(why) => return self.load_and_reindex(&why),
        };
        let path = self.journal_path();
        if std::fs::symlink_metadata(&path).is_err() {
            return self.load_and_reindex("there is no journal");
        }
        let file = open_journal(&path)?;
        let generation = journal::read_header(&file, &path)?;
        if generation != index.generation {
            // A compaction cut short, or files from elsewhere: the whole load sorts it out.
            return self.load_and_reindex(&format!(
                "it is of generation {}, the journal of {generation}",
                index.generation
            ));
        }
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), &e))?;
        let out = journal::read_from(&file, &path, HEADER_LEN)?;
        self.drop_torn_tail(&out)?;
        let mut base = Base::new(index);
        let mut delta = State::default();
        for rec in out.records {
            base.note(&rec);
            delta.apply(rec);
        }
        self.state = delta;
        self.base = Some(base);
        self.loaded = Some(Loaded {
            dev: meta.dev(),
            ino: meta.ino(),
            generation,
            len: out.end,
            // The in-process path compacts at the fixed threshold (see `append`).
            snapshot_len: 0,
            batch_start: out.end,
            file: Arc::new(file),
        });
        Ok(())
    }

    /// Read everything, then write the index the next call uses (or, for a snapshot that
    /// cannot be indexed as it is, compact). Must hold the lock.
    fn load_and_reindex(&mut self, why: &str) -> Result<(), Error> {
        log_at!(
            Level::Info,
            "network {}: reading the whole snapshot, its index cannot be used ({why}); writing a new one",
            self.network
        );
        self.load(None)?;
        match crate::snapshot::read_bytes(&self.dir.join("snapshot"))? {
            // No snapshot: nothing to index.
            None => Ok(()),
            Some(snap) if crate::index::write(&self.dir, &snap, &self.network) => Ok(()),
            // A version 1 snapshot, or a hand-edited one: rewritten as compaction writes it.
            Some(_) => self.compact().map_err(|e| self.failed_rewrite(e)),
        }
    }
}

/// Run one operation in this process (the plugin's fallback, the daemon's start-up): an
/// allocation opens or creates the network's store; anything else on a network with no
/// store is answered as for an empty one, creating nothing. ADD, DEL and CHECK go through
/// the snapshot's index (module comment).
pub(crate) fn run_once(
    data_dir: &Path,
    network: &str,
    opts: StoreOptions,
    op: Op,
) -> Result<Reply, Error> {
    if matches!(op, Op::Allocate(_)) {
        return Store::open(data_dir, network, opts)?.execute_indexed(op);
    }
    let one_attachment = matches!(op, Op::Release { .. } | Op::Check { .. });
    match Store::open_existing(data_dir, network, opts.clone())? {
        Some(mut store) if one_attachment => store.execute_indexed(op),
        Some(mut store) => store.execute(op),
        None => answer_empty(&op, &opts.boot_id),
    }
}

#[cfg(test)]
mod tests;
