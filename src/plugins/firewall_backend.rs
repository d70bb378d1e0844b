//! Where a plugin's firewall requests go. The protocol core knows nothing of
//! the firewall: each plugin that has firewall work holds one of these and
//! asks it for a backend once per call.

use crate::cni::Request;
use crate::firewall::{Firewall, Sockets, ViaDaemon};
use crate::netlink::linger::DeferredClose;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug)]
pub struct FirewallBackend(Choice);

#[derive(Debug)]
enum Choice {
    /// The daemon when it serves the request, this process otherwise, on
    /// sockets that go to this `DeferredClose` when the call is done.
    DaemonOrHere(DeferredClose),
    /// Always this one.
    #[cfg(test)]
    Fixed(Arc<dyn Firewall>),
}

impl FirewallBackend {
    /// The daemon at the configured socket when it serves the request, this
    /// process otherwise. The netfilter sockets this process opens then go to
    /// `sockets_closed_after_reply`, as their close can hold up the plugin's
    /// exit (`netlink::linger` says why).
    pub fn daemon_or_here(sockets_closed_after_reply: DeferredClose) -> FirewallBackend {
        FirewallBackend(Choice::DaemonOrHere(sockets_closed_after_reply))
    }

    /// Always `firewall` (unit tests record the requests instead).
    #[cfg(test)]
    pub fn fixed(firewall: Arc<dyn Firewall>) -> FirewallBackend {
        FirewallBackend(Choice::Fixed(firewall))
    }

    /// The backend of one call. Kept for the whole call: it holds the netfilter
    /// sockets it opened.
    pub fn for_call(&self, req: &Request, conf: &impl FirewallConf) -> Arc<dyn Firewall> {
        match &self.0 {
            #[cfg(test)]
            Choice::Fixed(fixed) => Arc::clone(fixed),
            Choice::DaemonOrHere(deferred) => Arc::new(ViaDaemon::new(
                conf.daemon_socket().unwrap_or(&req.ctx.daemon_socket),
                Sockets::closed_after_reply(deferred.clone()),
            )),
        }
    }
}

/// The configuration of a plugin with firewall work.
pub trait FirewallConf {
    /// `daemonSocket`: the ipamd daemon that applies the firewall changes, when it
    /// is not the runner's default.
    fn daemon_socket(&self) -> Option<&Path>;
}

/// A request as the runner would build it, for plugins' unit tests: the
/// container `c1` on `eth0` in netns `/run/netns/x`, `conf` on stdin.
#[cfg(test)]
pub fn test_request(command: crate::cni::Command, conf: serde_json::Value) -> Request {
    Request::for_test(command, &conf.to_string(), "")
}
