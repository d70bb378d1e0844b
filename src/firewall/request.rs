//! One firewall request: an operation of one feature module. A new operation
//! is a variant of its feature's `Op` (with its `name` and `run`); only a new
//! feature adds a variant here.

use super::dispatch::Dispatch;
use super::store::{Nft, Tx};
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

    /// The feature whose records it writes (as they are named), if any.
    pub(crate) fn feature(&self) -> Option<&'static str> {
        match self {
            Request::Portmap(_) => Some(super::schema::PORTMAP.name),
            Request::Masq(_) => Some(super::schema::MASQ.name),
            Request::Macspoof(_) => Some(super::schema::MACSPOOF.name),
            Request::Forward(_) => Some(super::schema::FORWARD.name),
            Request::Conntrack(_) => None,
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

/// What a repair (`repair.rs`) does with the ADD a record names.
impl Request {
    /// The ADD's changes into `tx`, as ADD makes them when nothing is there;
    /// None for an operation that is no ADD.
    pub(crate) fn replay(&self, nft: &mut Nft, tx: &mut Tx) -> Option<Result<()>> {
        Some(match self {
            Request::Portmap(portmap::Op::Add(spec)) => portmap::replay(nft, tx, spec),
            Request::Masq(masq::Op::Add {
                att,
                addrs,
                subnets,
            }) => masq::replay(nft, tx, (att, addrs, subnets)),
            Request::Macspoof(macspoof::Op::Add {
                att,
                host_ifname,
                mac,
            }) => macspoof::replay(nft, tx, (att, host_ifname, mac)),
            Request::Forward(forward::Op::Add(spec)) => forward::add(nft, tx, spec, &Vec::new()),
            _ => return None,
        })
    }

    /// The networks' structures (`dispatch.rs`) the ADD's elements go through.
    pub(crate) fn dispatches(&self) -> Vec<Dispatch> {
        match self {
            Request::Portmap(portmap::Op::Add(spec)) => portmap::dispatches(spec),
            Request::Masq(masq::Op::Add { addrs, subnets, .. }) => masq::dispatches(addrs, subnets),
            _ => Vec::new(),
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
