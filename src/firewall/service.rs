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
use super::socket::current_netns;
use super::{Error, ErrorKind};
use ipamd::service::{Peer, Refusal, Service};
use serde::{Deserialize, Serialize};

/// What travels: the request and the caller's network namespace (the daemon
/// declines requests meant for another one).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub netns: u64,
    pub request: Request,
}

/// The answer of a request that was done: `{}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {}

pub struct Firewall;

impl Service for Firewall {
    const NAME: &'static str = "firewall";
    type Request = Envelope;
    type Response = Done;
    type Error = Error;

    fn op(req: &Envelope) -> &'static str {
        req.request.name()
    }

    /// Root only (the firewall is the host's), and only for callers in the
    /// daemon's own network namespace as they say; others do it themselves.
    fn permit(&self, peer: &Peer, req: &Envelope) -> Result<(), Refusal<Error>> {
        let op = req.request.name();
        if peer.uid != 0 {
            let msg = format!("firewall.{op}: served to root only; the caller does it itself");
            return Err(Refusal::Declined(Error::new(ErrorKind::Other, msg)));
        }
        let here = current_netns().map_err(|e| Refusal::Failed(500, e))?;
        if req.netns != here {
            let msg = format!(
                "firewall.{op}: the caller's network namespace is not the daemon's; the caller does it itself"
            );
            return Err(Refusal::Declined(Error::new(ErrorKind::Other, msg)));
        }
        Ok(())
    }

    fn handle(&self, req: Envelope) -> Result<Done, Refusal<Error>> {
        req.request.run().map(|()| Done {}).map_err(|e| {
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
