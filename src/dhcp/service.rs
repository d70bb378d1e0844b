//! The daemon's `dhcp` service (`POST /v1/ext/dhcp.<op>`): the `dhcp` plugin's requests,
//! done on the leases the daemon keeps.
//!
//! Who may ask: only root with CAP_NET_ADMIN in the daemon's user namespace, from the
//! daemon's network namespace — what the kernel says of the peer, never what the request
//! claims. Acting in a pod's netns is acting as its administrator; a caller without that
//! power could not do it itself, so the daemon does not do it for them. STATUS (whether
//! the daemon answers) is open to every peer the daemon's own gate lets in.

use super::exchange::Client;
use super::lease::{self, Phase, Terms};
use super::lease_files::{LeaseFiles, Record};
use super::maintain::{Held, Keeper};
use super::options::ClientOptions;
use super::socket::PodSocket;
use super::{Error, ErrorKind, Timing};
use ipamd::attachment::Attachment;
use ipamd::log::Level;
use ipamd::log_at;
use ipamd::service::{Peer, Refusal, Service};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

/// What the plugin asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// ADD: a lease for the attachment's interface in `netns` (the one it holds already,
    /// when it holds one there).
    Acquire {
        attachment: Attachment,
        netns: PathBuf,
        options: ClientOptions,
    },
    /// CHECK: the lease is held, in force, and its address is on the interface.
    Check { attachment: Attachment },
    /// DEL: release the lease; nothing held is fine.
    Release { attachment: Attachment },
    /// STATUS: the daemon answers.
    Status,
    /// GC: release the leases of `network` held by no attachment in `valid`.
    Gc {
        network: String,
        valid: Vec<Attachment>,
    },
}

/// The answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Response {
    /// The lease, for the plugin's result.
    Granted {
        terms: Terms,
    },
    Done,
    Collected {
        released: usize,
    },
}

/// The daemon's settings for the service.
#[derive(Debug, Clone)]
pub struct DhcpOptions {
    /// Where lease records are kept.
    pub state_dir: PathBuf,
    pub timing: Timing,
    pub broadcast: bool,
    /// `-hostprefix`: the host's root as the daemon sees it (a daemon in a container).
    pub host_prefix: PathBuf,
}

/// The service and every lease it keeps.
pub struct Dhcp {
    keeper: Keeper,
    /// One slot per attachment: requests for one attachment take turns, others go on.
    slots: Mutex<HashMap<Attachment, Arc<Mutex<Option<Held>>>>>,
}

/// Refused: the peer may not act in pods' netns.
const FORBIDDEN: u16 = 403;

impl Dhcp {
    /// Opens the lease records and resumes every lease they hold (each on its own
    /// thread: a pod whose netns is gone is forgotten there, without delaying start-up).
    pub fn start(opts: DhcpOptions) -> Result<Dhcp, Error> {
        let files = LeaseFiles::open(&opts.state_dir)?;
        let keeper = Keeper {
            files: files.clone(),
            timing: opts.timing,
            broadcast: opts.broadcast,
            host_prefix: opts.host_prefix,
        };
        let (records, bad) = files.load()?;
        for b in &bad {
            log_at!(Level::Error, "dhcp: skipping {b}");
        }
        let mut slots = HashMap::new();
        for record in records {
            match record.ack() {
                Ok(ack) => {
                    let key = record.attachment.clone();
                    let held = Held::resume(keeper.clone(), record, ack);
                    slots.insert(key, Arc::new(Mutex::new(Some(held))));
                }
                Err(e) => log_at!(Level::Error, "dhcp: lease of {:?}: {e}", record.attachment),
            }
        }
        log_at!(
            Level::Info,
            "dhcp: resumed {} lease(s) from {}",
            slots.len(),
            files.dir().display()
        );
        Ok(Dhcp {
            keeper,
            slots: Mutex::new(slots),
        })
    }

    fn slot(&self, key: &Attachment) -> Arc<Mutex<Option<Held>>> {
        let mut slots = lock(&self.slots);
        Arc::clone(slots.entry(key.clone()).or_default())
    }

    fn acquire(
        &self,
        attachment: Attachment,
        netns: PathBuf,
        options: ClientOptions,
    ) -> Result<Response, Error> {
        let slot = self.slot(&attachment);
        let mut held = lock(&slot);
        if let Some(h) = held.take() {
            let (ack, at, phase) = h.current();
            if at == netns
                && phase != Phase::Ended
                && phase != Phase::Expired
                && h.options() == options
            {
                // ADD again for the same pod (a runtime retrying): the lease it holds.
                let terms = lease::terms(&ack)?;
                *held = Some(h);
                return Ok(granted(&terms));
            }
            h.release();
        }
        let path = self.keeper.host_path(&netns);
        let socket = PodSocket::open(&path, &attachment.ifname)?;
        let client = Client {
            socket: &socket,
            options: &options,
            timing: self.keeper.timing,
            broadcast: self.keeper.broadcast,
            cancel: None,
        };
        let ack = client.acquire(None)?;
        let bound_at = SystemTime::now();
        // Nothing is answered before the lease is usable and on disk; a lease that is
        // not goes back to the server at once.
        let kept = lease::terms(&ack).and_then(|terms| {
            let record = Record::new(
                attachment.clone(),
                netns.clone(),
                options.clone(),
                &ack,
                bound_at,
            )?;
            self.keeper.files.save(&record)?;
            Ok((terms, record))
        });
        let (terms, record) = match kept {
            Ok(k) => k,
            Err(e) => {
                if let Err(r) = client.release(&ack) {
                    log_at!(Level::Warn, "dhcp: {r}");
                }
                return Err(e);
            }
        };
        log_at!(
            Level::Info,
            "dhcp: {} got {} on {} in {}",
            attachment.container_id,
            terms.address,
            attachment.ifname,
            netns.display()
        );
        *held = Some(Held::start(self.keeper.clone(), socket, record, ack));
        Ok(granted(&terms))
    }

    fn check(&self, attachment: &Attachment) -> Result<Response, Error> {
        let slot = self.slot(attachment);
        let held = lock(&slot);
        let Some(h) = held.as_ref() else {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "the DHCP daemon holds no lease for container {} interface {}",
                    attachment.container_id, attachment.ifname
                ),
            ));
        };
        let (ack, _, phase) = h.current();
        let terms = lease::terms(&ack)?;
        match phase {
            Phase::Expired | Phase::Ended => Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "the lease of {} on {} is {phase:?}",
                    terms.address, attachment.ifname
                ),
            )),
            _ if !h.address_on_interface(&terms)? => Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "the leased address {} is not on {}",
                    terms.address, attachment.ifname
                ),
            )),
            _ => Ok(Response::Done),
        }
    }

    fn release(&self, attachment: &Attachment) -> Result<Response, Error> {
        let slot = self.slot(attachment);
        let taken = lock(&slot).take();
        match taken {
            Some(h) => h.release(),
            // No lease kept: a record may still be there (a resume that failed).
            None => self.keeper.files.remove(attachment)?,
        }
        lock(&self.slots).remove(attachment);
        Ok(Response::Done)
    }

    fn gc(&self, network: &str, valid: &[Attachment]) -> Result<Response, Error> {
        let stale: Vec<Attachment> = lock(&self.slots)
            .keys()
            .filter(|a| a.network == network && !valid.contains(a))
            .cloned()
            .collect();
        for a in &stale {
            self.release(a)?;
        }
        Ok(Response::Collected {
            released: stale.len(),
        })
    }
}

fn granted(terms: &Terms) -> Response {
    Response::Granted {
        terms: terms.clone(),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn op_name(req: &Request) -> &'static str {
    match req {
        Request::Acquire { .. } => "acquire",
        Request::Check { .. } => "check",
        Request::Release { .. } => "release",
        Request::Status => "status",
        Request::Gc { .. } => "gc",
    }
}

impl Service for Dhcp {
    const NAME: &'static str = "dhcp";
    type Request = Request;
    type Response = Response;
    type Error = Error;

    fn op(req: &Request) -> &'static str {
        op_name(req)
    }

    fn permit(&self, peer: &Peer, req: &Request) -> Result<(), Refusal<Error>> {
        if matches!(req, Request::Status) {
            return Ok(());
        }
        let op = op_name(req);
        let forbidden = |why: String| {
            Refusal::Failed(
                FORBIDDEN,
                Error::new(ErrorKind::Forbidden, format!("dhcp.{op} refused: {why}")),
            )
        };
        if !peer.net_admin() {
            return Err(forbidden(format!("the caller (uid {}) is not root with CAP_NET_ADMIN; only such a caller may have the daemon act in a pod's network namespace", peer.uid)));
        }
        let here = Peer::netns_of_this_thread()
            .map_err(|e| forbidden(format!("cannot read the daemon's network namespace: {e}")))?;
        if peer.netns != Some(here) {
            return Err(forbidden(
                "the caller is not in the daemon's network namespace".into(),
            ));
        }
        Ok(())
    }

    fn handle(&self, req: Request) -> Result<Response, Refusal<Error>> {
        let out = match req {
            Request::Acquire {
                attachment,
                netns,
                options,
            } => validate(&attachment, Some(&netns))
                .and_then(|()| self.acquire(attachment, netns, options)),
            Request::Check { attachment } => {
                validate(&attachment, None).and_then(|()| self.check(&attachment))
            }
            Request::Release { attachment } => self.release(&attachment),
            Request::Status => Ok(Response::Done),
            Request::Gc { network, valid } => self.gc(&network, &valid),
        };
        out.map_err(|e| {
            let status = match e.kind {
                ErrorKind::Invalid => 400,
                ErrorKind::Forbidden => FORBIDDEN,
                _ => 500,
            };
            Refusal::Failed(status, e)
        })
    }

    fn malformed(message: String) -> Error {
        Error::new(ErrorKind::Invalid, message)
    }
}

/// The names the daemon acts on: the attachment's, and an absolute netns path (the
/// daemon's working directory is not the plugin's).
fn validate(a: &Attachment, netns: Option<&Path>) -> Result<(), Error> {
    a.validate()
        .map_err(|e| Error::new(ErrorKind::Invalid, e.to_string()))?;
    if let Some(p) = netns {
        if !p.is_absolute() {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("netns {} is not an absolute path", p.display()),
            ));
        }
    }
    Ok(())
}
