//! One error type for the whole crate. The CNI side maps [`ErrorKind`] to CNI error codes in
//! one place, so every failure here must pick the kind that tells the runtime what to do.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What went wrong, coarse enough for the CNI side to choose an error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The configuration or the request is wrong (CNI code 7).
    InvalidConfig,
    /// No free address in some range set (100 on ADD, 50 on STATUS).
    Exhausted,
    /// A requested address is taken or outside the ranges (100+).
    Conflict,
    /// A file-system operation failed (CNI code 5).
    Io,
    /// Neither the daemon nor the store can be used (11 or 50).
    Unavailable,
    /// The thing asked about does not exist.
    NotFound,
    /// A bug or corrupted state.
    Internal,
}

impl ErrorKind {
    /// Stable lower-case name, also used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidConfig => "invalid_config",
            ErrorKind::Exhausted => "exhausted",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Io => "io",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error with a kind and a message written for the person reading the CNI error.
///
/// The message already contains the underlying cause (e.g. the OS error), so callers print
/// only `Display`; there is no separate `source()` chain to print twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidConfig, message)
    }

    pub(crate) fn conflict(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Conflict, message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }

    /// An I/O failure, with what we were doing and on which path.
    pub(crate) fn io(context: impl fmt::Display, err: &std::io::Error) -> Error {
        Error::new(ErrorKind::Io, format!("{context}: {err}"))
    }
}
