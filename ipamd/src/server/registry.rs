//! The daemon's open stores, one per network, each served by its own writer thread.
//!
//! Requests for a network are queued to its writer; the writer takes everything queued,
//! runs it as one batch under one flock, fsyncs once, and answers them all. That is the
//! group commit: with N concurrent requests a network pays about one fsync per batch instead
//! of N, and no request is answered before its record is durable.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::config::{canonicalize_range_sets, RangeSet};
use crate::log::Level;
use crate::store::{list_networks, usage, Op, Reply, Store, StoreOptions};
use crate::{log_at, Error};

use super::metrics::{Metrics, NetworkUsage};

/// Most operations run in one batch (bounds the latency of the first one queued).
const MAX_BATCH: usize = 256;

type Job = (Op, oneshot::Sender<Result<Reply, Error>>);

struct Slot {
    queue: mpsc::Sender<Job>,
    store: Arc<Mutex<Store>>,
    /// Range sets of the latest valid request, to report free addresses in /metrics.
    range_sets: Mutex<Vec<RangeSet>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) struct Registry {
    data_dir: PathBuf,
    /// (device, inode) of `data_dir`, to recognize it under any path.
    data_dir_id: Option<(u64, u64)>,
    opts: StoreOptions,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    pub(crate) metrics: Metrics,
    pub(crate) allowed_gid: Option<u32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic mid-batch leaves a state the next refresh reconciles with the files, so a
    // poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The writer thread of one network.
fn writer(network: String, store: Arc<Mutex<Store>>, queue: mpsc::Receiver<Job>) {
    while let Ok(first) = queue.recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let (ops, replies): (Vec<Op>, Vec<_>) = jobs.into_iter().unzip();
        // Only the batch itself holds the store; the fsync runs without it.
        let batch = lock(&store).execute_batch(&ops);
        let results = batch.finish();
        for (reply, result) in replies.into_iter().zip(results) {
            // The requester may have gone away (client hung up); nothing to do then.
            let _ = reply.send(result);
        }
    }
    log_at!(Level::Debug, "network {network}: writer stopped");
}

/// A directory's identity (device, inode), as clients send it.
fn dir_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Registry {
    pub(crate) fn new(data_dir: PathBuf, opts: StoreOptions, allowed_gid: Option<u32>) -> Registry {
        let data_dir_id = dir_id(&data_dir);
        Registry {
            data_dir,
            data_dir_id,
            opts,
            slots: Mutex::new(HashMap::new()),
            metrics: Metrics::default(),
            allowed_gid,
        }
    }

    fn slot(&self, network: &str) -> Result<Arc<Slot>, Error> {
        let mut slots = lock(&self.slots);
        if let Some(s) = slots.get(network) {
            return Ok(Arc::clone(s));
        }
        let store = Arc::new(Mutex::new(Store::open(
            &self.data_dir,
            network,
            self.opts.clone(),
        )?));
        let (tx, rx) = mpsc::channel();
        let (name, st) = (network.to_string(), Arc::clone(&store));
        let handle = std::thread::Builder::new()
            .name(format!(
                "ipamd-{}",
                network.chars().take(9).collect::<String>()
            ))
            .spawn(move || writer(name, st, rx))
            .map_err(|e| Error::internal(format!("cannot start writer for {network}: {e}")))?;
        let slot = Arc::new(Slot {
            queue: tx,
            store,
            range_sets: Mutex::new(Vec::new()),
            writer: Mutex::new(Some(handle)),
        });
        slots.insert(network.to_string(), Arc::clone(&slot));
        Ok(slot)
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

    /// Queue `op` for `network`'s writer; the answer arrives on the returned channel.
    fn submit(
        &self,
        network: &str,
        op: Op,
    ) -> Result<oneshot::Receiver<Result<Reply, Error>>, Error> {
        let slot = self.slot(network)?;
        match &op {
            Op::Allocate(r) => slot.remember(&r.range_sets),
            Op::Status(s) => slot.remember(s),
            _ => {}
        }
        let (tx, rx) = oneshot::channel();
        slot.queue
            .send((op, tx))
            .map_err(|_| Error::internal(format!("the writer of network {network} is gone")))?;
        Ok(rx)
    }

    /// Run `op` on `network` from async code.
    pub(crate) async fn call(&self, network: &str, op: Op) -> Result<Reply, Error> {
        let rx = self.submit(network, op)?;
        rx.await
            .unwrap_or_else(|_| Err(Error::internal("the network's writer dropped the request")))
    }

    /// Run `op` on `network` from a thread outside the runtime (start-up).
    fn call_blocking(&self, network: &str, op: Op) -> Result<Reply, Error> {
        let rx = self.submit(network, op)?;
        rx.blocking_recv()
            .unwrap_or_else(|_| Err(Error::internal("the network's writer dropped the request")))
    }

    /// Networks with a store on disk, plus any opened since.
    pub(crate) fn networks(&self) -> Result<Vec<String>, Error> {
        let mut names = list_networks(&self.data_dir)?;
        names.extend(lock(&self.slots).keys().cloned());
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
        for n in list_networks(&self.data_dir)? {
            match self.call_blocking(&n, Op::Reclaim) {
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
        let slots: Vec<(String, Arc<Slot>)> = lock(&self.slots)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let mut out: Vec<NetworkUsage> = slots
            .into_iter()
            .map(|(network, slot)| {
                let sets = lock(&slot.range_sets).clone();
                let store = lock(&slot.store);
                let in_use = store.state().by_addr.len() as u128;
                let free = (!sets.is_empty()).then(|| usage(store.state(), &sets).1);
                NetworkUsage {
                    network,
                    in_use,
                    free,
                }
            })
            .collect();
        out.sort_by(|a, b| a.network.cmp(&b.network));
        out
    }

    /// Stop the writers once their queues are drained (after the server stopped).
    pub(crate) fn shutdown(&self) {
        let slots: Vec<Arc<Slot>> = lock(&self.slots).drain().map(|(_, s)| s).collect();
        for slot in slots {
            let handle = lock(&slot.writer).take();
            // Dropping the last sender ends the writer's loop after the queued jobs.
            drop(slot);
            if let Some(h) = handle {
                let _ = h.join();
            }
        }
    }
}

impl Slot {
    /// Keep the request's range sets for /metrics, only if valid (pool arithmetic relies
    /// on validated bounds).
    fn remember(&self, range_sets: &[RangeSet]) {
        if let Ok(sets) = canonicalize_range_sets(range_sets) {
            *lock(&self.range_sets) = sets;
        }
    }
}
