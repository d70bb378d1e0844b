//! The firewall plugin: forwarded traffic from a pod, and replies to it, is
//! accepted (new connections from outside are not), and `same-bridge` /
//! `isolated` ingress policies keep bridges apart.
//!
//! Where it goes, per address family: when the host's iptables-nft has a
//! FORWARD chain in that family's filter table, into that table, the way the
//! reference plugin lays it out (`iptables.rs`, with rules iptables-nft can
//! read, `xt.rs`); otherwise into our own table (`schema::FORWARD`: sets of
//! pod addresses and bridges, tagged elements like every other feature, and
//! each attachment's keys recorded, `index.rs`). DEL and GC look in both
//! places, since the host may have changed since ADD.

use super::cleanup::{forget_all, release_owner, release_stale, Gc};
use super::index::{self, Keys};
use super::iptables::{self, Isolation};
use super::schema::{
    self, key, Value, FORWARD, FW4_PODS, FW6_PODS, FW_ISO, FW_ISO_PAIR, FW_ISO_SELF, INET,
};
use super::sets::SetDef;
use super::store::{claim_anchor, not_valid, owned, owner_of, read, transact, Nft, Tx};
use super::tag::{self, Attachment};
use super::turn;
use super::{Error, ErrorKind, Result, Sockets};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// What one attachment asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    #[serde(with = "tag::snake")]
    pub att: Attachment,
    /// The pod's addresses (prevResult's).
    pub addrs: Vec<IpAddr>,
    /// `iptablesAdminChainName` (default CNI-ADMIN).
    pub admin_chain: String,
    pub isolation: Option<Isolation>,
}

/// DEL: the attachment, and prevResult's addresses when DEL has them (for
/// the reference plugin's untagged rules of the same pod).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forget {
    #[serde(with = "tag::snake")]
    pub att: Attachment,
    #[serde(default)]
    pub addrs: Vec<IpAddr>,
}

/// The operations of the firewall plugin (idempotent, like every firewall
/// operation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum Op {
    #[serde(rename = "forward-add")]
    Add(Spec),
    #[serde(rename = "forward-check")]
    Check(Spec),
    /// DEL: this attachment's rules and elements, found by tag.
    #[serde(rename = "forward-del")]
    Del(Forget),
    /// GC: other attachments' of the network, and isolation of bridges gone.
    #[serde(rename = "forward-gc")]
    Gc(Gc),
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Add(_) => "forward-add",
            Op::Check(_) => "forward-check",
            Op::Del(_) => "forward-del",
            Op::Gc(_) => "forward-gc",
        }
    }

    /// The operation, in this process.
    pub fn run(&self, sockets: &Sockets) -> Result<()> {
        match self {
            Op::Add(spec) => {
                let owner = spec.att.tag();
                let keys = own_keys(&spec.addrs, &owner);
                index::recording(&FORWARD, &owner, (&keys, self), |earlier| {
                    transact(sockets, |nft, tx| add(nft, tx, spec, earlier))
                })
            }
            Op::Check(spec) => read(sockets, |nft| check(nft, spec)),
            Op::Del(del) => {
                let owner = del.att.tag();
                // The record goes in the batch's turn: see `index.rs`.
                let _turn = turn::lock();
                transact(sockets, |nft, tx| {
                    iptables::release(nft, tx, &|o| o == owner, &del.addrs)?;
                    release_owner(nft, tx, &FORWARD, &owner, &Vec::new()).map(drop)
                })?;
                index::forget(&FORWARD, &owner)
            }
            Op::Gc(gc) => {
                let doomed = not_valid(&gc.network, &gc.valid);
                let mut gone = Vec::new();
                let _turn = turn::lock();
                transact(sockets, |nft, tx| {
                    iptables::release(nft, tx, &doomed, &[])?;
                    gone = gc.plan(nft, tx, &FORWARD)?;
                    forget_bridges(nft, tx)
                })?;
                forget_all(&FORWARD, &gone)
            }
        }
    }
}

/// The set of `ip`'s family.
fn pod_set(ip: &IpAddr) -> &'static SetDef {
    if ip.is_ipv6() {
        &FW6_PODS
    } else {
        &FW4_PODS
    }
}

/// The keys an ADD in our own table makes: one per address. An ADD records
/// them whichever table it goes to (the host may change before its DEL).
fn own_keys(addrs: &[IpAddr], owner: &str) -> Keys {
    addrs
        .iter()
        .map(|ip| (pod_set(ip).clone(), own_element(*ip, owner).key))
        .collect()
}

fn own_element(ip: IpAddr, owner: &str) -> super::nft::Element {
    owned(key(&[Value::Ip(ip)]), None, owner)
}

/// The families of `addrs`: false = IPv4, true = IPv6.
fn families(addrs: &[IpAddr]) -> Vec<bool> {
    let mut out: Vec<bool> = addrs.iter().map(IpAddr::is_ipv6).collect();
    out.sort();
    out.dedup();
    out
}

/// `earlier`: the keys an earlier ADD of this attachment recorded (none
/// when a repair replays it).
pub(super) fn add(nft: &mut Nft, tx: &mut Tx, spec: &Spec, earlier: &Keys) -> Result<()> {
    let owner = spec.att.tag();
    let mut own_table = Vec::new();
    let mut isolate_here = false;
    for v6 in families(&spec.addrs) {
        if iptables::present(nft, v6)? {
            let iso = spec.isolation.as_ref();
            iptables::add(nft, tx, v6, &spec.admin_chain, &owner, &spec.addrs, iso)?;
        } else {
            own_table.extend(spec.addrs.iter().filter(|ip| ip.is_ipv6() == v6));
            isolate_here |= spec.isolation.is_some();
        }
    }
    // What an earlier ADD of ours put in our table and this one does not
    // (it went to iptables' tables, or had other addresses), by its record.
    // Elements of a version before the records are left to DEL, which
    // records them first (`ensure_indexed`).
    let wanted = own_keys(&own_table, &owner);
    release_stale(nft, tx, INET, (earlier, &wanted), &owner)?;
    if own_table.is_empty() {
        return Ok(());
    }
    schema::ensure(nft, tx, &FORWARD)?;
    for ip in own_table {
        // A stale attachment's entry for a reused address becomes ours, so
        // its late DEL cannot take away what this pod relies on.
        claim_anchor(nft, tx, INET, (pod_set(&ip), own_element(ip, &owner)))?;
    }
    if let Some(iso) = spec.isolation.as_ref().filter(|_| isolate_here) {
        for (set, elem) in isolation_elements(iso) {
            if nft.get(INET, set, &elem.key)?.is_none() {
                tx.add(INET, set, vec![elem]);
            }
        }
    }
    Ok(())
}

/// The elements isolating `iso.bridge`; they belong to the bridge, not to
/// any attachment (the reference's stay, too), so their tag names the bridge.
fn isolation_elements(iso: &Isolation) -> Vec<(&'static SetDef, super::nft::Element)> {
    let owner = bridge_tag(&iso.bridge);
    let name = Value::Ifname(&iso.bridge);
    let pair = key(&[name.clone(), name.clone()]);
    let mut out = vec![
        (&FW_ISO, owned(key(&[name]), None, &owner)),
        (&FW_ISO_PAIR, owned(pair.clone(), None, &owner)),
    ];
    if iso.isolated {
        out.push((&FW_ISO_SELF, owned(pair, None, &owner)));
    }
    out
}

/// No network name has a space, so these never match an attachment's tag.
fn bridge_tag(bridge: &str) -> String {
    format!("{BRIDGE_TAG}{bridge}")
}

const BRIDGE_TAG: &str = "bridge ";

/// GC: isolation of bridges that no longer exist on this host.
fn forget_bridges(nft: &mut Nft, tx: &mut Tx) -> Result<()> {
    let mut links = crate::netlink::Netlink::open()?;
    let mut gone = |name: &str| matches!(links.link_by_name(name), Ok(None));
    for set in [&FW_ISO, &FW_ISO_PAIR, &FW_ISO_SELF] {
        let doomed: Vec<_> = nft
            .dump(INET, set)?
            .into_iter()
            .filter(|e| {
                owner_of(e)
                    .and_then(|o| o.strip_prefix(BRIDGE_TAG).map(str::to_string))
                    .is_some_and(|b| gone(&b))
            })
            .collect();
        tx.del(INET, set, doomed);
    }
    iptables::forget_bridges(nft, tx, &mut gone)
}

fn check(nft: &mut Nft, spec: &Spec) -> Result<()> {
    let owner = spec.att.tag();
    let mismatch = |why: String| Error::new(ErrorKind::Mismatch, why);
    for v6 in families(&spec.addrs) {
        if iptables::present(nft, v6)? {
            let iso = spec.isolation.as_ref();
            iptables::check(nft, v6, &spec.admin_chain, &owner, &spec.addrs, iso)
                .map_err(mismatch)?;
            continue;
        }
        for ip in spec.addrs.iter().filter(|ip| ip.is_ipv6() == v6) {
            let set = if v6 { &FW6_PODS } else { &FW4_PODS };
            let have = nft.get(INET, set, &key(&[Value::Ip(*ip)]))?;
            if have.as_ref().and_then(owner_of).as_deref() != Some(owner.as_str()) {
                return Err(mismatch(format!(
                    "table inet cnikit has no entry for {ip} in {}",
                    set.name
                )));
            }
        }
        if let Some(iso) = &spec.isolation {
            for (set, elem) in isolation_elements(iso) {
                if nft.get(INET, set, &elem.key)?.is_none() {
                    return Err(mismatch(format!(
                        "table inet cnikit does not isolate bridge {} ({} lacks it)",
                        iso.bridge, set.name
                    )));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
