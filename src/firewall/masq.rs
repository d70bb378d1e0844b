//! bridge `ipMasq`: masquerade what a container sends outside its network's
//! subnets (multicast excluded), keyed by the container address.

use super::cleanup::{Cleanup, Del, Gc};
use super::schema::{self, key, range, Value, INET, MASQ4, MASQ4_SKIP, MASQ6, MASQ6_SKIP};
use super::store::{
    anchor_keys, claim_anchor, owned, owned_range, release_keys, transact, Derived,
};
use super::tag::{self, Attachment};
use super::{Result, Sockets};
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
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Add { .. } => "masq-add",
            Op::Del(_) => "masq-del",
            Op::DelKeys { .. } => "masq-del-keys",
            Op::Gc(_) => "masq-gc",
        }
    }

    /// The operation, in this process.
    pub fn run(&self, sockets: &Sockets) -> Result<()> {
        match self {
            Op::Add {
                att,
                addrs,
                subnets,
            } => add_here(sockets, att, addrs, subnets),
            Op::Del(del) => del.run(sockets, INET, schema::MASQ.sets),
            Op::DelKeys {
                att,
                addrs,
                subnets,
            } => {
                let owner = att.tag();
                let keys: Vec<_> = planned(addrs, subnets, &owner)
                    .into_iter()
                    .flat_map(|(anchor, derived)| anchor_keys(anchor, vec![derived]))
                    .collect();
                transact(sockets, |nft, tx| {
                    release_keys(nft, tx, INET, &keys, &owner)
                })
            }
            Op::Gc(gc) => gc.run(sockets, INET, schema::MASQ.sets),
        }
    }
}

fn add_here(
    sockets: &Sockets,
    att: &Attachment,
    addrs: &[IpAddr],
    subnets: &[IpNet],
) -> Result<()> {
    let owner = att.tag();
    transact(sockets, |nft, tx| {
        schema::ensure(nft, tx, &schema::MASQ)?;
        for (anchor, derived) in planned(addrs, subnets, &owner) {
            claim_anchor(nft, tx, INET, anchor, vec![derived])?;
        }
        Ok(())
    })
}

type Anchor = (&'static schema::SetDef, super::nft::Element);

/// What ADD puts in: per container address an anchor keyed by it, and the
/// (address . subnet range) elements that exempt its own subnets.
fn planned(addrs: &[IpAddr], subnets: &[IpNet], owner: &str) -> Vec<(Anchor, Derived)> {
    addrs
        .iter()
        .map(|addr| {
            let v4 = addr.is_ipv4();
            let (set, skip) = if v4 {
                (&MASQ4, &MASQ4_SKIP)
            } else {
                (&MASQ6, &MASQ6_SKIP)
            };
            let elems = subnets
                .iter()
                .filter(|net| net.addr().is_ipv4() == v4)
                .map(|net| {
                    let (first, last) = range(net.trunc());
                    owned_range(
                        key(&[Value::Ip(*addr), first]),
                        key(&[Value::Ip(*addr), last]),
                        owner,
                    )
                })
                .collect();
            let anchor = owned(key(&[Value::Ip(*addr)]), None, owner);
            let derived = Derived {
                set: skip,
                subject: 0,
                elems,
            };
            ((set, anchor), derived)
        })
        .collect()
}
