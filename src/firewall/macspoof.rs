//! bridge `macspoofchk`: frames entering the bridge from a container's port
//! must carry the container's MAC address; others are dropped.

use super::cleanup::{Cleanup, Del, Gc};
use super::schema::{self, key, Value, BRIDGE, SPOOF_ALLOW, SPOOF_PORTS};
use super::store::{anchor_keys, claim_anchor, owned, release_keys, transact, Derived};
use super::tag::{self, Attachment};
use super::{Error, ErrorKind, Result, Sockets};
use serde::{Deserialize, Serialize};

/// The operations on the MAC spoof check (idempotent, like every firewall
/// operation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum Op {
    /// ADD: guard host port `host_ifname`; only `mac` ("aa:bb:…") may send.
    #[serde(rename = "macspoof-add")]
    Add {
        #[serde(with = "tag::snake")]
        att: Attachment,
        host_ifname: String,
        mac: String,
    },
    /// DEL: this attachment's entries, found by tag.
    #[serde(rename = "macspoof-del")]
    Del(Del),
    /// DEL of what an ADD with this port and MAC made (from prevResult),
    /// looked up by key instead of reading the sets.
    #[serde(rename = "macspoof-del-keys")]
    DelKeys {
        #[serde(with = "tag::snake")]
        att: Attachment,
        host_ifname: String,
        mac: String,
    },
    #[serde(rename = "macspoof-gc")]
    Gc(Gc),
}

impl Op {
    /// ADD, refused here when `mac` is not a MAC address.
    pub fn add(att: &Attachment, host_ifname: &str, mac: &str) -> Result<Op> {
        parse_mac(mac)?;
        Ok(Op::Add {
            att: att.clone(),
            host_ifname: host_ifname.to_string(),
            mac: mac.to_string(),
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Op::Add { .. } => "macspoof-add",
            Op::Del(_) => "macspoof-del",
            Op::DelKeys { .. } => "macspoof-del-keys",
            Op::Gc(_) => "macspoof-gc",
        }
    }

    /// The operation, in this process.
    pub fn run(&self, sockets: &Sockets) -> Result<()> {
        match self {
            Op::Add {
                att,
                host_ifname,
                mac,
            } => add_here(sockets, att, host_ifname, mac),
            Op::Del(del) => del.run(sockets, BRIDGE, schema::MACSPOOF.sets),
            Op::DelKeys {
                att,
                host_ifname,
                mac,
            } => {
                let owner = att.tag();
                let (anchor, derived) = planned(&owner, host_ifname, parse_mac(mac)?);
                let keys = anchor_keys(anchor, vec![derived]);
                transact(sockets, |nft, tx| {
                    release_keys(nft, tx, BRIDGE, &keys, &owner)
                })
            }
            Op::Gc(gc) => gc.run(sockets, BRIDGE, schema::MACSPOOF.sets),
        }
    }
}

fn add_here(sockets: &Sockets, att: &Attachment, host_ifname: &str, mac: &str) -> Result<()> {
    let owner = att.tag();
    let mac = parse_mac(mac)?;
    transact(sockets, |nft, tx| {
        schema::ensure(nft, tx, &schema::MACSPOOF)?;
        let (anchor, derived) = planned(&owner, host_ifname, mac);
        claim_anchor(nft, tx, BRIDGE, anchor, vec![derived])
    })
}

/// What ADD puts in: the host port as anchor, and the (port . MAC) pair it
/// allows.
fn planned(
    owner: &str,
    host_ifname: &str,
    mac: [u8; 6],
) -> ((&'static schema::SetDef, super::nft::Element), Derived) {
    let port = owned(key(&[Value::Ifname(host_ifname)]), None, owner);
    let allow = owned(
        key(&[Value::Ifname(host_ifname), Value::Ether(mac)]),
        None,
        owner,
    );
    let derived = Derived {
        set: &SPOOF_ALLOW,
        subject: 0,
        elems: vec![allow],
    };
    ((&SPOOF_PORTS, port), derived)
}

fn parse_mac(mac: &str) -> Result<[u8; 6]> {
    let bytes: Option<Vec<u8>> = mac
        .split(':')
        .map(|part| u8::from_str_radix(part, 16).ok())
        .collect();
    bytes.and_then(|b| b.try_into().ok()).ok_or_else(|| {
        Error::new(
            ErrorKind::Other,
            format!("macspoofchk: {mac:?} is not a MAC address"),
        )
    })
}
