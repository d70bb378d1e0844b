//! Failures of the firewall layer, in terms a plugin can act on. The mapping
//! to CNI error codes lives in `cni/error.rs`, like every other mapping.

use std::fmt;

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
}

/// A kernel or socket failure (the operation is already named in the
/// message); only "the kernel lacks it" matters to a plugin.
impl From<crate::netlink::Error> for Error {
    fn from(e: crate::netlink::Error) -> Error {
        let kind = match e.kind {
            crate::netlink::ErrorKind::Unsupported => ErrorKind::Unsupported,
            _ => ErrorKind::Other,
        };
        Error::new(kind, e.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
