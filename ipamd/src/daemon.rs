//! `cnikit ipamd daemon`: serve the lease stores of one data dir on a unix socket.

use std::fs::{DirBuilder, File};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{
    UnixDatagram as StdDatagram, UnixListener as StdListener, UnixStream as StdStream,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::log::{self, Level};
use crate::server::{self, Registry};
use crate::service::Services;
use crate::store::StoreOptions;
use crate::{log_at, systemd, Error, ErrorKind};

#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Where to listen when not socket-activated.
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    /// Free leases recorded under another boot ID at start-up.
    pub reclaim_previous_boot: bool,
    /// error, warn, info or debug.
    pub log_level: String,
    /// Besides root, peers in this group (primary or supplementary) may use the daemon; the
    /// socket is then made group-accessible.
    pub allowed_gid: Option<u32>,
    /// Typed services besides the lease API, under `POST /v1/ext/<name>.<op>`.
    pub services: Services,
    /// Join the cluster pools in etcd (`--etcd-endpoints`, `--node`).
    pub cluster: Option<crate::cluster::ClusterOptions>,
    /// With a cluster: keep routes to other nodes' blocks through this (`--route-blocks`).
    pub block_routes: Option<Arc<dyn crate::cluster::RouteSync>>,
    /// Receive plugin processes' reports of their calls for /metrics (`plugin_calls`).
    pub plugin_calls: bool,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        DaemonOptions {
            socket: crate::config::DEFAULT_SOCKET.into(),
            data_dir: crate::config::DEFAULT_DATA_DIR.into(),
            reclaim_previous_boot: true,
            log_level: "info".into(),
            allowed_gid: None,
            services: Services::new(),
            cluster: None,
            block_routes: None,
            plugin_calls: true,
        }
    }
}

/// Test hook: a file whose contents the daemon uses as this boot's ID instead of
/// `/proc/sys/kernel/random/boot_id`, so tests can simulate a reboot without one. Read only
/// by [`run`] (the `cnikit ipamd daemon` entry point); the plugin's in-process path always
/// records the real boot ID.
pub const BOOT_ID_FILE_ENV: &str = "CNIKIT_IPAMD_BOOT_ID_FILE";

/// The store options of a daemon started by [`run`]: the defaults, with the boot ID taken
/// from [`BOOT_ID_FILE_ENV`] when that is set.
fn daemon_store_options() -> Result<StoreOptions, Error> {
    let mut opts = StoreOptions::default();
    if let Some(path) = std::env::var_os(BOOT_ID_FILE_ENV) {
        let path = PathBuf::from(path);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::invalid(format!(
                "{BOOT_ID_FILE_ENV}={}: cannot read it: {e}",
                path.display()
            ))
        })?;
        let id = text.trim();
        if id.is_empty() {
            return Err(Error::invalid(format!(
                "{BOOT_ID_FILE_ENV}={} is empty",
                path.display()
            )));
        }
        log_at!(
            Level::Warn,
            "using boot ID {id} from {} ({BOOT_ID_FILE_ENV}) instead of the kernel's",
            path.display()
        );
        opts.boot_id = id.to_string();
    }
    Ok(opts)
}

/// Run the daemon until SIGTERM or SIGINT. Builds its own tokio runtime.
pub fn run(opts: DaemonOptions) -> Result<(), Error> {
    let prepared = prepare(opts, daemon_store_options()?)?;
    prepared.serve(async {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => log_at!(Level::Info, "SIGTERM: shutting down"),
                    _ = int.recv() => log_at!(Level::Info, "SIGINT: shutting down"),
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                log_at!(
                    Level::Error,
                    "cannot install signal handlers: {e}; stop me with SIGKILL"
                );
                std::future::pending::<()>().await;
            }
        }
    })
}

/// A daemon running on a thread of this process (tests, benchmarks, embedding).
pub struct DaemonHandle {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

/// Start the daemon on a new thread; returns once the socket accepts connections.
pub fn start(opts: DaemonOptions) -> Result<DaemonHandle, Error> {
    start_with(opts, StoreOptions::default())
}

pub(crate) fn start_with(opts: DaemonOptions, store: StoreOptions) -> Result<DaemonHandle, Error> {
    let prepared = prepare(opts, store)?;
    let (tx, rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("ipamd".into())
        .spawn(move || {
            prepared.serve(async {
                let _ = rx.await;
            })
        })
        .map_err(|e| Error::internal(format!("cannot start daemon thread: {e}")))?;
    Ok(DaemonHandle {
        stop: Some(tx),
        thread: Some(thread),
    })
}

impl DaemonHandle {
    /// Shut down gracefully and wait for it.
    pub fn stop(mut self) -> Result<(), Error> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), Error> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(Error::internal("daemon thread panicked"))),
            None => Ok(()),
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Everything done before the runtime starts: single-instance lock, listener, reclaim.
struct Prepared {
    listener: StdListener,
    /// Socket file to remove at exit (None when systemd owns the socket).
    bound_path: Option<PathBuf>,
    registry: Arc<Registry>,
    services: Services,
    cluster: Option<crate::cluster::ClusterOptions>,
    block_routes: Option<Arc<dyn crate::cluster::RouteSync>>,
    /// The socket plugins report their calls to, and its path (removed at exit).
    plugin_calls: Option<(StdDatagram, PathBuf)>,
    _instance_lock: File,
}

fn prepare(opts: DaemonOptions, store_opts: StoreOptions) -> Result<Prepared, Error> {
    let level = Level::parse(&opts.log_level).ok_or_else(|| {
        Error::invalid(format!(
            "--log-level {:?} is not one of error, warn, info, debug",
            opts.log_level
        ))
    })?;
    log::set_level(level);

    crate::files::create_dir(&opts.data_dir, crate::files::DATA_DIR_MODE)?;
    crate::files::check_owner(&opts.data_dir)?;
    // The name starts with a dot, which the network-name charset forbids: no clash.
    let lock_path = opts.data_dir.join(".daemon.lock");
    let instance_lock = crate::files::open_lock(&lock_path)?;
    match instance_lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "another ipamd daemon already serves {} (it holds {})",
                    opts.data_dir.display(),
                    lock_path.display()
                ),
            ))
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(unavailable(format!("locking {}", lock_path.display()), &e))
        }
    }

    let store_opts = StoreOptions {
        reclaim_when_full: opts.reclaim_previous_boot,
        ..store_opts
    };
    let registry = Arc::new(Registry::new(
        opts.data_dir.clone(),
        store_opts,
        opts.allowed_gid,
    ));
    if opts.reclaim_previous_boot {
        // Before listening: no request may be answered from leases about to be freed.
        let freed = registry.reclaim_previous_boots()?;
        log_at!(
            Level::Info,
            "reclaimed {freed} address(es) from previous boots"
        );
    }

    let (listener, bound_path) = match systemd::listen_fd()? {
        Some(l) => {
            log_at!(Level::Info, "using the socket passed by systemd");
            (l, None)
        }
        None => (
            bind(&opts.socket, opts.allowed_gid)?,
            Some(opts.socket.clone()),
        ),
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("making the listener non-blocking", &e))?;
    let plugin_calls = match opts.plugin_calls {
        true => bind_plugin_calls(&opts.socket, opts.allowed_gid),
        false => None,
    };
    Ok(Prepared {
        listener,
        bound_path,
        registry,
        services: opts.services,
        cluster: opts.cluster,
        block_routes: opts.block_routes,
        plugin_calls,
        _instance_lock: instance_lock,
    })
}

impl Prepared {
    fn serve(self, shutdown: impl std::future::Future<Output = ()>) -> Result<(), Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("ipamd-worker")
            .build()
            .map_err(|e| Error::io("starting the tokio runtime", &e))?;
        let res = rt.block_on(async {
            let listener = tokio::net::UnixListener::from_std(self.listener)
                .map_err(|e| Error::io("registering the listener", &e))?;
            if let Some(c) = self.cluster {
                server::start_cluster(&self.registry, c, self.block_routes).await?;
            }
            if let Some((sock, _)) = self.plugin_calls.as_ref() {
                match sock
                    .try_clone()
                    .and_then(tokio::net::UnixDatagram::from_std)
                {
                    Ok(s) => drop(tokio::spawn(server::receive_plugin_calls(
                        s,
                        Arc::clone(&self.registry),
                    ))),
                    Err(e) => log_at!(Level::Warn, "plugin call reports: {e}"),
                }
            }
            systemd::notify("READY=1");
            log_at!(Level::Info, "ready");
            // The accept loop runs on a worker, not on this thread: a connection's task
            // spawned there starts on that same worker right after the accept, while one
            // spawned from here has to wake a worker first (a futex wake and, with the
            // worker's CPU idle, an IPI) on every request.
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let mut server = tokio::spawn(server::serve(
                listener,
                Arc::clone(&self.registry),
                self.services,
                async {
                    let _ = stopped.await;
                },
            ));
            let ended = tokio::select! {
                () = shutdown => None,
                r = &mut server => Some(r),
            };
            let ended = match ended {
                Some(r) => r,
                None => {
                    let _ = stop.send(());
                    server.await
                }
            };
            if let Err(e) = ended {
                log_at!(Level::Error, "the server task failed: {e}");
            }
            systemd::notify("STOPPING=1");
            Ok(())
        });
        if let Some(p) = &self.bound_path {
            let _ = std::fs::remove_file(p);
        }
        if let Some((_, p)) = &self.plugin_calls {
            let _ = std::fs::remove_file(p);
        }
        // In-flight requests are answered; let the writers finish their queues.
        self.registry.shutdown();
        res
    }
}

/// Bind the socket ourselves: refuse if a live daemon answers there, replace a stale file.
fn bind(path: &Path, allowed_gid: Option<u32>) -> Result<StdListener, Error> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| unavailable(format!("creating {}", parent.display()), &e))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(Error::invalid(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        if StdStream::connect(path).is_ok() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{} is in use by another process", path.display()),
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| unavailable(format!("removing stale {}", path.display()), &e))?;
    }
    let listener = StdListener::bind(path)
        .map_err(|e| unavailable(format!("binding {}", path.display()), &e))?;
    // No race worth closing with umask: connecting needs write permission, which the
    // default umask already withholds from others, and every peer is checked with
    // SO_PEERCRED anyway.
    let mode = if allowed_gid.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| unavailable(format!("chmod {}", path.display()), &e))?;
    if let Some(gid) = allowed_gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| unavailable(format!("chown {} to group {gid}", path.display()), &e))?;
    }
    log_at!(Level::Info, "listening on {}", path.display());
    Ok(listener)
}

/// The datagram socket plugins report their calls to, beside the API socket and with its
/// mode. A report is only counted, so a socket that cannot be made costs the metrics,
/// not the daemon: logged, and None.
fn bind_plugin_calls(
    api_socket: &Path,
    allowed_gid: Option<u32>,
) -> Option<(StdDatagram, PathBuf)> {
    let path = crate::plugin_calls::socket_beside(api_socket);
    let made = (|| -> std::io::Result<StdDatagram> {
        use std::os::unix::fs::FileTypeExt;
        // A stale socket of an earlier daemon goes (this one holds the instance lock); a
        // file of another kind is someone else's and stays.
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if !meta.file_type().is_socket() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "not a socket",
                ));
            }
            std::fs::remove_file(&path)?;
        }
        let sock = StdDatagram::bind(&path)?;
        let mode = if allowed_gid.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        if let Some(gid) = allowed_gid {
            std::os::unix::fs::chown(&path, None, Some(gid))?;
        }
        sock.set_nonblocking(true)?;
        Ok(sock)
    })();
    match made {
        Ok(sock) => Some((sock, path)),
        Err(e) => {
            log_at!(
                Level::Warn,
                "no plugin call reports: cannot bind {}: {e}",
                path.display()
            );
            None
        }
    }
}

fn unavailable(context: String, e: &std::io::Error) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{context}: {e}"))
}
