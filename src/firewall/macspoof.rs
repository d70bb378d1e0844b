//! bridge `macspoofchk`: frames entering the bridge from a container's port
//! must carry the container's MAC address; others are dropped.

use super::remote::{self, Request};
use super::schema::{self, key, Value, BRIDGE, SPOOF_ALLOW, SPOOF_PORTS};
use super::store::{claim_anchor, not_valid, owned, release, transact, Derived};
use super::tag::Attachment;
use super::{Error, ErrorKind, Result};

/// ADD: guard host port `host_ifname`; only `mac` ("aa:bb:…") may send.
/// By the ipamd daemon when one runs, like every public operation here.
pub fn add(att: &Attachment, host_ifname: &str, mac: &str) -> Result<()> {
    parse_mac(mac)?;
    remote::run(Request::MacspoofAdd {
        att: att.clone(),
        host_ifname: host_ifname.to_string(),
        mac: mac.to_string(),
    })
}

/// DEL: this attachment's entries, found by tag.
pub fn del(att: &Attachment) -> Result<()> {
    remote::run(Request::MacspoofDel { att: att.clone() })
}

/// GC: entries of `network` whose attachment is not in `valid`.
pub fn gc(network: &str, valid: &[Attachment]) -> Result<()> {
    remote::run(Request::MacspoofGc {
        network: network.to_string(),
        valid: valid.to_vec(),
    })
}

pub(super) fn add_here(att: &Attachment, host_ifname: &str, mac: &str) -> Result<()> {
    let owner = att.tag();
    let mac = parse_mac(mac)?;
    transact(|nft, tx| {
        schema::ensure(nft, tx, &schema::MACSPOOF)?;
        let port = owned(key(&[Value::Ifname(host_ifname)]), None, &owner);
        let allow = owned(
            key(&[Value::Ifname(host_ifname), Value::Ether(mac)]),
            None,
            &owner,
        );
        let derived = Derived {
            set: &SPOOF_ALLOW,
            subject: 0,
            elems: vec![allow],
        };
        claim_anchor(nft, tx, BRIDGE, (&SPOOF_PORTS, port), vec![derived])
    })
}

pub(super) fn del_here(att: &Attachment) -> Result<()> {
    let owner = att.tag();
    transact(|nft, tx| release(nft, tx, BRIDGE, schema::MACSPOOF.sets, &|o| o == owner))
}

pub(super) fn gc_here(network: &str, valid: &[Attachment]) -> Result<()> {
    let doomed = not_valid(network, valid);
    transact(|nft, tx| release(nft, tx, BRIDGE, schema::MACSPOOF.sets, &doomed))
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
