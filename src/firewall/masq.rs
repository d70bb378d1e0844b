//! bridge `ipMasq`: masquerade what a container sends outside its network's
//! subnets (multicast excluded), keyed by the container address.

use super::schema::{self, key, range, Value, INET, MASQ4, MASQ4_SKIP, MASQ6, MASQ6_SKIP};
use super::store::{claim_anchor, not_valid, owned, owned_range, release, transact, Derived};
use super::tag::{self, Attachment};
use super::Result;
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
    Del {
        #[serde(with = "tag::snake")]
        att: Attachment,
    },
    /// GC: entries of `network` whose attachment is not in `valid`.
    #[serde(rename = "masq-gc")]
    Gc {
        network: String,
        #[serde(with = "tag::snake_list")]
        valid: Vec<Attachment>,
    },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Add { .. } => "masq-add",
            Op::Del { .. } => "masq-del",
            Op::Gc { .. } => "masq-gc",
        }
    }

    /// The operation, in this process.
    pub fn run(&self) -> Result<()> {
        match self {
            Op::Add {
                att,
                addrs,
                subnets,
            } => add_here(att, addrs, subnets),
            Op::Del { att } => del_here(att),
            Op::Gc { network, valid } => gc_here(network, valid),
        }
    }
}

fn add_here(att: &Attachment, addrs: &[IpAddr], subnets: &[IpNet]) -> Result<()> {
    let owner = att.tag();
    transact(|nft, tx| {
        schema::ensure(nft, tx, &schema::MASQ)?;
        for addr in addrs {
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
                        &owner,
                    )
                })
                .collect();
            let anchor = owned(key(&[Value::Ip(*addr)]), None, &owner);
            let derived = Derived {
                set: skip,
                subject: 0,
                elems,
            };
            claim_anchor(nft, tx, INET, (set, anchor), vec![derived])?;
        }
        Ok(())
    })
}

fn del_here(att: &Attachment) -> Result<()> {
    let owner = att.tag();
    transact(|nft, tx| release(nft, tx, INET, schema::MASQ.sets, &|o| o == owner))
}

fn gc_here(network: &str, valid: &[Attachment]) -> Result<()> {
    let doomed = not_valid(network, valid);
    transact(|nft, tx| release(nft, tx, INET, schema::MASQ.sets, &doomed))
}
