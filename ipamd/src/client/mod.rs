//! The plugin side: one call per CNI invocation. Each call goes to the daemon first; when
//! the daemon does not serve it (the policy is [`Daemon::send`]'s) the same operation runs
//! in-process against the store, under the same lock and journal, so IPAM works with no
//! daemon at all and never ends up with two holders for one address.

mod daemon;
pub(crate) mod http;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use daemon::{Daemon, Failure, Outcome};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{
    AllocateRequest, AllocateResponse, Allocation, Attachment, ErrorBody, GcRequest, GcResponse,
    LeaseInfo, LeaseKey, LeasesResponse, StatusRequest,
};
use crate::config::RangeSet;
use crate::store::{list_networks, run_once, unexpected, Op, Reply, StoreOptions};
use crate::{Error, ErrorKind};

/// The lease API: the daemon at a socket, and the data dir to work on when it does not serve.
#[derive(Debug, Clone)]
pub struct Client {
    daemon: Daemon,
    data_dir: PathBuf,
}

impl Client {
    pub fn new(socket: &Path, data_dir: &Path) -> Client {
        Client {
            daemon: Daemon::new(socket),
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// Override the connect and read/write timeouts of daemon calls.
    pub fn with_timeouts(mut self, connect: Duration, io: Duration) -> Client {
        self.daemon = self.daemon.with_timeouts(connect, io);
        self
    }

    /// One address per range set, in range-set order; a key that holds leases gets them back.
    pub fn allocate(&self, req: &AllocateRequest) -> Result<Vec<Allocation>, Error> {
        req.key.validate()?;
        self.call(
            "POST",
            "/v1/allocate",
            Some(req),
            |r: AllocateResponse| r.allocations,
            || {
                if !req.pools.is_empty() {
                    return Err(self.pools_need_daemon(&req.pools));
                }
                match self.local(&req.key.network, Op::Allocate(req.clone()))? {
                    Reply::Allocations(a) => Ok(a),
                    other => Err(unexpected(&other)),
                }
            },
        )
    }

    /// A cluster pool's blocks are known only to the daemon (it holds them in etcd): without
    /// it, allocating could hand out an address of another node's block.
    fn pools_need_daemon(&self, pools: &[String]) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "cluster pool(s) {} need the ipamd daemon, and none answers at {}: start `cnikit ipamd daemon --etcd-endpoints … --node …` (or its systemd unit), then retry",
                pools.join(", "),
                self.daemon.socket().display()
            ),
        )
    }

    /// STATUS of cluster pools: Ok while the daemon can serve an ADD from each of them.
    pub fn status_pools(&self, network: &str, pools: &[String]) -> Result<(), Error> {
        crate::attachment::check_network(network)?;
        let req = StatusRequest {
            network: network.to_string(),
            range_sets: Vec::new(),
            pools: pools.to_vec(),
        };
        self.call(
            "POST",
            "/v1/status",
            Some(&req),
            |_: serde_json::Value| (),
            || Err(self.pools_need_daemon(pools)),
        )
    }

    /// Free the key's leases; Ok when it holds none.
    pub fn release(&self, key: &LeaseKey) -> Result<(), Error> {
        key.validate()?;
        self.call(
            "POST",
            "/v1/release",
            Some(key),
            |_: serde_json::Value| (),
            || {
                let op = Op::Release {
                    cid: key.container_id.clone(),
                    ifname: key.ifname.clone(),
                };
                self.local(&key.network, op).map(|_| ())
            },
        )
    }

    /// The leases the key holds (empty if none).
    pub fn check(&self, key: &LeaseKey) -> Result<Vec<Allocation>, Error> {
        key.validate()?;
        self.call(
            "POST",
            "/v1/check",
            Some(key),
            |r: AllocateResponse| r.allocations,
            || {
                let op = Op::Check {
                    cid: key.container_id.clone(),
                    ifname: key.ifname.clone(),
                };
                match self.local(&key.network, op)? {
                    Reply::Allocations(a) => Ok(a),
                    other => Err(unexpected(&other)),
                }
            },
        )
    }

    /// Ok when an ADD could get an address in every range set now; `Exhausted` otherwise.
    pub fn status(&self, network: &str, range_sets: &[RangeSet]) -> Result<(), Error> {
        crate::attachment::check_network(network)?;
        let req = StatusRequest {
            network: network.to_string(),
            range_sets: range_sets.to_vec(),
            pools: Vec::new(),
        };
        self.call(
            "POST",
            "/v1/status",
            Some(&req),
            |_: serde_json::Value| (),
            || {
                self.local(network, Op::Status(range_sets.to_vec()))
                    .map(|_| ())
            },
        )
    }

    /// Free the leases of every attachment of `network` not in `valid`; returns how many
    /// addresses were freed.
    pub fn gc(&self, network: &str, valid: &[Attachment]) -> Result<usize, Error> {
        crate::attachment::check_network(network)?;
        let req = GcRequest {
            network: network.to_string(),
            valid: valid.to_vec(),
        };
        self.call(
            "POST",
            "/v1/gc",
            Some(&req),
            |r: GcResponse| r.freed,
            || match self.local(network, Op::Gc(req.valid.clone()))? {
                Reply::Freed(n) => Ok(n),
                other => Err(unexpected(&other)),
            },
        )
    }

    /// Leases of one network, or of all networks under the data dir.
    pub fn leases(&self, network: Option<&str>) -> Result<Vec<LeaseInfo>, Error> {
        let target = match network {
            Some(n) => {
                crate::attachment::check_network(n)?;
                format!("/v1/leases?network={n}")
            }
            None => "/v1/leases".to_string(),
        };
        self.call(
            "GET",
            &target,
            None::<&()>,
            |r: LeasesResponse| r.leases,
            || {
                let names = match network {
                    Some(n) => vec![n.to_string()],
                    None => list_networks(&self.data_dir)?,
                };
                let mut out = Vec::new();
                for n in names {
                    match self.local(&n, Op::Leases)? {
                        Reply::Leases(l) => out.extend(l),
                        other => return Err(unexpected(&other)),
                    }
                }
                Ok(out)
            },
        )
    }

    /// The operation in this process; reads of a network with no store create nothing.
    fn local(&self, network: &str, op: Op) -> Result<Reply, Error> {
        run_once(&self.data_dir, network, StoreOptions::default(), op)
    }

    /// Ask the daemon; run `local` when it does not serve the request.
    fn call<B: Serialize, R: DeserializeOwned, T>(
        &self,
        method: &str,
        target: &str,
        body: Option<&B>,
        unwrap: impl FnOnce(R) -> T,
        local: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let bytes = match body {
            Some(b) => Some(
                serde_json::to_vec(b)
                    .map_err(|e| Error::internal(format!("cannot encode request: {e}")))?,
            ),
            None => None,
        };
        // Tell the daemon which store we would use without it; it refuses another one.
        let dir_id = crate::api::data_dir_header(&self.data_dir);
        let headers = [(crate::api::DATA_DIR_HEADER, dir_id.as_str())];
        match self.daemon.send(method, target, &headers, bytes.as_deref()) {
            Outcome::Answered { status, body } if (200..300).contains(&status) => {
                let parsed: R = serde_json::from_slice(&body).map_err(|e| {
                    Error::internal(format!("ipamd sent an unreadable answer to {target}: {e}"))
                })?;
                Ok(unwrap(parsed))
            }
            Outcome::Answered { status, body } => {
                Err(daemon_error(self.daemon.socket(), status, &body))
            }
            Outcome::Local(_) => local(),
            Outcome::Failed(why) => Err(Error::new(ErrorKind::Unavailable, why)),
        }
    }
}

fn daemon_error(socket: &Path, status: u16, body: &[u8]) -> Error {
    if let Ok(b) = serde_json::from_slice::<ErrorBody>(body) {
        return b.into();
    }
    let text = String::from_utf8_lossy(body);
    let msg = if status == 403 {
        format!(
            "ipamd at {} refused this process (uid {}): only root or the daemon's allowed group may use it",
            socket.display(),
            // SAFETY: getuid cannot fail.
            unsafe { libc::getuid() }
        )
    } else {
        format!(
            "ipamd at {} answered {status}: {}",
            socket.display(),
            text.trim()
        )
    };
    Error::new(ErrorKind::Unavailable, msg)
}
