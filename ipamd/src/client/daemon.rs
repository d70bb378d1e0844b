//! The connection to a daemon, shared by the lease client and the callers of hosted services,
//! and the one rule for when the caller does the work itself instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::http::{self, Transport};
use crate::log::Level;
use crate::log_at;
use crate::service::{self, Service, DECLINED};

/// A daemon at a socket, with the timeouts of every call to it.
#[derive(Debug, Clone)]
pub struct Daemon {
    socket: PathBuf,
    connect_timeout: Duration,
    io_timeout: Duration,
}

/// What came of a call.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The daemon answered; the status may be an error of the request itself.
    Answered { status: u16, body: Vec<u8> },
    /// The daemon did not serve the request: do it in-process (see [`Daemon::send`]).
    Local(String),
    /// Neither: the daemon is there but could not be used, and that is the caller's error.
    Failed(String),
}

impl Daemon {
    pub fn new(socket: &Path) -> Daemon {
        Daemon {
            socket: socket.to_path_buf(),
            connect_timeout: Duration::from_secs(2),
            // Long enough for a socket-activated daemon to start and load its stores.
            io_timeout: Duration::from_secs(15),
        }
    }

    pub fn with_timeouts(mut self, connect: Duration, io: Duration) -> Daemon {
        self.connect_timeout = connect;
        self.io_timeout = io;
        self
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// One request. The fallback policy, for every caller: the work is done in-process
    /// ([`Outcome::Local`]) exactly when the daemon did not serve the request —
    /// - nothing listens on the socket (no file, connection refused);
    /// - the daemon accepted and then died or stopped answering mid-request;
    /// - it answered 421 ([`DECLINED`]): not this daemon's to do (a service it does not
    ///   host, a caller in another network namespace, a caller the service leaves to do it
    ///   itself).
    ///
    /// Every operation behind a daemon is idempotent and serialised by its own lock, so doing
    /// it again in-process after a daemon died is safe. Any other answer, including the
    /// daemon's refusal of the peer (403), is the request's result; a socket that exists
    /// but cannot be used (permissions, a garbled response) is [`Outcome::Failed`].
    pub fn send(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Outcome {
        let resp = http::request_with(
            &self.socket,
            method,
            target,
            headers,
            body,
            self.connect_timeout,
            self.io_timeout,
        );
        match resp {
            Ok(r) if r.status == DECLINED => {
                let why = format!(
                    "ipamd at {} declined {target}: {}",
                    self.socket.display(),
                    String::from_utf8_lossy(&r.body).trim()
                );
                log_at!(Level::Debug, "{why}; doing it in-process");
                Outcome::Local(why)
            }
            Ok(r) => Outcome::Answered {
                status: r.status,
                body: r.body,
            },
            Err(Transport::NoDaemon(why)) => {
                log_at!(Level::Debug, "{why}; doing {target} in-process");
                Outcome::Local(why)
            }
            Err(Transport::Died(why)) => {
                log_at!(Level::Warn, "{why}; retrying {target} in-process");
                Outcome::Local(why)
            }
            Err(Transport::Failed(why)) => Outcome::Failed(why),
        }
    }

    /// A request to hosted service `S`: `None` when the caller is to do it itself (the
    /// policy of [`Daemon::send`]), else the service's answer. An error answer whose body
    /// is not an `S::Error` comes back as [`Failure::Other`].
    pub fn call<S: Service>(
        &self,
        req: &S::Request,
    ) -> Option<Result<S::Response, Failure<S::Error>>> {
        let target = service::target::<S>(req);
        let body = match serde_json::to_vec(req) {
            Ok(b) => b,
            Err(e) => return Some(Err(Failure::Other(format!("{target}: {e}")))),
        };
        match self.send("POST", &target, &[], Some(&body)) {
            Outcome::Local(_) => None,
            Outcome::Failed(why) => Some(Err(Failure::Other(why))),
            Outcome::Answered { status, body } if (200..300).contains(&status) => {
                Some(serde_json::from_slice(&body).map_err(|e| {
                    Failure::Other(format!("ipamd sent an unreadable answer to {target}: {e}"))
                }))
            }
            Outcome::Answered { status, body } => {
                Some(Err(match serde_json::from_slice::<S::Error>(&body) {
                    Ok(e) => Failure::Service(e),
                    Err(_) => Failure::Other(format!(
                        "{target}: ipamd at {} answered {status}: {}",
                        self.socket.display(),
                        String::from_utf8_lossy(&body).trim()
                    )),
                }))
            }
        }
    }
}

/// A service call that failed.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure<E> {
    /// The service's own error.
    Service(E),
    /// The daemon could not be used, or answered something else than the service's error.
    Other(String),
}
