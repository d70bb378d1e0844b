//! Failures of the firewall layer, in terms a plugin can act on. The mapping
//! to CNI error codes lives in `cni/error.rs`, like every other mapping.

use std::fmt;
use std::io;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// A host port (or another keyed entry) belongs to another attachment;
    /// nothing was changed.
    Conflict,
    /// CHECK: an entry of this attachment is missing or points elsewhere.
    Mismatch,
    /// The kernel lacks nf_tables or a part of it (EOPNOTSUPP and friends).
    Unsupported,
    /// Any other kernel, socket or decoding failure.
    Other,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Error {
    pub kind: ErrorKind,
    /// What was being done and why it failed.
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// `"<what>: <strerror>"`, the kind derived from the errno.
    pub(crate) fn from_errno(errno: i32, what: &str) -> Error {
        let kind = match errno {
            libc::EOPNOTSUPP | libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT => ErrorKind::Unsupported,
            _ => ErrorKind::Other,
        };
        Error {
            kind,
            message: format!("{what}: {}", strerror(errno)),
        }
    }

    pub(crate) fn io(what: &str, err: &io::Error) -> Error {
        match err.raw_os_error() {
            Some(errno) => Error::from_errno(errno, what),
            None => Error::new(ErrorKind::Other, format!("{what}: {err}")),
        }
    }
}

/// The libc text of an errno without std's " (os error N)" suffix.
fn strerror(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    let suffix = format!(" (os error {errno})");
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
