//! bridge `ipMasq`: masquerade what a container sends outside its network's
//! subnets (multicast excluded), keyed by the container address.

use super::cleanup::{release_recorded, release_stale, Del, Gc};
use super::dispatch::{self, Dispatch};
use super::index;
use super::legacy::upgrade_masq;
use super::nft::Element;
use super::schema::{self, INET};
use super::store::{claim_anchor, owner_of, read, transact, Nft, Tx};
use super::tag::{self, Attachment};
use super::{Error, ErrorKind, Result, Sockets};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The operations on masquerade entries (idempotent, like every firewall
/// operation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum Op {
    /// ADD: masquerade traffic from `addrs` to anywhere but `subnets`.
    #[serde(rename = "masq-add")]
    Add {
        #[serde(with = "tag::snake")]
        att: Attachment,
        addrs: Vec<IpAddr>,
        subnets: Vec<IpNet>,
    },
    /// DEL: this attachment's entries, found by tag (works with the netns gone).
    #[serde(rename = "masq-del")]
    Del(Del),
    /// DEL of what an ADD with these `addrs` and `subnets` made (the
    /// prevResult's addresses), looked up by key instead of reading the sets.
    #[serde(rename = "masq-del-keys")]
    DelKeys {
        #[serde(with = "tag::snake")]
        att: Attachment,
        addrs: Vec<IpAddr>,
        subnets: Vec<IpNet>,
    },
    #[serde(rename = "masq-gc")]
    Gc(Gc),
    /// CHECK: what an ADD with these `addrs` and `subnets` made is there and
    /// this attachment's (only reads).
    #[serde(rename = "masq-check")]
    Check {
        #[serde(with = "tag::snake")]
        att: Attachment,
        addrs: Vec<IpAddr>,
        subnets: Vec<IpNet>,
    },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Add { .. } => "masq-add",
            Op::Del(_) => "masq-del",
            Op::DelKeys { .. } => "masq-del-keys",
            Op::Gc(_) => "masq-gc",
            Op::Check { .. } => "masq-check",
        }
    }

    /// The operation, in this process.
    pub fn run(&self, sockets: &Sockets) -> Result<()> {
        upgrade_masq(sockets)?;
        match self {
            Op::Add {
                att,
                addrs,
                subnets,
            } => add_here(sockets, (att, addrs, subnets), self),
            Op::Del(del) => del.run(sockets, &schema::MASQ),
            Op::DelKeys {
                att,
                addrs,
                subnets,
            } => {
                let owner = att.tag();
                let keys: Vec<_> = planned(addrs, subnets, &owner)
                    .into_iter()
                    .map(|(d, elem)| (d.set, elem.key))
                    .collect();
                release_recorded(sockets, &schema::MASQ, &owner, keys)
            }
            Op::Gc(gc) => gc.run(sockets, &schema::MASQ),
            Op::Check {
                att,
                addrs,
                subnets,
            } => check_here(sockets, att, addrs, subnets),
        }
    }
}

fn add_here(
    sockets: &Sockets,
    (att, addrs, subnets): (&Attachment, &[IpAddr], &[IpNet]),
    op: &Op,
) -> Result<()> {
    let owner = att.tag();
    let plan = planned(addrs, subnets, &owner);
    let keys: Vec<_> = plan
        .iter()
        .map(|(d, elem)| (d.set.clone(), elem.key.clone()))
        .collect();
    index::recording(&schema::MASQ, &owner, (&keys, op), |earlier| {
        transact(sockets, |nft, tx| {
            apply(nft, tx, &plan, (earlier, &keys), &owner)
        })
    })
}

/// ADD's changes into `tx`, as a repair replays them: nothing earlier to
/// release.
pub(super) fn replay(
    nft: &mut Nft,
    tx: &mut Tx,
    (att, addrs, subnets): (&Attachment, &[IpAddr], &[IpNet]),
) -> Result<()> {
    let owner = att.tag();
    let plan = planned(addrs, subnets, &owner);
    apply(nft, tx, &plan, (&Vec::new(), &Vec::new()), &owner)
}

/// `plan` into `tx`; `earlier`: the keys an earlier ADD of `owner` recorded,
/// of which those not in `wanted` go.
fn apply(
    nft: &mut Nft,
    tx: &mut Tx,
    plan: &[(Dispatch, Element)],
    (earlier, wanted): (&index::Keys, &index::Keys),
    owner: &str,
) -> Result<()> {
    schema::ensure(nft, tx, &schema::MASQ)?;
    release_stale(nft, tx, INET, (earlier, wanted), owner)?;
    for (d, elem) in plan {
        dispatch::ensure(nft, tx, d)?;
        claim_anchor(nft, tx, INET, (&d.set, elem.clone()))?;
    }
    Ok(())
}

/// The network structures an ADD with these `addrs` and `subnets` uses.
pub(super) fn dispatches(addrs: &[IpAddr], subnets: &[IpNet]) -> Vec<Dispatch> {
    planned(addrs, subnets, "")
        .into_iter()
        .map(|(d, _)| d)
        .collect()
}

/// What ADD puts in: per container address one element, the address, in
/// the set of its network's pods of that family (made if missing).
fn planned(addrs: &[IpAddr], subnets: &[IpNet], owner: &str) -> Vec<(Dispatch, Element)> {
    addrs
        .iter()
        .map(|addr| {
            let d = dispatch::ip_masq(addr.is_ipv4(), subnets);
            let elem = d.element(*addr, owner);
            (d, elem)
        })
        .collect()
}

/// CHECK: per address, its network's set, chain and base-chain rule
/// (`dispatch::missing`), and the address's element in the set, tagged with
/// this attachment. The first thing missing is the error, naming it.
fn check_here(
    sockets: &Sockets,
    att: &Attachment,
    addrs: &[IpAddr],
    subnets: &[IpNet],
) -> Result<()> {
    let owner = att.tag();
    read(sockets, |nft| {
        for (addr, (d, want)) in addrs.iter().zip(planned(addrs, subnets, &owner)) {
            let problem = match dispatch::missing(nft, &d)? {
                Some(p) => Some(p),
                None => {
                    let have = nft.get(INET, &d.set, &want.key)?;
                    entry_problem(have.as_ref(), &d.set.name, *addr, &owner)
                }
            };
            if let Some(p) = problem {
                let msg = format!("CHECK: masquerade of {addr}: {p}");
                return Err(Error::new(ErrorKind::Mismatch, msg));
            }
        }
        Ok(())
    })
}

/// What is wrong with the element `have` of `addr` in `set`: missing, or
/// another attachment's (it took the address over, and its DEL will take the
/// masquerade with it).
fn entry_problem(have: Option<&Element>, set: &str, addr: IpAddr, owner: &str) -> Option<String> {
    match have.map(owner_of) {
        None => Some(format!("set {set} has no entry for {addr}")),
        Some(Some(o)) if o == owner => None,
        Some(o) => Some(format!(
            "the entry for {addr} in set {set} belongs to {}",
            o.map_or("an entry cnikit did not tag".into(), |o| tag::describe(&o))
        )),
    }
}

#[cfg(test)]
#[path = "masq_tests.rs"]
mod kernel_tests;
