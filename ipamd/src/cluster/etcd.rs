//! The etcd client as the cluster code uses it: every call bounded by the configured
//! timeout (etcd-client's own per-request timeout, and a tokio timeout around it in case
//! connecting itself hangs), every failure an [`Error`] of kind `Unavailable` naming the
//! operation, the key and the endpoints, and every call counted for /metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    KeyValue, PutOptions, TlsOptions, Txn, TxnOp, TxnResponse, WatchOptions, WatchStream,
};

use super::EtcdOptions;
use crate::{Error, ErrorKind};

/// Counters of etcd calls, shared with /metrics.
#[derive(Debug, Default)]
pub(crate) struct EtcdStats {
    pub calls: AtomicU64,
    pub errors: AtomicU64,
    /// Sum of call latencies, microseconds.
    pub latency_us: AtomicU64,
    /// Calls that took at most 5, 10, 25, 50, 100, 250, 1000 ms (cumulative histogram).
    pub buckets: [AtomicU64; 7],
}

pub(crate) const BUCKETS_MS: [u64; 7] = [5, 10, 25, 50, 100, 250, 1000];

impl EtcdStats {
    fn record(&self, took: Duration, ok: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.fetch_add(us, Ordering::Relaxed);
        for (b, limit) in self.buckets.iter().zip(BUCKETS_MS) {
            if us <= limit * 1000 {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A connected (lazily: connecting never waits for a server) etcd client.
#[derive(Clone)]
pub(crate) struct Etcd {
    client: Client,
    timeout: Duration,
    endpoints: String,
    pub(crate) stats: Arc<EtcdStats>,
}

/// A condition of a conditional write ([`Etcd::write_if`]).
#[derive(Debug, Clone)]
pub(crate) enum Guard {
    /// The key does not exist.
    Absent(String),
    /// The key was last changed at this revision (0: it does not exist).
    ModRevision(String, i64),
    /// The key exists and is attached to this lease (a node's live session).
    Lease(String, i64),
    /// The key has been written this many times since created (0: it does not exist).
    Version(String, i64),
}

impl Guard {
    fn compare(&self) -> Compare {
        match self {
            Guard::Absent(k) => Compare::create_revision(k.as_str(), CompareOp::Equal, 0),
            Guard::ModRevision(k, rev) => Compare::mod_revision(k.as_str(), CompareOp::Equal, *rev),
            Guard::Lease(k, lease) => Compare::lease(k.as_str(), CompareOp::Equal, *lease),
            Guard::Version(k, v) => Compare::version(k.as_str(), CompareOp::Equal, *v),
        }
    }
}

/// One write of a conditional write.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    /// Put key = value, attached to the lease when not 0.
    Put(String, Vec<u8>, i64),
    Delete(String),
}

impl Write {
    fn op(self) -> TxnOp {
        match self {
            Write::Put(k, v, 0) => TxnOp::put(k, v, None),
            Write::Put(k, v, lease) => TxnOp::put(k, v, Some(PutOptions::new().with_lease(lease))),
            Write::Delete(k) => TxnOp::delete(k, None),
        }
    }
}

/// One key read from etcd.
#[derive(Debug, Clone)]
pub(crate) struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

impl From<&KeyValue> for Kv {
    fn from(kv: &KeyValue) -> Kv {
        Kv {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            lease: kv.lease(),
        }
    }
}

impl Etcd {
    /// Set up the client. Must run inside a tokio runtime. Fails only on bad options
    /// (unreadable TLS files, malformed endpoints), never because etcd is down.
    pub(crate) async fn connect(opts: &EtcdOptions) -> Result<Etcd, Error> {
        if opts.endpoints.is_empty() {
            return Err(Error::invalid("--etcd-endpoints is empty"));
        }
        let endpoints = opts.endpoints.join(",");
        let mut co = ConnectOptions::new()
            .with_connect_timeout(opts.timeout)
            .with_timeout(opts.timeout)
            // A dead member is noticed by the keep-alive and its calls go to the others.
            .with_keep_alive(Duration::from_secs(5), opts.timeout)
            // Without a leader a member cannot serve a linearizable call: fail fast (then
            // the caller reports 11) instead of waiting out the timeout.
            .with_require_leader(true);
        if opts.ca_file.is_some() || opts.cert_file.is_some() {
            co = co.with_tls(tls_options(opts)?);
        }
        let connect = Client::connect(opts.endpoints.clone(), Some(co));
        let client = match tokio::time::timeout(opts.timeout, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(Error::invalid(format!(
                    "etcd endpoints {endpoints}: {e} (expected URLs like http://10.0.0.1:2379)"
                )))
            }
            Err(_) => {
                return Err(unavailable(
                    &endpoints,
                    "connect",
                    "",
                    &format!("no answer within {:?}", opts.timeout),
                ))
            }
        };
        Ok(Etcd {
            client,
            timeout: opts.timeout,
            endpoints,
            stats: Arc::default(),
        })
    }

    pub(crate) fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// Run one call under the timeout, recording it.
    async fn call<T>(
        &self,
        op: &str,
        key: &str,
        fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let res = match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(unavailable(&self.endpoints, op, key, &e.to_string())),
            Err(_) => Err(unavailable(
                &self.endpoints,
                op,
                key,
                &format!("no answer within {:?}", self.timeout),
            )),
        };
        self.stats.record(started.elapsed(), res.is_ok());
        res
    }

    /// The key's value, or None.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<Kv>, Error> {
        let mut c = self.client.kv_client();
        let resp = self.call("get", key, c.get(key, None)).await?;
        Ok(resp.kvs().first().map(Kv::from))
    }

    /// Every key under `prefix`.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<Kv>, Error> {
        let mut c = self.client.kv_client();
        let opts = GetOptions::new().with_prefix();
        let resp = self.call("list", prefix, c.get(prefix, Some(opts))).await?;
        Ok(resp.kvs().iter().map(Kv::from).collect())
    }

    /// Every key under `prefix`, and the store's revision they were read at (a watch
    /// from the next revision misses nothing).
    pub(crate) async fn list_at(&self, prefix: &str) -> Result<(Vec<Kv>, i64), Error> {
        let mut c = self.client.kv_client();
        let opts = GetOptions::new().with_prefix();
        let resp = self.call("list", prefix, c.get(prefix, Some(opts))).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((resp.kvs().iter().map(Kv::from).collect(), revision))
    }

    /// Watch every key under `prefix` from revision `from`. Only starting it is bounded:
    /// the stream lives until etcd or the caller ends it.
    pub(crate) async fn watch(&self, prefix: &str, from: i64) -> Result<WatchStream, Error> {
        let mut c = self.client.watch_client();
        let opts = WatchOptions::new().with_prefix().with_start_revision(from);
        self.call("watch", prefix, c.watch(prefix, Some(opts)))
            .await
    }

    /// Create `key` on `lease` if it is absent; whether it was created.
    pub(crate) async fn create_on_lease(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: i64,
    ) -> Result<bool, Error> {
        let guards = [Guard::Absent(key.to_string())];
        let put = vec![Write::Put(key.to_string(), value, lease)];
        Ok(self.write_if("create", key, &guards, put).await?.is_some())
    }

    /// `writes` in one transaction, done only when every guard holds. Returns the revision
    /// the writes made, or None when some guard failed (and nothing was written); `op` and
    /// `key` name the call in its errors.
    pub(crate) async fn write_if(
        &self,
        op: &str,
        key: &str,
        guards: &[Guard],
        writes: Vec<Write>,
    ) -> Result<Option<i64>, Error> {
        let when = guards.iter().map(Guard::compare).collect();
        let ops = writes.into_iter().map(Write::op).collect();
        let resp = self.txn(op, key, when, ops).await?;
        Ok(new_revision(&resp))
    }

    /// Replace `key` only if it was last changed at `mod_revision`. Returns the new mod
    /// revision, or None when the key changed meanwhile (or is gone).
    pub(crate) async fn replace(
        &self,
        key: &str,
        mod_revision: i64,
        value: Vec<u8>,
    ) -> Result<Option<i64>, Error> {
        let put = vec![TxnOp::put(key, value, None)];
        let resp = self
            .txn_if_unchanged("replace", key, mod_revision, put)
            .await?;
        Ok(new_revision(&resp))
    }

    /// Delete `key` only if it was last changed at `mod_revision`; whether it was.
    pub(crate) async fn delete_if(&self, key: &str, mod_revision: i64) -> Result<bool, Error> {
        let delete = vec![TxnOp::delete(key, None)];
        let resp = self
            .txn_if_unchanged("delete", key, mod_revision, delete)
            .await?;
        Ok(resp.succeeded())
    }

    /// Delete `key` and everything under `key/` in one transaction, if `key` was last
    /// changed at `mod_revision`.
    pub(crate) async fn delete_tree_if(&self, key: &str, mod_revision: i64) -> Result<bool, Error> {
        let delete = vec![
            TxnOp::delete(format!("{key}/"), Some(DeleteOptions::new().with_prefix())),
            TxnOp::delete(key, None),
        ];
        let resp = self
            .txn_if_unchanged("delete", key, mod_revision, delete)
            .await?;
        Ok(resp.succeeded())
    }

    /// `ops` in one transaction, done only when every comparison of `when` holds (the
    /// answer says whether they did); `op` and `key` name the call in its errors.
    async fn txn(
        &self,
        op: &str,
        key: &str,
        when: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> Result<TxnResponse, Error> {
        let txn = Txn::new().when(when).and_then(ops);
        let mut c = self.client.kv_client();
        self.call(op, key, c.txn(txn)).await
    }

    /// `ops` in one transaction, done only if `key` was last changed at `mod_revision`:
    /// the compare-and-swap every update of a known key goes through.
    async fn txn_if_unchanged(
        &self,
        op: &str,
        key: &str,
        mod_revision: i64,
        ops: Vec<TxnOp>,
    ) -> Result<TxnResponse, Error> {
        let when = vec![Compare::mod_revision(key, CompareOp::Equal, mod_revision)];
        self.txn(op, key, when, ops).await
    }

    /// A new lease of `ttl` seconds; its ID.
    pub(crate) async fn grant(&self, ttl: i64) -> Result<i64, Error> {
        let mut c = self.client.lease_client();
        let resp = self.call("lease grant", "", c.grant(ttl, None)).await?;
        Ok(resp.id())
    }

    /// Renew `lease` once; false when etcd no longer knows it (expired).
    pub(crate) async fn keep_alive(&self, lease: i64) -> Result<bool, Error> {
        let mut c = self.client.lease_client();
        let once = async move {
            let (mut keeper, mut stream) = c.keep_alive(lease).await?;
            keeper.keep_alive().await?;
            let resp = stream.message().await?;
            Ok(resp.map(|r| r.ttl() > 0).unwrap_or(false))
        };
        match self.call("lease keep-alive", "", once).await {
            // etcd answers a lease it no longer knows with an error of the stream (gRPC
            // NotFound, "requested lease not found"), not with a TTL of 0: both mean expired.
            Err(e) if e.message().contains("lease not found") => Ok(false),
            other => other,
        }
    }
}

/// Run `work` with a client of `opts` on a runtime of its own: the operator's commands
/// are synchronous.
pub(crate) fn with_etcd<T, F, Fut>(opts: &EtcdOptions, work: F) -> Result<T, Error>
where
    F: FnOnce(Etcd) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the tokio runtime", &e))?;
    rt.block_on(async { work(Etcd::connect(opts).await?).await })
}

/// How long an operation that needs etcd keeps trying while etcd cannot answer (a leader
/// election, a member restarting, a node session being renewed): longer than etcd's default
/// 1 s election timeout, well within the plugin's 15 s wait for the daemon.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Run `attempt` again while it fails with kind `Unavailable`, for up to [`PATIENCE`]; only
/// for attempts that are safe to repeat (reads, or writes that check what is there first).
pub(crate) async fn patiently<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        match attempt().await {
            Err(e)
                if e.kind() == ErrorKind::Unavailable
                    && Instant::now() + RETRY_PAUSE < deadline =>
            {
                crate::log_at!(crate::log::Level::Debug, "{what}: {e}; trying again");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            other => return other,
        }
    }
}

fn tls_options(opts: &EtcdOptions) -> Result<TlsOptions, Error> {
    let read = |p: &std::path::Path, what: &str| {
        std::fs::read(p).map_err(|e| Error::invalid(format!("{what} {}: {e}", p.display())))
    };
    let mut tls = TlsOptions::new();
    if let Some(ca) = &opts.ca_file {
        tls = tls.ca_certificate(Certificate::from_pem(read(ca, "--etcd-ca-file")?));
    }
    match (&opts.cert_file, &opts.key_file) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(
                read(cert, "--etcd-cert-file")?,
                read(key, "--etcd-key-file")?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(Error::invalid(
                "--etcd-cert-file and --etcd-key-file go together",
            ))
        }
    }
    Ok(tls)
}

/// The revision a transaction's writes made, or None when its conditions failed (and it
/// wrote nothing).
fn new_revision(resp: &TxnResponse) -> Option<i64> {
    resp.succeeded()
        .then(|| resp.header().map(|h| h.revision()).unwrap_or(0))
}

fn unavailable(endpoints: &str, op: &str, key: &str, why: &str) -> Error {
    let what = if key.is_empty() {
        op.to_string()
    } else {
        format!("{op} {key}")
    };
    // A TLS handshake etcd refused shows up only as a broken transport: say what to check.
    let tls = if endpoints.contains("https://") {
        " and that --etcd-ca-file (and --etcd-cert-file/--etcd-key-file, if etcd requires client certificates) are given"
    } else {
        ""
    };
    Error::new(
        ErrorKind::Unavailable,
        format!("etcd ({endpoints}) {what}: {why}; check that a quorum of etcd members is up and reachable{tls}"),
    )
}
