//! Failures of netlink and namespace operations, for every protocol family:
//! one errno table, one message format ("<operation>: <strerror> (<kernel
//! text>)"). A request first fails as a [`Failure`] (what the kernel or the
//! socket said); the caller names the operation with [`Failure::context`].

use std::fmt;
use std::io;

/// What went wrong, in terms a caller can act on (e.g. DEL treats `NotFound`
/// as done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object does not exist (ENODEV, ENOENT, ESRCH, EADDRNOTAVAIL).
    NotFound,
    /// The network namespace path does not exist or is not a netns.
    NetnsNotFound,
    /// EEXIST on a create.
    AlreadyExists,
    /// The kernel lacks the protocol, family, link kind or feature
    /// (EOPNOTSUPP, EAFNOSUPPORT, EPROTONOSUPPORT, or "Unknown device type").
    Unsupported,
    /// Anything else from the kernel or the system.
    Other,
}

/// A kernel or system failure with the operation that caused it, e.g.
/// "create veth veth1a2b3c4d (peer eth0 in netns /run/netns/x): File exists".
#[derive(Debug, Clone)]
pub struct Error {
    pub kind: ErrorKind,
    /// Human readable description of the operation and its cause.
    pub message: String,
    /// Raw errno when the error came from the kernel.
    pub errno: Option<i32>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            errno: None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self.kind, ErrorKind::NotFound | ErrorKind::NetnsNotFound)
    }

    /// `"<context>: <strerror>"` with the kind derived from the errno.
    pub(crate) fn from_errno(errno: i32, context: &str) -> Self {
        Error {
            kind: kind_for_errno(errno),
            message: format!("{context}: {}", strerror(errno)),
            errno: Some(errno),
        }
    }

    /// A failed system call (open, setns, socket I/O) on `context`.
    pub(crate) fn io(context: &str, err: &io::Error) -> Self {
        match err.raw_os_error() {
            Some(errno) => Error::from_errno(errno, context),
            None => Error::new(ErrorKind::Other, format!("{context}: {err}")),
        }
    }
}

/// The errno → kind table of every netlink and file operation.
fn kind_for_errno(errno: i32) -> ErrorKind {
    match errno {
        libc::EEXIST => ErrorKind::AlreadyExists,
        libc::ENODEV | libc::ENOENT | libc::ESRCH | libc::EADDRNOTAVAIL => ErrorKind::NotFound,
        libc::EOPNOTSUPP | libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT => ErrorKind::Unsupported,
        _ => ErrorKind::Other,
    }
}

/// The libc text for an errno without std's " (os error N)" suffix, so messages
/// read like `ip`'s ("File exists").
fn strerror(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    let suffix = format!(" (os error {errno})");
    match text.strip_suffix(&suffix) {
        Some(stripped) => stripped.to_string(),
        None => text,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// A request failure before an operation name is attached.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The kernel answered with -errno, plus its extended-ack text if any.
    Kernel {
        errno: i32,
        extack: Option<String>,
    },
    /// Sending or receiving failed; `socket` names the protocol family.
    Io {
        socket: &'static str,
        err: io::Error,
    },
    Decode(String),
}

impl Failure {
    /// The kernel's answer; socket I/O errors deliberately have none so that
    /// callers' "EEXIST is fine" / "ENOENT means absent" checks only ever
    /// look at what the kernel said about the object.
    pub(crate) fn errno(&self) -> Option<i32> {
        match self {
            Failure::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// The OS error of a failed send or receive (ENOBUFS: a multicast
    /// reader's events were dropped; EAGAIN: a receive timed out).
    pub(crate) fn io_errno(&self) -> Option<i32> {
        match self {
            Failure::Io { err, .. } => err.raw_os_error(),
            _ => None,
        }
    }

    pub(crate) fn extack(&self) -> Option<&str> {
        match self {
            Failure::Kernel { extack, .. } => extack.as_deref(),
            _ => None,
        }
    }

    /// Names the operation: "create veth a (peer b): File exists (kernel text)".
    pub(crate) fn context(self, what: &str) -> Error {
        match self {
            Failure::Kernel { errno, extack } => {
                let mut e = Error::from_errno(errno, what);
                if let Some(text) = extack {
                    e.message = format!("{} ({text})", e.message);
                }
                e
            }
            Failure::Io { socket, err } => Error::io(&format!("{what}: {socket} socket"), &err),
            Failure::Decode(msg) => Error::new(
                ErrorKind::Other,
                format!("{what}: cannot decode kernel reply: {msg}"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_table() {
        let e = Error::from_errno(libc::EEXIST, "create veth a");
        assert_eq!(e.kind, ErrorKind::AlreadyExists);
        assert_eq!(e.message, "create veth a: File exists");
        assert_eq!(e.errno, Some(libc::EEXIST));
        for (errno, kind) in [
            (libc::ESRCH, ErrorKind::NotFound),
            (libc::ENOENT, ErrorKind::NotFound),
            (libc::EOPNOTSUPP, ErrorKind::Unsupported),
            (libc::EPROTONOSUPPORT, ErrorKind::Unsupported),
            (libc::EAFNOSUPPORT, ErrorKind::Unsupported),
            (libc::EPERM, ErrorKind::Other),
        ] {
            assert_eq!(Error::from_errno(errno, "x").kind, kind, "errno {errno}");
        }
    }

    #[test]
    fn context_names_the_operation_and_keeps_the_kernel_text() {
        let f = Failure::Kernel {
            errno: libc::EINVAL,
            extack: Some("Unknown device type".into()),
        };
        assert_eq!(
            f.context("create macvlan m").message,
            "create macvlan m: Invalid argument (Unknown device type)"
        );
        let f = Failure::Io {
            socket: "netfilter netlink",
            err: io::Error::from_raw_os_error(libc::ENOBUFS),
        };
        assert_eq!(f.errno(), None);
        let e = f.context("add elements to set pm4-any");
        assert_eq!(
            e.message,
            "add elements to set pm4-any: netfilter netlink socket: No buffer space available"
        );
        assert_eq!(e.errno, Some(libc::ENOBUFS));
    }
}
