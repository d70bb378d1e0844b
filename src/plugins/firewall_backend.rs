//! Where a plugin's firewall requests go. The protocol core knows nothing of
//! the firewall: each plugin that has firewall work holds one of these and
//! asks it for a backend once per call.

use crate::cni::Request;
use crate::firewall::{Firewall, ViaDaemon};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug)]
pub struct FirewallBackend(Option<Arc<dyn Firewall>>);

impl FirewallBackend {
    /// The daemon at the configured socket when it serves the request, this
    /// process otherwise.
    pub const DAEMON_OR_HERE: FirewallBackend = FirewallBackend(None);

    /// Always `firewall` (unit tests record the requests instead).
    #[cfg(test)]
    pub fn fixed(firewall: Arc<dyn Firewall>) -> FirewallBackend {
        FirewallBackend(Some(firewall))
    }

    /// The backend of one call. Kept for the whole call: it holds the netfilter
    /// sockets it opened.
    pub fn for_call(&self, req: &Request, conf: &impl FirewallConf) -> Arc<dyn Firewall> {
        match &self.0 {
            Some(fixed) => Arc::clone(fixed),
            None => Arc::new(ViaDaemon::new(
                conf.daemon_socket().unwrap_or(&req.ctx.daemon_socket),
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
    use crate::cni::{args::CniArgs, config::NetConf, env::Env, Context};
    Request {
        env: Env {
            command,
            container_id: "c1".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            args: String::new(),
            path: Vec::new(),
        },
        conf: NetConf::parse(conf.to_string().into_bytes()).expect("test config"),
        args: CniArgs::default(),
        ctx: Context::without_builtins(),
    }
}
