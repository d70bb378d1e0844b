//! vrf: a chained plugin that puts the pod's interface `CNI_IFNAME` into a VRF device
//! `vrfname` in the pod's netns (made, with `table` or the first table no VRF there
//! uses, when it is missing), as the reference does. Enslaving cycles the interface,
//! which drops its IPv6 addresses and its routes: the global IPv6 addresses are added
//! back and its routes of the main table re-made in the VRF's table. DEL takes the
//! interface out and removes the VRF once no interface is left in it. The result is
//! prevResult.

use crate::cni::{CniResult, Error, Plugin, Request};
use crate::netlink::{Link, NetNs, Netlink, TableRoute, MAIN_TABLE};
use crate::plugins::conf_keys::config_ifname;
use crate::plugins::pod_netns::{container_netns_for_del, open_netns};
use ipnet::IpNet;
use serde::Deserialize;
use std::time::Duration;

pub struct Vrf;

/// `IFLA_INFO_KIND` of a VRF device.
const KIND: &str = "vrf";

/// The plugin's keys as the reference decodes them (`table` a Go uint32: 0 is unset).
#[derive(Debug, Default, Deserialize)]
pub(super) struct Conf {
    #[serde(default)]
    vrfname: Option<String>,
    #[serde(default)]
    table: Option<u32>,
}

/// The configuration, validated.
#[derive(Debug, PartialEq)]
pub(super) struct Loaded {
    pub vrf: String,
    /// None: the first free table (ADD), any table (an existing VRF).
    pub table: Option<u32>,
}

impl Conf {
    pub(super) fn load(req: &Request) -> Result<Loaded, Error> {
        let conf: Conf = req.conf.typed()?;
        let vrf = conf.vrfname.filter(|n| !n.is_empty()).ok_or_else(|| {
            Error::invalid_config("configuration is expected to have a valid vrf name (vrfname)")
        })?;
        config_ifname("vrfname", &vrf)?;
        Ok(Loaded {
            vrf,
            table: conf.table.filter(|t| *t != 0),
        })
    }
}

/// Chained only: the interface and its result come from the plugins before.
fn prev_result(req: &Request) -> Result<&CniResult, Error> {
    req.conf.prev_result.as_ref().ok_or_else(|| {
        Error::invalid_config("vrf: missing prevResult from earlier plugin (vrf is chained)")
    })
}

impl Plugin for Vrf {
    // The reference vrf never decodes CNI_ARGS: `reads_cni_args` false.

    // ---------------------------------------------------------------- ADD
    /// The VRF found (its table must be `table` when one is configured) or made and
    /// brought up, then the interface enslaved with its addresses and routes restored.
    /// A failure takes the interface out again and removes a VRF this call made.
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = Conf::load(req)?;
        let result = prev_result(req)?.clone();
        let ns = open_netns(req.netns())?;
        let mut nl = Netlink::open_in(&ns)?;
        let link = nl.link_by_name(req.ifname())?.ok_or_else(|| {
            Error::invalid_config(format!(
                "interface {} is missing in {}",
                req.ifname(),
                req.netns()
            ))
        })?;
        if let Some(master) = link.master {
            let name = nl.describe(master);
            return Err(Error::invalid_config(format!(
                "interface {} has already a master set: {name}",
                link.name
            )));
        }
        let (vrf, table, made) = match find_vrf(&mut nl, &conf.vrf)? {
            Some((vrf, table)) => {
                if conf.table.is_some_and(|t| t != table) {
                    return Err(Error::invalid_config(format!(
                        "VRF {} already exists with a different routing table {table}",
                        conf.vrf
                    )));
                }
                (vrf, table, false)
            }
            None => {
                let table = match conf.table {
                    Some(t) => t,
                    None => free_table(&mut nl)?,
                };
                let vrf = nl.create_vrf(&conf.vrf, table)?;
                (vrf, table, true)
            }
        };
        let outcome = (|| {
            if made {
                nl.set_up(vrf.index)?;
            }
            enslave(&mut nl, &link, &vrf, table)
        })();
        if let Err(e) = outcome {
            undo(&mut nl, &link, &vrf, made);
            return Err(e);
        }
        Ok(result)
    }

    // ---------------------------------------------------------------- CHECK
    /// As the reference: the VRF exists in the pod and CNI_IFNAME is in it.
    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        prev_result(req)?;
        let ns = open_netns(req.netns())?;
        let mut nl = Netlink::open_in(&ns)?;
        let Some((vrf, _)) = find_vrf(&mut nl, &conf.vrf)? else {
            return Err(Error::check_failed(format_args!(
                "VRF {} is missing in {}",
                conf.vrf,
                req.netns()
            )));
        };
        match nl.link_by_name(req.ifname())? {
            Some(l) if l.master == Some(vrf.index) => Ok(()),
            _ => Err(Error::check_failed(format_args!(
                "failed to find {} associated to vrf {}",
                req.ifname(),
                conf.vrf
            ))),
        }
    }

    // ---------------------------------------------------------------- DEL
    /// CNI_IFNAME out of the VRF, then the VRF removed when nothing is left in it. A
    /// netns, VRF or interface that is gone is done; an interface in another master
    /// stays there. A configuration DEL cannot use (no `vrfname`) means the VRF the
    /// interface is in, if any.
    fn del(&self, req: &Request) -> Result<(), Error> {
        let wanted = req.conf_or_del_fallback(|r| Conf::load(r).map(|c| Some(c.vrf)), |_| None);
        let wanted = wanted?;
        let Some(ns) = container_netns_for_del(req.netns(), "it alone")? else {
            return Ok(());
        };
        del_in(&ns, req.ifname(), wanted.as_deref())
    }

    // ---------------------------------------------------------------- STATUS
    /// The reference has none: always ready.
    fn status(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    // ---------------------------------------------------------------- GC
    /// Nothing to collect: the VRFs live in the pods' netns and go with them.
    fn gc(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }
}

/// The VRF device `name` and its table; None when there is no link of that name, an
/// error when there is one that is not a VRF.
fn find_vrf(nl: &mut Netlink, name: &str) -> Result<Option<(Link, u32)>, Error> {
    let Some(link) = nl.link_by_name(name)? else {
        return Ok(None);
    };
    if !link.is_kind(KIND) {
        return Err(Error::invalid_config(format!(
            "link {name} is a {}, not a VRF",
            link.kind.as_deref().unwrap_or("device without kind")
        )));
    }
    let table = nl.vrf_table(link.index)?.unwrap_or(0);
    Ok(Some((link, table)))
}

/// The reference's choice: the lowest table from 1 up that no VRF in the netns uses.
fn free_table(nl: &mut Netlink) -> Result<u32, Error> {
    let mut taken = Vec::new();
    for link in nl.links()?.iter().filter(|l| l.is_kind(KIND)) {
        taken.extend(nl.vrf_table(link.index)?);
    }
    Ok(first_free(&taken))
}

pub(super) fn first_free(taken: &[u32]) -> u32 {
    (1..u32::MAX).find(|t| !taken.contains(t)).unwrap_or(0)
}

/// The global IPv6 addresses of link `index` (the ones enslaving drops).
fn global_v6(nl: &mut Netlink, index: u32) -> Result<Vec<IpNet>, Error> {
    let all = nl.addresses(index)?;
    Ok(all.into_iter().filter(is_global_v6).collect())
}

pub(super) fn is_global_v6(net: &IpNet) -> bool {
    match net {
        IpNet::V6(n) => {
            let a = n.addr();
            !(a.is_loopback() || (a.segments()[0] & 0xffc0) == 0xfe80)
        }
        IpNet::V4(_) => false,
    }
}

/// The link's routes of the main table of universe scope (not the local and connected
/// ones the kernel makes), as the reference saves them before enslaving.
fn saved_routes(nl: &mut Netlink, index: u32) -> Result<Vec<TableRoute>, Error> {
    let universe: Vec<_> = nl
        .routes()?
        .into_iter()
        .filter(|r| r.oif == Some(index) && r.scope == Some(0))
        .map(|r| (r.dst, r.gateway))
        .collect();
    Ok(nl
        .all_routes()?
        .into_iter()
        .filter(|r| r.table == MAIN_TABLE && r.oif == Some(index))
        .filter(|r| universe.contains(&(r.dst, r.gateway)))
        .collect())
}

/// Enslave `link` to `vrf`, then add back the global IPv6 addresses it lost (waiting,
/// as the reference does, for each one's local route in the VRF's table) and re-make
/// its saved routes in that table.
fn enslave(nl: &mut Netlink, link: &Link, vrf: &Link, table: u32) -> Result<(), Error> {
    let before = global_v6(nl, link.index)?;
    let routes = saved_routes(nl, link.index)?;
    nl.set_master(link.index, vrf.index)?;
    let after = global_v6(nl, link.index)?;
    for addr in before.iter().filter(|a| !after.contains(a)) {
        nl.add_address(link.index, *addr)?;
        wait_for_local_route(nl, link, *addr, table)?;
    }
    for route in &routes {
        nl.replace_route(&route.in_table(table))?;
    }
    Ok(())
}

/// Up to about 2.5 s (10 ms doubling, 8 retries), as the reference waits: a route may
/// not name an address as its source before the address is usable.
fn wait_for_local_route(
    nl: &mut Netlink,
    link: &Link,
    addr: IpNet,
    table: u32,
) -> Result<(), Error> {
    let host = IpNet::new(addr.addr(), 128).unwrap_or(addr);
    for retry in 0..=8u32 {
        let routes = nl.all_routes()?;
        if routes
            .iter()
            .any(|r| r.table == table && r.dst == host && r.oif == Some(link.index))
        {
            return Ok(());
        }
        if retry < 8 {
            std::thread::sleep(Duration::from_millis(10 << retry));
        }
    }
    Err(Error::new(
        crate::cni::Code::Kernel,
        format!(
            "{} has no local route for {addr} in table {table} after enslaving",
            link.name
        ),
    ))
}

/// After a failed ADD: the interface out of the VRF, and the VRF gone if this call made it.
fn undo(nl: &mut Netlink, link: &Link, vrf: &Link, made: bool) {
    if let Err(e) = nl.set_nomaster(link.index) {
        eprintln!("cleanup after failed ADD: {e}");
    }
    if made {
        if let Err(e) = nl.delete_link(vrf.index) {
            eprintln!("cleanup after failed ADD: {e}");
        }
    }
}

/// DEL inside the pod's netns: `wanted` is the VRF's name, None for "the one
/// `ifname` is in".
fn del_in(ns: &NetNs, ifname: &str, wanted: Option<&str>) -> Result<(), Error> {
    let mut nl = Netlink::open_in(ns)?;
    let link = nl.link_by_name(ifname)?;
    let vrf = match wanted {
        Some(name) => match nl.link_by_name(name)? {
            Some(v) if v.is_kind(KIND) => v,
            Some(_) => {
                eprintln!("DEL: {name} is not a VRF; leaving it alone");
                return Ok(());
            }
            None => return Ok(()),
        },
        None => match link.as_ref().and_then(|l| l.master) {
            Some(m) => match nl.link_by_index(m)? {
                Some(v) if v.is_kind(KIND) => v,
                _ => return Ok(()),
            },
            None => return Ok(()),
        },
    };
    if let Some(l) = link.filter(|l| l.master == Some(vrf.index)) {
        match nl.set_nomaster(l.index) {
            Err(e) if e.is_not_found() => {}
            other => other?,
        }
    }
    let left = nl.links()?.iter().any(|l| l.master == Some(vrf.index));
    if !left {
        match nl.delete_link(vrf.index) {
            Err(e) if e.is_not_found() => {}
            other => other?,
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "vrf_tests.rs"]
mod tests;
