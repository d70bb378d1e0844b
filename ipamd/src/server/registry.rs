//! The daemon's open stores, each served by its own writer thread while it is open.
//!
//! Requests for a network are queued to its writer; the writer takes everything queued,
//! runs it as one batch under one flock, fsyncs once, and answers them all. That is the
//! group commit: with N concurrent requests a network pays about one fsync per batch instead
//! of N, and no request is answered before its record is durable.
//!
//! Stores are opened on demand and closed again, so what the daemon holds does not grow with
//! the number of network names anyone asks about: a writer closes its store after
//! [`IDLE_CLOSE`] without requests, at most [`MAX_OPEN_STORES`] are open (the least recently
//! used idle one is closed to make room; when every open one is busy the request waits for
//! one to finish), and a request that needs no store (anything but an allocation, on a
//! network with nothing on disk) is answered as for an empty network without creating one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::config::{canonicalize_range_sets, RangeSet};
use crate::log::Level;
use crate::store::{answer_empty, list_networks, run_once, usage, Op, Reply, Store, StoreOptions};
use crate::{log_at, Error};

use super::metrics::{Metrics, NetworkUsage};

/// Most operations run in one batch (bounds the latency of the first one queued).
const MAX_BATCH: usize = 256;
/// Stores (two fds and one writer thread each) open at once.
pub(crate) const MAX_OPEN_STORES: usize = 64;
/// A writer closes its store after this long without requests.
const IDLE_CLOSE: Duration = Duration::from_secs(10);
/// How often a request waiting for a free store slot looks again (only when every one of
/// the [`MAX_OPEN_STORES`] stores is in the middle of a batch).
const FULL_RETRY: Duration = Duration::from_millis(2);

type Job = (Op, oneshot::Sender<Result<Reply, Error>>);

/// What a network's writer shares with the registry.
struct Shared {
    store: Mutex<Store>,
    /// Jobs queued and not yet answered; a store is closed only when this is 0, which the
    /// registry's lock makes exact (jobs are counted and queued under it).
    pending: AtomicUsize,
    /// Range sets of the latest valid request, to report free addresses in /metrics.
    range_sets: Mutex<Vec<RangeSet>>,
}

struct Slot {
    id: u64,
    queue: mpsc::Sender<Job>,
    shared: Arc<Shared>,
    last_used: Instant,
    writer: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Open {
    slots: HashMap<String, Slot>,
    next_id: u64,
    /// /metrics gauges of networks whose store was closed, as of closing.
    closed: BTreeMap<String, (u128, Option<u128>)>,
}

pub(crate) struct Registry {
    data_dir: PathBuf,
    /// (device, inode) of `data_dir`, to recognize it under any path.
    data_dir_id: Option<(u64, u64)>,
    opts: StoreOptions,
    open: Arc<Mutex<Open>>,
    pub(crate) metrics: Metrics,
    /// What plugin processes reported of their calls (`plugin_calls`).
    pub(crate) plugin_calls: super::plugin_calls::PluginCalls,
    pub(crate) allowed_gid: Option<u32>,
    /// This node's cluster-pool state, when the daemon runs with --etcd-endpoints.
    pub(crate) cluster: std::sync::OnceLock<Arc<crate::cluster::Node>>,
}

/// The outcome of one attempt to hand an op to a writer.
enum Submitted {
    Queued(oneshot::Receiver<Result<Reply, Error>>),
    Answered(Result<Reply, Error>),
    /// Every store slot is busy: try again shortly.
    Full(Op),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic mid-batch leaves a state the next refresh reconciles with the files, so a
    // poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The writer thread of one network; returns when its slot is closed.
fn writer(
    network: String,
    id: u64,
    shared: Arc<Shared>,
    queue: mpsc::Receiver<Job>,
    open: Weak<Mutex<Open>>,
) {
    loop {
        let first = match queue.recv_timeout(IDLE_CLOSE) {
            Ok(j) => j,
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => match open.upgrade() {
                Some(open) if !lock(&open).close(&network, id) => continue,
                _ => break,
            },
        };
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let n = jobs.len();
        let (ops, replies): (Vec<Op>, Vec<_>) = jobs.into_iter().unzip();
        // Only the batch itself holds the store; the fsync runs without it.
        let batch = lock(&shared.store).execute_batch(&ops);
        // The store is taken again only if the fsync fails, to roll the batch back.
        let results = batch.finish(|| lock(&shared.store));
        for (reply, result) in replies.into_iter().zip(results) {
            // The requester may have gone away (client hung up); nothing to do then.
            let _ = reply.send(result);
        }
        shared.pending.fetch_sub(n, Ordering::SeqCst);
    }
    log_at!(Level::Debug, "network {network}: store closed");
}

/// A directory's identity (device, inode), as clients send it.
fn dir_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Open {
    /// Close `network`'s store if it is still slot `id` and has nothing queued. Dropping
    /// the slot drops the queue's sender, which ends the writer.
    fn close(&mut self, network: &str, id: u64) -> bool {
        match self.slots.get(network) {
            Some(s) if s.id == id && s.shared.pending.load(Ordering::SeqCst) == 0 => {}
            _ => return false,
        }
        if let Some(slot) = self.slots.remove(network) {
            let gauges = slot.shared.gauges();
            self.closed.insert(network.to_string(), gauges);
        }
        true
    }

    /// Close the least recently used idle store; false when all are busy.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .slots
            .iter()
            .filter(|(_, s)| s.shared.pending.load(Ordering::SeqCst) == 0)
            .min_by_key(|(_, s)| s.last_used)
            .map(|(n, s)| (n.clone(), s.id));
        match victim {
            Some((network, id)) => self.close(&network, id),
            None => false,
        }
    }

    /// Count and queue `op` on `network`'s slot; `Full` when it has none.
    fn send(&mut self, network: &str, op: Op) -> Submitted {
        let Some(slot) = self.slots.get_mut(network) else {
            return Submitted::Full(op);
        };
        slot.last_used = Instant::now();
        match &op {
            Op::Allocate(r) => slot.shared.remember(&r.range_sets),
            Op::Status(s) => slot.shared.remember(s),
            _ => {}
        }
        let (tx, rx) = oneshot::channel();
        slot.shared.pending.fetch_add(1, Ordering::SeqCst);
        if slot.queue.send((op, tx)).is_err() {
            slot.shared.pending.fetch_sub(1, Ordering::SeqCst);
            let e = Error::internal(format!("the writer of network {network} is gone"));
            return Submitted::Answered(Err(e));
        }
        Submitted::Queued(rx)
    }
}

impl Shared {
    fn gauges(&self) -> (u128, Option<u128>) {
        let sets = lock(&self.range_sets).clone();
        let store = lock(&self.store);
        let in_use = store.state().by_addr.len() as u128;
        let free = (!sets.is_empty()).then(|| usage(store.state(), &sets).1);
        (in_use, free)
    }

    /// Keep the request's range sets for /metrics, only if valid (pool arithmetic relies
    /// on validated bounds).
    fn remember(&self, range_sets: &[RangeSet]) {
        if let Ok(sets) = canonicalize_range_sets(range_sets) {
            *lock(&self.range_sets) = sets;
        }
    }
}

impl Registry {
    pub(crate) fn new(data_dir: PathBuf, opts: StoreOptions, allowed_gid: Option<u32>) -> Registry {
        let data_dir_id = dir_id(&data_dir);
        Registry {
            data_dir,
            data_dir_id,
            opts,
            open: Arc::new(Mutex::new(Open::default())),
            metrics: Metrics::default(),
            plugin_calls: super::plugin_calls::PluginCalls::default(),
            allowed_gid,
            cluster: std::sync::OnceLock::new(),
        }
    }

    /// Hand `op` to `network`'s writer, opening its store first if need be.
    fn submit(&self, network: &str, op: Op) -> Submitted {
        let op = match lock(&self.open).send(network, op) {
            Submitted::Full(op) => op,
            done => return done,
        };
        // Opened outside the registry's lock: creating a network's directory fsyncs.
        let store = if matches!(op, Op::Allocate(_)) {
            Store::open(&self.data_dir, network, self.opts.clone()).map(Some)
        } else {
            Store::open_existing(&self.data_dir, network, self.opts.clone())
        };
        let store = match store {
            Ok(Some(s)) => s,
            Ok(None) => return Submitted::Answered(answer_empty(&op, &self.opts.boot_id)),
            Err(e) => return Submitted::Answered(Err(e)),
        };
        let mut open = lock(&self.open);
        if !open.slots.contains_key(network) {
            if open.slots.len() >= MAX_OPEN_STORES && !open.evict_one() {
                return Submitted::Full(op);
            }
            if let Err(e) = self.start_writer(&mut open, network, store) {
                return Submitted::Answered(Err(e));
            }
        }
        open.send(network, op)
    }

    fn start_writer(&self, open: &mut Open, network: &str, store: Store) -> Result<(), Error> {
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            pending: AtomicUsize::new(0),
            range_sets: Mutex::new(Vec::new()),
        });
        let id = open.next_id;
        open.next_id += 1;
        let (tx, rx) = mpsc::channel();
        let (name, sh, weak) = (
            network.to_string(),
            Arc::clone(&shared),
            Arc::downgrade(&self.open),
        );
        let handle = std::thread::Builder::new()
            .name(format!(
                "ipamd-{}",
                network.chars().take(9).collect::<String>()
            ))
            .spawn(move || writer(name, id, sh, rx, weak))
            .map_err(|e| Error::internal(format!("cannot start writer for {network}: {e}")))?;
        open.closed.remove(network);
        open.slots.insert(
            network.to_string(),
            Slot {
                id,
                queue: tx,
                shared,
                last_used: Instant::now(),
                writer: Some(handle),
            },
        );
        Ok(())
    }

    /// Refuse a client whose fallback store (its `ipam.dataDir`, from the
    /// [`DATA_DIR_HEADER`](crate::api::DATA_DIR_HEADER)) is not our data dir: serving it from
    /// ours would let the in-process fallback hand out the same addresses again from the
    /// other one. Requests without the header (curl, other tools) are not checked.
    pub(crate) fn check_data_dir(&self, header: Option<&[u8]>) -> Result<(), Error> {
        let Some(value) = header else {
            return Ok(());
        };
        let Some((id, path)) = crate::api::parse_data_dir_header(value) else {
            return Err(Error::invalid(format!(
                "malformed {} header",
                crate::api::DATA_DIR_HEADER
            )));
        };
        if self.data_dir_id.is_none() || id == self.data_dir_id {
            return Ok(());
        }
        // "none": the directory did not exist when the client looked, which is the
        // first request on a fresh node under socket activation (the client looks
        // before its connection starts us, and we create the directory). Look again.
        if id.is_none() && self.data_dir_id == dir_id(Path::new(&path)) {
            return Ok(());
        }
        let ours = self.data_dir.display();
        Err(Error::invalid(format!(
            "ipam.dataDir {path} is not the directory this ipamd daemon serves ({ours}); the daemon and the plugin's in-process fallback must use the same store: set ipam.dataDir to {ours} or start the daemon with --data-dir {path}"
        )))
    }

    /// Run `op` on `network` from async code.
    pub(crate) async fn call(&self, network: &str, mut op: Op) -> Result<Reply, Error> {
        loop {
            match self.submit(network, op) {
                Submitted::Answered(r) => return r,
                Submitted::Queued(rx) => {
                    return rx.await.unwrap_or_else(|_| {
                        Err(Error::internal("the network's writer dropped the request"))
                    })
                }
                Submitted::Full(again) => {
                    op = again;
                    tokio::time::sleep(FULL_RETRY).await;
                }
            }
        }
    }

    /// Networks with a store on disk, plus any opened since.
    pub(crate) fn networks(&self) -> Result<Vec<String>, Error> {
        let mut names = list_networks(&self.data_dir)?;
        names.extend(lock(&self.open).slots.keys().cloned());
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Free leases of previous boots in every network on disk; returns the total freed.
    /// A network whose store cannot be used is logged and skipped: one broken network must
    /// not keep the daemon from serving the others.
    pub(crate) fn reclaim_previous_boots(&self) -> Result<usize, Error> {
        if self.opts.boot_id.is_empty() {
            log_at!(
                Level::Warn,
                "boot ID unknown: not reclaiming leases of previous boots"
            );
            return Ok(0);
        }
        let mut total = 0;
        // One store at a time, closed again: start-up holds no more than one request does.
        for n in list_networks(&self.data_dir)? {
            match run_once(&self.data_dir, &n, self.opts.clone(), Op::Reclaim) {
                Ok(Reply::Freed(0)) => {}
                Ok(Reply::Freed(freed)) => {
                    log_at!(
                        Level::Info,
                        "network {n}: reclaimed {freed} address(es) leased before the last reboot"
                    );
                    total += freed;
                }
                Ok(other) => log_at!(Level::Error, "network {n}: unexpected reply {other:?}"),
                Err(e) => log_at!(
                    Level::Error,
                    "network {n}: cannot reclaim leases of previous boots: {e}"
                ),
            }
        }
        Ok(total)
    }

    pub(crate) fn usage(&self) -> Vec<NetworkUsage> {
        let (open, mut gauges) = {
            let o = lock(&self.open);
            let open: Vec<(String, Arc<Shared>)> = o
                .slots
                .iter()
                .map(|(k, v)| (k.clone(), Arc::clone(&v.shared)))
                .collect();
            (open, o.closed.clone())
        };
        for (network, shared) in open {
            gauges.insert(network, shared.gauges());
        }
        gauges
            .into_iter()
            .map(|(network, (in_use, free))| NetworkUsage {
                network,
                in_use,
                free,
            })
            .collect()
    }

    /// Stop the writers once their queues are drained (after the server stopped).
    pub(crate) fn shutdown(&self) {
        let slots: Vec<Slot> = lock(&self.open).slots.drain().map(|(_, s)| s).collect();
        for mut slot in slots {
            let handle = slot.writer.take();
            // Dropping the sender ends the writer's loop after the queued jobs.
            drop(slot);
            if let Some(h) = handle {
                let _ = h.join();
            }
        }
    }
}
