//! The layout of cnikit 0.1, which kept the subnet tests of masquerade in
//! interval sets (`masq4-skip`, `pm4-masq`: removing one element costs time
//! in proportion to the set's size). The first firewall operation of a newer
//! cnikit moves its elements into the current layout (per network a set of
//! its pods' addresses, see `dispatch.rs`) in one batch, owners kept and
//! recorded, and removes the old chains and sets in the same batch: running
//! pods keep their masquerade throughout, and their later DEL, CHECK and GC
//! find their entries where the current code looks.

use super::dispatch::{self, Dispatch};
use super::index;
use super::nft::{Element, Table};
use super::schema::{self, SetDef, Skeleton, INET};
use super::sets::{set, Field};
use super::socket::Sockets;
use super::store::{owner_of, read, transact, Nft, Tx};
use super::Result;
use ipnet::IpNet;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// 0.1's objects that the current layout replaced: its postrouting chain
/// (which refers to the sets, so it goes first) and its sets.
struct Legacy {
    pub table: Table,
    pub chain: &'static str,
    pub sets: &'static [&'static SetDef],
}

/// (source range . container address), owned per container address.
static LEGACY_PM4_MASQ: SetDef = set("pm4-masq", &[Field::V4, Field::V4], true);
static LEGACY_PM6_MASQ: SetDef = set("pm6-masq", &[Field::V6, Field::V6], true);
static LEGACY_PM4_ADDR: SetDef = set("pm4-addr", &[Field::V4], false);
static LEGACY_PM6_ADDR: SetDef = set("pm6-addr", &[Field::V6], false);
static LEGACY_PORTMAP: Legacy = Legacy {
    table: INET,
    chain: "pm-postrouting",
    sets: &[
        &LEGACY_PM4_MASQ,
        &LEGACY_PM6_MASQ,
        &LEGACY_PM4_ADDR,
        &LEGACY_PM6_ADDR,
    ],
};

/// (container address . subnet of its network), and the container addresses.
static LEGACY_MASQ4_SKIP: SetDef = set("masq4-skip", &[Field::V4, Field::V4], true);
static LEGACY_MASQ6_SKIP: SetDef = set("masq6-skip", &[Field::V6, Field::V6], true);
static LEGACY_MASQ4: SetDef = set("masq4", &[Field::V4], false);
static LEGACY_MASQ6: SetDef = set("masq6", &[Field::V6], false);
static LEGACY_MASQ: Legacy = Legacy {
    table: INET,
    chain: "masq-postrouting",
    sets: &[
        &LEGACY_MASQ4_SKIP,
        &LEGACY_MASQ6_SKIP,
        &LEGACY_MASQ4,
        &LEGACY_MASQ6,
    ],
};

/// Removes a legacy layout's chain and sets in `tx` (after the caller moved
/// their elements into the current layout in the same batch).
fn drop_legacy(tx: &mut Tx, l: &Legacy) {
    tx.flush_chain(l.table, l.chain);
    tx.delete_chain(l.table, l.chain);
    for set in l.sets {
        tx.delete_set(l.table, &set.name);
    }
}

/// Moves bridge `ipMasq`'s 0.1 elements into the current layout, if there
/// are any (one read when there are none).
pub(crate) fn upgrade_masq(sockets: &Sockets) -> Result<()> {
    upgrade(sockets, &LEGACY_MASQ, |nft, tx| {
        schema::ensure(nft, tx, &schema::MASQ)?;
        let mut via: BTreeMap<(IpAddr, String), Vec<IpNet>> = BTreeMap::new();
        for set in [&LEGACY_MASQ4, &LEGACY_MASQ6] {
            for e in nft.dump(INET, set)? {
                if let (Some(addr), Some(owner)) = (addr_at(&e.key, 0, set), owner_of(&e)) {
                    via.entry((addr, owner)).or_default();
                }
            }
        }
        for set in [&LEGACY_MASQ4_SKIP, &LEGACY_MASQ6_SKIP] {
            for e in nft.dump(INET, set)? {
                let (Some(addr), Some(net)) = (addr_at(&e.key, 0, set), field_range(&e, 1, set))
                else {
                    continue;
                };
                for ((a, _), nets) in via.range_mut((addr, String::new())..) {
                    if *a != addr {
                        break;
                    }
                    nets.push(net);
                }
            }
        }
        for ((addr, owner), nets) in via {
            let d = dispatch::ip_masq(addr.is_ipv4(), &nets);
            move_into(nft, tx, &schema::MASQ, &d, addr, &owner)?;
        }
        Ok(())
    })
}

/// Moves portmap's 0.1 masquerade elements into the current layout.
pub(crate) fn upgrade_portmap(sockets: &Sockets) -> Result<()> {
    upgrade(sockets, &LEGACY_PORTMAP, |nft, tx| {
        schema::ensure(nft, tx, &schema::PORTMAP)?;
        // (container address, owner) → the sources its DNATed traffic was
        // masqueraded from.
        let mut sources: BTreeMap<(IpAddr, String), Vec<IpNet>> = BTreeMap::new();
        for set in [&LEGACY_PM4_MASQ, &LEGACY_PM6_MASQ] {
            for e in nft.dump(INET, set)? {
                let width = field_width(set);
                let (Some(src), Some(addr), Some(owner)) = (
                    field_range(&e, 0, set),
                    addr_at(&e.key, width, set),
                    owner_of(&e),
                ) else {
                    continue;
                };
                sources.entry((addr, owner)).or_default().push(src);
            }
        }
        for ((addr, owner), srcs) in sources {
            let d = if srcs.iter().any(|s| s.prefix_len() == 0) {
                dispatch::pm_masq_all(addr.is_ipv4())
            } else if let Some(subnet) = srcs.iter().find(|s| !s.addr().is_loopback()) {
                dispatch::pm_hairpin(*subnet)
            } else {
                continue;
            };
            move_into(nft, tx, &schema::PORTMAP, &d, addr, &owner)?;
        }
        Ok(())
    })
}

/// Adds `owner`'s element for `addr` to `d`'s set (made if missing), and to
/// the owner's record first, as an ADD does, so its DEL finds it.
fn move_into(
    nft: &mut Nft,
    tx: &mut Tx,
    feature: &Skeleton,
    d: &Dispatch,
    addr: IpAddr,
    owner: &str,
) -> Result<()> {
    let elem = d.element(addr, owner);
    index::remember(feature, owner, &vec![(d.set.clone(), elem.key.clone())])?;
    dispatch::ensure(nft, tx, d)?;
    tx.add(INET, &d.set, vec![elem]);
    Ok(())
}

/// When `legacy`'s chain exists, `migrate` (in the batch that then drops
/// the legacy chain and sets); re-checked inside the transaction, so of two
/// processes upgrading at once one does it and the other finds it done.
fn upgrade(
    sockets: &Sockets,
    legacy: &Legacy,
    mut migrate: impl FnMut(&mut Nft, &mut Tx) -> Result<()>,
) -> Result<()> {
    if !read(sockets, |nft| nft.chain_exists(legacy.table, legacy.chain))? {
        return Ok(());
    }
    transact(sockets, |nft, tx| {
        if !nft.chain_exists(legacy.table, legacy.chain)? {
            return Ok(());
        }
        migrate(nft, tx)?;
        drop_legacy(tx, legacy);
        Ok(())
    })
}

/// Bytes per field of a legacy concatenation (each field a whole register).
fn field_width(set: &SetDef) -> usize {
    if set.key[0] == Field::V4 {
        4
    } else {
        16
    }
}

fn addr_at(key: &[u8], at: usize, set: &SetDef) -> Option<IpAddr> {
    let bytes = key.get(at..at + field_width(set))?;
    Some(match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
    })
}

/// Field `index` of an interval element as the prefix its range spans.
fn field_range(e: &Element, index: usize, set: &SetDef) -> Option<IpNet> {
    let at = index * field_width(set);
    let first = addr_at(&e.key, at, set)?;
    let last = addr_at(e.key_end.as_ref()?, at, set)?;
    let prefix = match (first, last) {
        (IpAddr::V4(f), IpAddr::V4(l)) => (u32::from(f) ^ u32::from(l)).leading_zeros(),
        (IpAddr::V6(f), IpAddr::V6(l)) => (u128::from(f) ^ u128::from(l)).leading_zeros(),
        _ => return None,
    };
    IpNet::new(first, u8::try_from(prefix).ok()?).ok()
}

#[cfg(test)]
#[path = "legacy_tests.rs"]
mod tests;
