//! bridge `macspoofchk`: frames entering the bridge from a container's port
//! must carry the container's MAC address; others are dropped.

use super::cleanup::{release_recorded, Del, Gc};
use super::index;
use super::nft::Element;
use super::schema::{self, key, Value, BRIDGE, SPOOF_ALLOW, SPOOF_PORTS};
use super::store::{claim_anchor, owned, owner_of, release_keys, transact, Nft, Tx};
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
            } => add_here(sockets, (att, host_ifname, mac), self),
            Op::Del(del) => del.run(sockets, &schema::MACSPOOF),
            Op::DelKeys {
                att,
                host_ifname,
                mac,
            } => {
                let owner = att.tag();
                let [port, allow] = planned(&owner, host_ifname, parse_mac(mac)?);
                let keys = keys_of(&port, &allow);
                release_recorded(sockets, &schema::MACSPOOF, &owner, keys)
            }
            Op::Gc(gc) => gc.run(sockets, &schema::MACSPOOF),
        }
    }
}

fn add_here(
    sockets: &Sockets,
    (att, host_ifname, mac): (&Attachment, &str, &str),
    op: &Op,
) -> Result<()> {
    let owner = att.tag();
    let [port, allow] = planned(&owner, host_ifname, parse_mac(mac)?);
    let keys = keys_of(&port, &allow);
    index::recording(&schema::MACSPOOF, &owner, (&keys, op), |_| {
        transact(sockets, |nft, tx| {
            apply(nft, tx, &owner, [&port, &allow], false)
        })
    })
}

/// ADD's changes into `tx`, as a repair replays them.
pub(super) fn replay(
    nft: &mut Nft,
    tx: &mut Tx,
    (att, host_ifname, mac): (&Attachment, &str, &str),
) -> Result<()> {
    let owner = att.tag();
    let [port, allow] = planned(&owner, host_ifname, parse_mac(mac)?);
    apply(nft, tx, &owner, [&port, &allow], true)
}

/// `replaying`: only what is missing goes into `tx` (a repair that finds
/// everything in place sends nothing).
fn apply(
    nft: &mut Nft,
    tx: &mut Tx,
    owner: &str,
    [port, allow]: [&Element; 2],
    replaying: bool,
) -> Result<()> {
    schema::ensure(nft, tx, &schema::MACSPOOF)?;
    if let Some(have) = nft.get(BRIDGE, &SPOOF_PORTS, &port.key)? {
        if let Some(stale) = owner_of(&have).filter(|o| o != owner) {
            drop_stale_macs(nft, tx, &stale, &port.key)?;
        }
    }
    claim_anchor(nft, tx, BRIDGE, (&SPOOF_PORTS, port.clone()))?;
    // An ADD adds it again when present (not an error for an unchanged
    // element): a lookup would cost every ADD a round trip.
    if !replaying || nft.get(BRIDGE, &SPOOF_ALLOW, &allow.key)?.is_none() {
        tx.add(BRIDGE, &SPOOF_ALLOW, vec![allow.clone()]);
    }
    Ok(())
}

/// A host port name another attachment held (its veth went without DEL and
/// the name came back): the MACs it allowed there go with the port, found by
/// that attachment's record.
fn drop_stale_macs(nft: &mut Nft, tx: &mut Tx, stale: &str, port: &[u8]) -> Result<()> {
    index::ensure_indexed(nft, &schema::MACSPOOF)?;
    let keys: index::Keys = index::recorded(&schema::MACSPOOF, stale)?
        .into_iter()
        .filter(|(set, key)| set.name == SPOOF_ALLOW.name && key.starts_with(port))
        .collect();
    release_keys(nft, tx, BRIDGE, &keys, stale)
}

/// What ADD puts in: the host port, and the (port . MAC) pair it allows.
fn planned(owner: &str, host_ifname: &str, mac: [u8; 6]) -> [Element; 2] {
    let port = owned(key(&[Value::Ifname(host_ifname)]), None, owner);
    let allow = owned(
        key(&[Value::Ifname(host_ifname), Value::Ether(mac)]),
        None,
        owner,
    );
    [port, allow]
}

fn keys_of(port: &Element, allow: &Element) -> index::Keys {
    vec![
        (SPOOF_PORTS.clone(), port.key.clone()),
        (SPOOF_ALLOW.clone(), allow.key.clone()),
    ]
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
