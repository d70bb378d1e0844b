use std::fmt;
use std::io;

/// What went wrong, in terms a plugin can act on (e.g. DEL treats `NotFound` as done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The link / address / route does not exist (ENODEV, ENOENT, ESRCH, EADDRNOTAVAIL).
    NotFound,
    /// The network namespace path does not exist or is not a netns.
    NetnsNotFound,
    /// EEXIST on a create.
    AlreadyExists,
    /// The kernel lacks the link kind or feature (EOPNOTSUPP, or "Unknown device type").
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

/// The errno → kind table shared by every netlink and file operation.
pub(crate) fn kind_for_errno(errno: i32) -> ErrorKind {
    match errno {
        libc::EEXIST => ErrorKind::AlreadyExists,
        libc::ENODEV | libc::ENOENT | libc::ESRCH | libc::EADDRNOTAVAIL => ErrorKind::NotFound,
        libc::EOPNOTSUPP => ErrorKind::Unsupported,
        _ => ErrorKind::Other,
    }
}

/// The libc text for an errno without std's " (os error N)" suffix, so messages
/// read like `ip`'s ("File exists").
pub(crate) fn strerror(errno: i32) -> String {
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
