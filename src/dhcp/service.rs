//! The daemon's `dhcp` service (`POST /v1/ext/dhcp.<op>`): the `dhcp` plugin's requests,
//! done on the leases the daemon keeps.
//!
//! Who may ask: only root with CAP_NET_ADMIN in the daemon's user namespace, from the
//! daemon's network namespace — what the kernel says of the peer, never what the request
//! claims. Acting in a pod's netns is acting as its administrator; a caller without that
//! power could not do it itself, so the daemon does not do it for them. STATUS (whether
//! the daemon answers) is open to every peer the daemon's own gate lets in.

use super::keep::{HeldLease, Keeper};
use super::lease::{self, Phase, Terms};
use super::lease_files::{LeaseFiles, Record};
use super::maintain::Held;
use super::options::ClientOptions;
use super::v6::lease::{Record6, Terms6};
use super::v6::maintain::Held6;
use super::{Error, ErrorKind, Timing};
use ipamd::attachment::Attachment;
use ipamd::log::Level;
use ipamd::log_at;
use ipamd::service::{Endpoint, Peer, Refusal, Service};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

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
        /// Which families to lease (absent: IPv4 only, as every plugin before DHCPv6).
        #[serde(default)]
        families: Families,
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

/// The address families a pod's leases are for (`ipam.ipv4`, `ipam.ipv6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Families {
    pub v4: bool,
    pub v6: bool,
}

impl Default for Families {
    /// The reference's: IPv4 only.
    fn default() -> Self {
        Families {
            v4: true,
            v6: false,
        }
    }
}

/// The answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Response {
    /// The lease, for the plugin's result.
    Granted {
        /// The DHCPv4 lease (absent for an IPv6-only pod). Boxed: the other answers
        /// are a word.
        terms: Option<Box<Terms>>,
        /// The DHCPv6 lease, when asked for.
        #[serde(default)]
        terms6: Option<Box<Terms6>>,
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
    slots: Mutex<HashMap<Attachment, Arc<Mutex<Slot>>>>,
}

/// An attachment's leases: one per family at most.
#[derive(Default)]
struct Slot {
    v4: Option<Held>,
    v6: Option<Held6>,
}

impl Slot {
    fn release(&mut self) {
        if let Some(h) = self.v4.take() {
            h.release();
        }
        if let Some(h) = self.v6.take() {
            h.release();
        }
    }
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
        let (records, bad) = files.load::<Record>()?;
        let (records6, bad6) = files.load::<Record6>()?;
        for b in bad.iter().chain(&bad6) {
            log_at!(Level::Error, "dhcp: skipping {b}");
        }
        let mut slots: HashMap<Attachment, Slot> = HashMap::new();
        let mut resumed = 0;
        for record in records {
            match record.ack() {
                Ok(ack) => {
                    let key = record.attachment.clone();
                    slots.entry(key).or_default().v4 =
                        Some(Held::resume(keeper.clone(), record, ack));
                    resumed += 1;
                }
                Err(e) => log_at!(Level::Error, "dhcp: lease of {:?}: {e}", record.attachment),
            }
        }
        for record in records6 {
            let key = record.attachment.clone();
            match Held6::resume(keeper.clone(), record) {
                Ok(held) => {
                    slots.entry(key).or_default().v6 = Some(held);
                    resumed += 1;
                }
                Err(e) => log_at!(Level::Error, "dhcp: DHCPv6 lease of {key:?}: {e}"),
            }
        }
        log_at!(
            Level::Info,
            "dhcp: resumed {resumed} lease(s) from {}",
            files.dir().display()
        );
        let slots = slots
            .into_iter()
            .map(|(k, v)| (k, Arc::new(Mutex::new(v))))
            .collect();
        Ok(Dhcp {
            keeper,
            slots: Mutex::new(slots),
        })
    }

    fn slot(&self, key: &Attachment) -> Arc<Mutex<Slot>> {
        let mut slots = lock(&self.slots);
        Arc::clone(slots.entry(key.clone()).or_default())
    }

    fn acquire(
        &self,
        attachment: Attachment,
        netns: PathBuf,
        options: ClientOptions,
        families: Families,
    ) -> Result<Response, Error> {
        if !families.v4 && !families.v6 {
            return Err(Error::new(
                ErrorKind::Invalid,
                "neither IPv4 nor IPv6 asked for: set \"ipv4\" or \"ipv6\" to true",
            ));
        }
        let slot = self.slot(&attachment);
        let mut held = lock(&slot);
        // ADD again for the same pod (a runtime retrying): the leases it holds.
        if let Some(again) = self.held_terms(&held, &netns, &options, families) {
            return Ok(again);
        }
        held.release();
        let k = &self.keeper;
        let (a, n, o) = (&attachment, &netns, &options);
        // Both families at once: the IPv6 side may wait for the link-local address.
        let (r4, r6) = std::thread::scope(|scope| {
            let v6 = families
                .v6
                .then(|| scope.spawn(|| super::v6::service::acquire(k, a, n, o)));
            let r4 = families.v4.then(|| Held::acquire(k, a, n, o)).transpose();
            let r6 = match v6 {
                Some(t) => t
                    .join()
                    .unwrap_or_else(|_| {
                        Err(Error::new(ErrorKind::Io, "the DHCPv6 client panicked"))
                    })
                    .map(Some),
                None => Ok(None),
            };
            (r4, r6)
        });
        // All or nothing: a family that failed takes the other's new lease back.
        let (l4, l6) = match (r4, r6) {
            (Ok(l4), Ok(l6)) => (l4, l6),
            (r4, r6) => {
                let e = [r4.as_ref().err(), r6.as_ref().err()]
                    .into_iter()
                    .flatten()
                    .next()
                    .cloned();
                if let Ok(Some((_, h))) = r4 {
                    h.release();
                }
                if let Ok(Some((_, h))) = r6 {
                    h.release();
                }
                return Err(e.unwrap_or_else(|| Error::new(ErrorKind::Io, "no lease")));
            }
        };
        let terms = l4.as_ref().map(|(t, _)| Box::new(t.clone()));
        let terms6 = l6.as_ref().map(|(t, _)| Box::new(t.clone()));
        held.v4 = l4.map(|(_, h)| h);
        held.v6 = l6.map(|(_, h)| h);
        Ok(Response::Granted { terms, terms6 })
    }

    /// The terms of the leases `slot` holds for exactly this request, if it does.
    fn held_terms(
        &self,
        slot: &Slot,
        netns: &Path,
        options: &ClientOptions,
        families: Families,
    ) -> Option<Response> {
        let live = |at: &Path, phase: Phase| {
            at == netns && phase != Phase::Ended && phase != Phase::Expired
        };
        let terms = match (&slot.v4, families.v4) {
            (Some(h), true) => {
                let (ack, at, phase) = h.current();
                if !live(&at, phase) || h.options() != *options {
                    return None;
                }
                Some(Box::new(lease::terms(&ack).ok()?))
            }
            (None, false) => None,
            _ => return None,
        };
        let terms6 = match (&slot.v6, families.v6) {
            (Some(h), true) => {
                let (t, at, phase) = h.current();
                if !live(&at, phase) {
                    return None;
                }
                Some(Box::new(t.ok()?))
            }
            (None, false) => None,
            _ => return None,
        };
        Some(Response::Granted { terms, terms6 })
    }

    fn check(&self, attachment: &Attachment) -> Result<Response, Error> {
        let slot = self.slot(attachment);
        let held = lock(&slot);
        if held.v4.is_none() && held.v6.is_none() {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "the DHCP daemon holds no lease for container {} interface {}",
                    attachment.container_id, attachment.ifname
                ),
            ));
        }
        let leases: [Option<&dyn HeldLease>; 2] = [
            held.v4.as_ref().map(|h| h as &dyn HeldLease),
            held.v6.as_ref().map(|h| h as &dyn HeldLease),
        ];
        for lease in leases.into_iter().flatten() {
            lease.check_in_force(&attachment.ifname)?;
        }
        Ok(Response::Done)
    }

    fn release(&self, attachment: &Attachment) -> Result<Response, Error> {
        let slot = self.slot(attachment);
        let mut taken = std::mem::take(&mut *lock(&slot));
        // No lease kept: a record may still be there (a resume that failed).
        if taken.v4.is_none() {
            self.keeper.files.remove::<Record>(attachment)?;
        }
        if taken.v6.is_none() {
            self.keeper.files.remove::<Record6>(attachment)?;
        }
        taken.release();
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Endpoint for Request {
    const SERVICE: &'static str = "dhcp";
    fn op(&self) -> &'static str {
        match self {
            Request::Acquire { .. } => "acquire",
            Request::Check { .. } => "check",
            Request::Release { .. } => "release",
            Request::Status => "status",
            Request::Gc { .. } => "gc",
        }
    }
}

impl Service for Dhcp {
    type Request = Request;
    type Response = Response;
    type Error = Error;

    fn permit(&self, peer: &Peer, req: &Request) -> Result<(), Refusal<Error>> {
        if matches!(req, Request::Status) {
            return Ok(());
        }
        let op = req.op();
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
                families,
            } => validate(&attachment, Some(&netns))
                .and_then(|()| self.acquire(attachment, netns, options, families)),
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
