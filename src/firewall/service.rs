//! The firewall as a service of the ipamd daemon (`cnikit ipamd daemon`
//! hosts it; `backend::ViaDaemon` calls it).
//!
//! Why: when any process closes a netfilter netlink socket, the kernel takes
//! the nftables commit mutex and, if a recent batch deleted something, waits
//! for an RCU grace period (≈10 ms) under it (`nft_rcv_nl_event`,
//! NETLINK_URELEASE). Every short-lived plugin process closes its socket at
//! exit, so under pod churn every process waits its turn for those 10 ms.
//! The daemon is long-lived and never closes its socket.

use super::request::Request;
use super::{Error, ErrorKind, Sockets};
use ipamd::service::{Endpoint, Peer, Refusal, Service, DECLINED};
use serde::{Deserialize, Serialize};

/// What travels: the request, and the network namespace the caller says it
/// is in. That claim is only a label for logs: whom the daemon serves is
/// decided from what the kernel says of the peer (`permit`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub netns: u64,
    pub request: Request,
}

/// The answer of a request that was done: `{}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {}

/// The service, with the netfilter sockets it keeps open while the daemon runs.
#[derive(Debug, Default)]
pub struct Firewall {
    sockets: Sockets,
}

/// The status of a refusal of the peer (as the daemon's own gate answers).
pub const FORBIDDEN: u16 = 403;
const _: () = assert!(FORBIDDEN != DECLINED);

impl Endpoint for Envelope {
    const SERVICE: &'static str = "firewall";
    fn op(&self) -> &'static str {
        self.request.name()
    }
}

impl Service for Firewall {
    type Request = Envelope;
    type Response = Done;
    type Error = Error;

    /// Who gets what, from the kernel's view of the peer (`ipamd::peer`):
    /// - a peer in another network namespace, or of unknown one: declined
    ///   (421). Its request is about its own namespace's firewall, which the
    ///   daemon's socket does not reach; it does the work itself, with its
    ///   own privileges, and nothing is applied in the daemon's namespace.
    /// - a peer in the daemon's namespace without an effective CAP_NET_ADMIN
    ///   in the daemon's user namespace (e.g. root that dropped it): refused
    ///   (403). It could not change this firewall itself, so the daemon does
    ///   not do it for it, and its fallback would fail anyway.
    /// - root with CAP_NET_ADMIN in the daemon's namespace: served.
    /// - anyone else with the capability: declined; it can do it itself.
    fn permit(&self, peer: &Peer, req: &Envelope) -> Result<(), Refusal<Error>> {
        let op = req.request.name();
        let here = Peer::netns_of_this_thread().map_err(|e| {
            let msg = format!("firewall.{op}: cannot read the daemon's network namespace: {e}");
            Refusal::Failed(500, Error::new(ErrorKind::Other, msg))
        })?;
        if peer.netns != Some(here) {
            let msg = format!(
                "firewall.{op}: the caller is not in the daemon's network namespace; it does it itself"
            );
            return Err(Refusal::Declined(Error::new(ErrorKind::Other, msg)));
        }
        if !peer.cap_net_admin {
            let msg = format!(
                "firewall.{op}: refused: the caller (uid {}) has no effective CAP_NET_ADMIN",
                peer.uid
            );
            return Err(Refusal::Failed(
                FORBIDDEN,
                Error::new(ErrorKind::Other, msg),
            ));
        }
        if peer.uid != 0 {
            let msg = format!("firewall.{op}: served to root only; the caller does it itself");
            return Err(Refusal::Declined(Error::new(ErrorKind::Other, msg)));
        }
        Ok(())
    }

    fn handle(&self, req: Envelope) -> Result<Done, Refusal<Error>> {
        req.request
            .run(&self.sockets)
            .map(|()| Done {})
            .map_err(|e| {
                let status = match e.kind {
                    ErrorKind::Conflict => 409,
                    ErrorKind::Mismatch => 422,
                    ErrorKind::Unsupported => 501,
                    ErrorKind::Other => 500,
                };
                Refusal::Failed(status, e)
            })
    }

    fn malformed(message: String) -> Error {
        Error::new(ErrorKind::Other, message)
    }
}
