//! Typed services the daemon hosts besides the lease API, e.g. cnikit's firewall.
//!
//! A service is served under `POST /v1/ext/<name>.<op>`: `<name>` picks the service in the
//! [`Services`] registry, the body is the service's [`Service::Request`] and `<op>` must be
//! what [`Service::op`] names for it (it labels the metrics). The service decides who may
//! use it ([`Service::permit`]) and answers with its own response and error types. The
//! server only routes: it knows no service by name.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use crate::peer::Peer;

/// Status of a refusal that sends the caller back to doing the work itself (see the
/// client's fallback policy in `client/daemon.rs`).
pub const DECLINED: u16 = 421;

/// Why a service did not do a request.
#[derive(Debug)]
pub enum Refusal<E> {
    /// Not this daemon's to do (e.g. the caller lives in another network namespace): the
    /// caller does it itself, as when no daemon listens. Answered with [`DECLINED`].
    Declined(E),
    /// The request failed; answered with this HTTP status and the error as the body.
    Failed(u16, E),
}

pub trait Service: Send + Sync + 'static {
    /// The `<name>` of `/v1/ext/<name>.<op>`.
    const NAME: &'static str;
    type Request: Serialize + DeserializeOwned + Send + 'static;
    type Response: Serialize + DeserializeOwned;
    type Error: Serialize + DeserializeOwned;

    /// The `<op>` a request travels under.
    fn op(req: &Self::Request) -> &'static str;

    /// Whether `peer` may have `req` done. Every peer reaching a service already passed the
    /// daemon's own gate (root or the allowed group).
    fn permit(&self, peer: &Peer, req: &Self::Request) -> Result<(), Refusal<Self::Error>>;

    /// Does the request, on a blocking thread.
    fn handle(&self, req: Self::Request) -> Result<Self::Response, Refusal<Self::Error>>;

    /// A service error for a request that could not be read.
    fn malformed(message: String) -> Self::Error;
}

/// The target a request of `S` is sent to.
pub fn target<S: Service>(req: &S::Request) -> String {
    format!("/v1/ext/{}.{}", S::NAME, S::op(req))
}

/// What the server makes of one call: status, JSON body, metrics outcome.
pub(crate) struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    pub outcome: &'static str,
}

/// A service with its types erased to bytes, for the registry.
trait Hosted: Send + Sync {
    fn call(&self, op: &str, peer: &Peer, body: &[u8]) -> Answer;
}

struct Host<S>(S);

impl<S: Service> Hosted for Host<S> {
    fn call(&self, op: &str, peer: &Peer, body: &[u8]) -> Answer {
        let refused = |r: Refusal<S::Error>| {
            let (status, e, outcome) = match r {
                Refusal::Declined(e) => (DECLINED, e, "declined"),
                Refusal::Failed(status, e) => (status, e, "error"),
            };
            Answer {
                status,
                body: serde_json::to_vec(&e).unwrap_or_default(),
                outcome,
            }
        };
        let invalid = |msg: String| Answer {
            outcome: "invalid",
            ..refused(Refusal::Failed(400, S::malformed(msg)))
        };
        let req = match decode::<S>(op, body) {
            Ok(r) => r,
            Err(msg) => return invalid(msg),
        };
        if let Err(r) = self.0.permit(peer, &req) {
            return refused(r);
        }
        match self.0.handle(req) {
            Ok(resp) => Answer {
                status: 200,
                body: serde_json::to_vec(&resp).unwrap_or_default(),
                outcome: "ok",
            },
            Err(r) => refused(r),
        }
    }
}

/// The request of `S` in `body`, which must be one that travels under `op`; the message
/// says why not. Everything the server does with the bytes before the service's permission
/// check (and what the `daemon_request` fuzz target runs).
pub(crate) fn decode<S: Service>(op: &str, body: &[u8]) -> Result<S::Request, String> {
    let req: S::Request =
        serde_json::from_slice(body).map_err(|e| format!("{op}: malformed request: {e}"))?;
    if S::op(&req) != op {
        return Err(format!("{op}: the body holds {}", S::op(&req)));
    }
    Ok(req)
}

/// The services a daemon hosts, by name.
#[derive(Clone, Default)]
pub struct Services(BTreeMap<&'static str, Arc<dyn Hosted>>);

impl Services {
    pub fn new() -> Services {
        Services::default()
    }

    /// Hosts `service` under its name (replacing one of the same name).
    pub fn with<S: Service>(mut self, service: S) -> Services {
        self.0.insert(S::NAME, Arc::new(Host(service)));
        self
    }

    /// Whether `target` (`<name>.<op>`) names a hosted service.
    pub(crate) fn hosts(&self, target: &str) -> bool {
        self.split(target).is_some()
    }

    fn split<'a>(&self, target: &'a str) -> Option<(&Arc<dyn Hosted>, &'a str)> {
        let (name, op) = target.split_once('.')?;
        Some((self.0.get(name)?, op))
    }

    /// Runs the call (on the caller's thread: the server calls this on a blocking one).
    pub(crate) fn call(&self, target: &str, peer: &Peer, body: &[u8]) -> Option<Answer> {
        let (service, op) = self.split(target)?;
        Some(service.call(op, peer, body))
    }
}

impl fmt::Debug for Services {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}
