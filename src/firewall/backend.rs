//! Where firewall requests are done, chosen once per plugin call: in this
//! process, or by the ipamd daemon when one serves them (`service.rs` says
//! why). Falling back to in-process is safe because every operation is
//! idempotent; when that happens is `ipamd::client::Daemon::send`'s policy.

use super::request::Request;
use super::service::{self, Envelope};
use super::{Error, ErrorKind, Result, Sockets};
use crate::netlink::NetNs;
use ipamd::client::{Daemon, Failure};
use std::fmt;
use std::path::{Path, PathBuf};

/// Does firewall requests.
pub trait Firewall: fmt::Debug + Send + Sync {
    fn apply(&self, req: Request) -> Result<()>;
}

/// Does the work in this process, on sockets that stay open as long as it
/// lives (`socket.rs` says why).
#[derive(Debug, Default)]
pub struct InProcess {
    sockets: Sockets,
}

impl Firewall for InProcess {
    fn apply(&self, req: Request) -> Result<()> {
        req.run(&self.sockets)
    }
}

/// The daemon at `socket` when it serves the request, else in-process.
#[derive(Debug)]
pub struct ViaDaemon {
    socket: PathBuf,
    here: InProcess,
}

impl ViaDaemon {
    pub fn new(socket: &Path) -> ViaDaemon {
        ViaDaemon {
            socket: socket.to_path_buf(),
            here: InProcess::default(),
        }
    }
}

impl Firewall for ViaDaemon {
    fn apply(&self, request: Request) -> Result<()> {
        // Without our own netns id the daemon cannot tell whether it may serve us.
        let Ok(netns) = NetNs::current_id() else {
            return self.here.apply(request);
        };
        let op = request.name();
        let env = Envelope { netns, request };
        match Daemon::new(&self.socket).call::<service::Firewall>(&env) {
            None => self.here.apply(env.request),
            Some(Ok(_)) => Ok(()),
            Some(Err(Failure::Service(e))) => Err(e),
            Some(Err(Failure::Other(msg))) => Err(Error::new(
                ErrorKind::Other,
                format!("firewall.{op}: {msg}"),
            )),
        }
    }
}

/// Records the requests instead of doing them (unit tests of the plugins'
/// firewall logic need no root and no kernel).
#[derive(Debug, Default)]
pub struct Recording {
    pub requests: std::sync::Mutex<Vec<Request>>,
    /// When set, every request fails with this error.
    pub fail_with: Option<Error>,
}

impl Recording {
    pub fn taken(&self) -> Vec<Request> {
        std::mem::take(&mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Firewall for Recording {
    fn apply(&self, req: Request) -> Result<()> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(req);
        match &self.fail_with {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}
