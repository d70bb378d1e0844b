//! One firewall request: an operation of one feature module. A new operation
//! is a variant of its feature's `Op` (with its `name` and `run`); only a new
//! feature adds a variant here.

use super::{conntrack, forward, macspoof, masq, portmap, Result, Sockets};
use serde::{Deserialize, Serialize};

/// On the wire the feature's `op` tag alone tells them apart (`portmap-add`,
/// `masq-del`, …), so no second tag is needed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Request {
    Portmap(portmap::Op),
    Masq(masq::Op),
    Macspoof(macspoof::Op),
    Conntrack(conntrack::Op),
    Forward(forward::Op),
}

impl Request {
    /// The operation's name (its wire tag; the daemon's metrics label).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Portmap(op) => op.name(),
            Request::Masq(op) => op.name(),
            Request::Macspoof(op) => op.name(),
            Request::Conntrack(op) => op.name(),
            Request::Forward(op) => op.name(),
        }
    }

    /// The operation, in this process.
    pub fn run(&self, sockets: &Sockets) -> Result<()> {
        match self {
            Request::Portmap(op) => op.run(sockets),
            Request::Masq(op) => op.run(sockets),
            Request::Macspoof(op) => op.run(sockets),
            Request::Conntrack(op) => op.run(sockets),
            Request::Forward(op) => op.run(sockets),
        }
    }
}

/// `.into()` from each feature's `Op`: written once, as they only differ
/// in names.
macro_rules! from_op {
    ($($variant:ident: $feature:ident),*) => {$(
        impl From<$feature::Op> for Request {
            fn from(op: $feature::Op) -> Request {
                Request::$variant(op)
            }
        }
    )*};
}

from_op!(
    Portmap: portmap,
    Masq: masq,
    Macspoof: macspoof,
    Conntrack: conntrack,
    Forward: forward
);
