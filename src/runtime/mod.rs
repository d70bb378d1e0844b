//! The runtime side of CNI: running a network configuration list the way a
//! container runtime does with libcni (spec section 3). `cnikit net` is its
//! command line; the churn benchmark drives the same code in-process.
//!
//! It uses the protocol core ([`crate::cni`]) for versions, names and result
//! layouts, and nothing of the plugins.

mod cache;
pub mod cli;
mod conf;
mod derive;
mod exec;
mod ops;
#[cfg(test)]
mod tests;

pub use conf::{load_all, load_by_name, ConfList};
pub use ops::{Attachment, Gone, Outcome, Runtime};

use serde_json::Value;
use std::fmt;

/// Why an operation on a list failed.
#[derive(Debug)]
pub enum Error {
    /// The runtime itself: configuration, arguments, cache, plugin lookup.
    Runtime(String),
    /// Reading or writing the result cache.
    Io(String),
    /// A plugin answered with an error.
    Plugin(Box<PluginFailure>),
    /// GC goes on past failures and reports all of them.
    Multiple(Vec<Error>),
}

/// Which plugin failed, doing what, and the error object it printed.
#[derive(Debug, Clone)]
pub struct PluginFailure {
    pub plugin_type: String,
    /// Position in the list, 0-based, and the list's length.
    pub index: usize,
    pub count: usize,
    pub command: &'static str,
    /// `{"code", "msg", "details"?}` as the plugin printed it (or as we
    /// describe its output when it printed none).
    pub object: Value,
    /// What happened afterwards, e.g. how the cleanup DEL of a failed ADD went.
    pub notes: Vec<String>,
}

impl Error {
    /// Attach a note to a plugin failure (other errors get it appended).
    pub fn with_note(self, note: String) -> Error {
        match self {
            Error::Plugin(mut p) => {
                p.notes.push(note);
                Error::Plugin(p)
            }
            Error::Runtime(msg) => Error::Runtime(format!("{msg}; {note}")),
            Error::Io(msg) => Error::Io(format!("{msg}; {note}")),
            Error::Multiple(mut all) => {
                all.push(Error::Runtime(note));
                Error::Multiple(all)
            }
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Runtime(msg) | Error::Io(msg) => f.write_str(msg),
            Error::Plugin(p) => p.fmt(f),
            Error::Multiple(all) => {
                let parts: Vec<String> = all.iter().map(Error::to_string).collect();
                f.write_str(&parts.join("\n"))
            }
        }
    }
}

impl fmt::Display for PluginFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.object;
        write!(
            f,
            "plugin {:?} ({} of {}) failed {}: {} (code {})",
            self.plugin_type,
            self.index + 1,
            self.count,
            self.command,
            o.get("msg").and_then(Value::as_str).unwrap_or(""),
            o.get("code").map(Value::to_string).unwrap_or_default()
        )?;
        if let Some(d) = o.get("details").and_then(Value::as_str) {
            if !d.is_empty() {
                write!(f, ": {d}")?;
            }
        }
        for note in &self.notes {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}
