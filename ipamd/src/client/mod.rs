//! The plugin side: one call per CNI invocation. Each call goes to the daemon first; when
//! nothing listens on the socket (or the daemon dies mid-request) the same operation runs
//! in-process against the store, under the same lock and journal, so IPAM works with no
//! daemon at all and never ends up with two holders for one address.

pub(crate) mod http;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{
    AllocateRequest, AllocateResponse, Allocation, Attachment, ErrorBody, GcRequest, GcResponse,
    LeaseInfo, LeaseKey, LeasesResponse, StatusRequest,
};
use crate::config::RangeSet;
use crate::log::Level;
use crate::store::{list_networks, Store, StoreOptions};
use crate::{log_at, Error, ErrorKind};

use http::Transport;

#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    data_dir: PathBuf,
    connect_timeout: Duration,
    io_timeout: Duration,
}

impl Client {
    pub fn new(socket: &Path, data_dir: &Path) -> Client {
        Client {
            socket: socket.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            connect_timeout: Duration::from_secs(2),
            // Long enough for a socket-activated daemon to start and load its stores.
            io_timeout: Duration::from_secs(15),
        }
    }

    /// A client for [`Client::call_ext`] only: no store to fall back to.
    pub fn without_store(socket: &Path) -> Client {
        Client::new(socket, Path::new(crate::config::DEFAULT_DATA_DIR))
    }

    /// Override the connect and read/write timeouts of daemon calls.
    pub fn with_timeouts(mut self, connect: Duration, io: Duration) -> Client {
        self.connect_timeout = connect;
        self.io_timeout = io;
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
            || self.store(&req.key.network)?.allocate(req),
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
                self.store(&key.network)?
                    .release(&key.container_id, &key.ifname)
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
                self.store(&key.network)?
                    .check(&key.container_id, &key.ifname)
            },
        )
    }

    /// Ok when an ADD could get an address in every range set now; `Exhausted` otherwise.
    pub fn status(&self, network: &str, range_sets: &[RangeSet]) -> Result<(), Error> {
        crate::api::validate_network_name(network)?;
        let req = StatusRequest {
            network: network.to_string(),
            range_sets: range_sets.to_vec(),
        };
        self.call(
            "POST",
            "/v1/status",
            Some(&req),
            |_: serde_json::Value| (),
            || self.store(network)?.status(range_sets),
        )
    }

    /// Free the leases of every attachment of `network` not in `valid`; returns how many
    /// addresses were freed.
    pub fn gc(&self, network: &str, valid: &[(String, String)]) -> Result<usize, Error> {
        crate::api::validate_network_name(network)?;
        let req = GcRequest {
            network: network.to_string(),
            valid: valid
                .iter()
                .map(|(c, i)| Attachment {
                    container_id: c.clone(),
                    ifname: i.clone(),
                })
                .collect(),
        };
        self.call(
            "POST",
            "/v1/gc",
            Some(&req),
            |r: GcResponse| r.freed,
            || self.store(network)?.gc(&req.valid),
        )
    }

    /// Leases of one network, or of all networks under the data dir.
    pub fn leases(&self, network: Option<&str>) -> Result<Vec<LeaseInfo>, Error> {
        let target = match network {
            Some(n) => {
                crate::api::validate_network_name(n)?;
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
                    out.extend(self.store(&n)?.leases()?);
                }
                Ok(out)
            },
        )
    }

    fn store(&self, network: &str) -> Result<Store, Error> {
        Store::open(&self.data_dir, network, StoreOptions::default())
    }

    /// Ask the daemon; run `local` when there is none (or it died mid-request).
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
        let resp = http::request_with(
            &self.socket,
            method,
            target,
            &headers,
            bytes.as_deref(),
            self.connect_timeout,
            self.io_timeout,
        );
        match resp {
            Ok(r) if (200..300).contains(&r.status) => {
                let parsed: R = serde_json::from_slice(&r.body).map_err(|e| {
                    Error::internal(format!("ipamd sent an unreadable answer to {target}: {e}"))
                })?;
                Ok(unwrap(parsed))
            }
            Ok(r) => Err(daemon_error(&self.socket, r.status, &r.body)),
            Err(Transport::NoDaemon(why)) => {
                log_at!(Level::Debug, "{why}; working on the store in-process");
                local()
            }
            Err(Transport::Died(why)) => {
                log_at!(Level::Warn, "{why}; retrying in-process");
                local()
            }
            Err(Transport::Failed(why)) => Err(Error::new(ErrorKind::Unavailable, why)),
        }
    }
}

impl Client {
    /// `POST /v1/ext/<op>` with `body` (see [`crate::daemon::ExtensionFn`]). None when no
    /// daemon served it: nothing listens, the daemon died mid-request, refused us, has no
    /// such extension, or declined (421) — the caller then does the work itself, so an
    /// extension operation must be idempotent. Otherwise the extension's own answer:
    /// `Ok(body)` on 2xx, `Err((status, body))` else.
    pub fn call_ext(&self, op: &str, body: &[u8]) -> Option<crate::daemon::ExtReply> {
        let target = format!("/v1/ext/{op}");
        let resp = http::request_with(
            &self.socket,
            "POST",
            &target,
            &[],
            Some(body),
            self.connect_timeout,
            self.io_timeout,
        );
        match resp {
            Ok(r) if (200..300).contains(&r.status) => Some(Ok(r.body)),
            Ok(r) if matches!(r.status, 403 | 404 | 405 | 421 | 503) => {
                log_at!(
                    Level::Debug,
                    "ipamd at {} did not serve {target} ({}); doing it in-process",
                    self.socket.display(),
                    r.status
                );
                None
            }
            Ok(r) => Some(Err((r.status, r.body))),
            Err(Transport::NoDaemon(why)) => {
                log_at!(Level::Debug, "{why}; doing {op} in-process");
                None
            }
            Err(Transport::Died(why)) => {
                log_at!(Level::Warn, "{why}; retrying {op} in-process");
                None
            }
            Err(Transport::Failed(why)) => {
                log_at!(Level::Debug, "{why}; doing {op} in-process");
                None
            }
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
