//! bridge `ipMasq`: masquerade what a container sends outside its network's
//! subnets (multicast excluded), keyed by the container address.

use super::remote::{self, Request};
use super::schema::{self, key, range, Value, INET, MASQ4, MASQ4_SKIP, MASQ6, MASQ6_SKIP};
use super::store::{claim_anchor, not_valid, owned, owned_range, release, transact, Derived};
use super::tag::Attachment;
use super::Result;
use ipnet::IpNet;
use std::net::IpAddr;

/// ADD: masquerade traffic from `addrs` to anywhere but `subnets`.
/// By the ipamd daemon when one runs, like every public operation here.
pub fn add(att: &Attachment, addrs: &[IpAddr], subnets: &[IpNet]) -> Result<()> {
    remote::run(Request::MasqAdd {
        att: att.clone(),
        addrs: addrs.to_vec(),
        subnets: subnets.to_vec(),
    })
}

/// DEL: this attachment's entries, found by tag (works with the netns gone).
pub fn del(att: &Attachment) -> Result<()> {
    remote::run(Request::MasqDel { att: att.clone() })
}

/// GC: entries of `network` whose attachment is not in `valid`.
pub fn gc(network: &str, valid: &[Attachment]) -> Result<()> {
    remote::run(Request::MasqGc {
        network: network.to_string(),
        valid: valid.to_vec(),
    })
}

pub(super) fn add_here(att: &Attachment, addrs: &[IpAddr], subnets: &[IpNet]) -> Result<()> {
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

pub(super) fn del_here(att: &Attachment) -> Result<()> {
    let owner = att.tag();
    transact(|nft, tx| release(nft, tx, INET, schema::MASQ.sets, &|o| o == owner))
}

pub(super) fn gc_here(network: &str, valid: &[Attachment]) -> Result<()> {
    let doomed = not_valid(network, valid);
    transact(|nft, tx| release(nft, tx, INET, schema::MASQ.sets, &doomed))
}
