//! The kernel side of `cnikit ipamd daemon --route-blocks`: the routes to other nodes'
//! blocks in the host's main table, each `dst via <node address>` with cnikit's own route
//! protocol number ([`PROTOCOL`]), and the node's own addresses to publish.
//!
//! The protocol number is the whole ownership model: a reconcile lists only routes of that
//! protocol, deletes only those, and adds without replacing, so a route someone else made
//! to the same destination is never touched (it is reported instead). The one other thing
//! it changes is a stale gateway address of another node's block on a local bridge
//! ([`clear_stale_gateways`]).

use crate::netlink::{ErrorKind, Netlink, ProtoRoute};
use ipamd::cluster::{block_gateway, BlockRoute, RouteSync, SyncOutcome};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// cnikit's route protocol (`ip route show proto 203`); unassigned in iproute2's
/// `rt_protos` and not used by the routing daemons listed there.
pub const PROTOCOL: u8 = 203;

/// Reconciles in the calling thread's network namespace (the daemon's: the host's).
#[derive(Debug, Default)]
pub struct KernelRoutes;

impl RouteSync for KernelRoutes {
    fn sync(&self, want: &[BlockRoute]) -> Result<SyncOutcome, String> {
        let mut nl = Netlink::open().map_err(|e| e.to_string())?;
        reconcile(&mut nl, want).map_err(|e| e.to_string())
    }
}

fn reconcile(nl: &mut Netlink, want: &[BlockRoute]) -> crate::netlink::Result<SyncOutcome> {
    let mut out = SyncOutcome::default();
    let mut reachable: BTreeMap<IpAddr, bool> = BTreeMap::new();
    let mut direct = |nl: &mut Netlink, via: IpAddr| -> crate::netlink::Result<bool> {
        if let Some(known) = reachable.get(&via) {
            return Ok(*known);
        }
        let ok = is_on_link(nl, via)?;
        reachable.insert(via, ok);
        Ok(ok)
    };
    // dst → the gateway to use, or None: keep a route that is there.
    let mut wanted: BTreeMap<IpNet, Option<IpAddr>> = BTreeMap::new();
    let mut unreachable = BTreeSet::new();
    for r in want {
        match r.via {
            Some(via) if !direct(nl, via)? => {
                unreachable.insert(via);
            }
            via => {
                wanted.insert(r.dst, via);
            }
        }
    }
    out.cleared = clear_stale_gateways(nl, want)?;
    let have = nl.routes_of_protocol(PROTOCOL)?;
    let mut kept = BTreeSet::new();
    for r in &have {
        let keep = match wanted.get(&r.dst) {
            Some(None) => true,
            Some(Some(via)) => r.gateway == Some(*via),
            None => false,
        };
        if keep && kept.insert(r.dst) {
            continue;
        }
        match nl.del_protocol_route(PROTOCOL, r) {
            Ok(()) => out.removed += 1,
            Err(e) if e.kind == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    for (dst, via) in &wanted {
        let Some(via) = via else { continue };
        if kept.contains(dst) {
            continue;
        }
        let route = ProtoRoute {
            dst: *dst,
            gateway: Some(*via),
        };
        match nl.add_protocol_route(PROTOCOL, &route) {
            Ok(()) => {
                out.added += 1;
                kept.insert(*dst);
            }
            Err(e) if e.kind == ErrorKind::AlreadyExists => out.taken.push(*dst),
            Err(e) => return Err(e),
        }
    }
    out.installed = kept.len();
    out.unreachable = unreachable.into_iter().collect();
    Ok(out)
}

/// Removes the gateway address a bridge here kept of a block another node owns now (the
/// block's first usable address with the block's prefix, which only a bridge network on
/// a cluster pool puts there: the bridge plugin never removes a gateway address). It
/// makes the block a connected network here, so the traffic to the new owner's pods
/// would go to the local bridge instead of the route. The addresses removed.
fn clear_stale_gateways(
    nl: &mut Netlink,
    others: &[BlockRoute],
) -> crate::netlink::Result<Vec<IpNet>> {
    let blocks: BTreeSet<IpNet> = others.iter().map(|r| r.dst).collect();
    let mut cleared = Vec::new();
    for (index, addr) in nl.all_addresses()? {
        if blocks.contains(&addr.trunc()) && addr.addr() == block_gateway(&addr.trunc()) {
            match nl.del_address(index, addr) {
                Ok(()) => cleared.push(addr),
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(cleared)
}

/// Whether `addr` is on a connected network here: the kernel's route to it has no gateway
/// (and is not one of this host's own addresses).
fn is_on_link(nl: &mut Netlink, addr: IpAddr) -> crate::netlink::Result<bool> {
    Ok(nl
        .route_to(addr)?
        .is_some_and(|r| r.gateway.is_none() && r.oif.is_some()))
}

/// The node's addresses to publish when `--node-address` is not given: per family, the
/// first global address on the link of that family's default route (IPv6 falls back to
/// the IPv4 default route's link). None found for either family is an error.
pub fn default_node_addresses() -> Result<Vec<IpAddr>, String> {
    let mut nl = Netlink::open().map_err(|e| e.to_string())?;
    let routes = nl.routes().map_err(|e| e.to_string())?;
    let default_link = |v4: bool| {
        routes
            .iter()
            .filter(|r| r.is_default() && r.dst.addr().is_ipv4() == v4)
            .find_map(|r| r.oif)
    };
    let v4_link = default_link(true);
    let mut found = Vec::new();
    for (v4, link) in [(true, v4_link), (false, default_link(false).or(v4_link))] {
        let Some(index) = link else { continue };
        let addrs = nl.addresses(index).map_err(|e| e.to_string())?;
        if let Some(a) = addrs
            .iter()
            .map(IpNet::addr)
            .find(|a| a.is_ipv4() == v4 && is_global(a))
        {
            found.push(a);
        }
    }
    if found.is_empty() {
        return Err("--route-blocks: no address on the interface of a default route to publish as this node's; give it with --node-address".into());
    }
    Ok(found)
}

/// Not loopback, link-local or unspecified: an address other nodes can route to.
fn is_global(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => !(v4.is_loopback() || v4.is_link_local() || v4.is_unspecified()),
        IpAddr::V6(v6) => !(v6.is_loopback() || v6.is_unspecified() || v6.is_unicast_link_local()),
    }
}

/// `--node-address` values: at most one per family.
pub fn check_node_addresses(addrs: &[IpAddr]) -> Result<(), String> {
    let v4 = addrs.iter().filter(|a| a.is_ipv4()).count();
    if v4 > 1 || addrs.len() - v4 > 1 {
        return Err("--node-address: give at most one IPv4 and one IPv6 address".into());
    }
    match addrs.iter().find(|a| !is_global(a)) {
        Some(a) => Err(format!(
            "--node-address {a}: other nodes cannot route to a loopback, link-local or unspecified address"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_are_one_per_family_and_routable() {
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(check_node_addresses(&[a("10.0.0.1"), a("fd00::1")]).is_ok());
        assert!(check_node_addresses(&[a("10.0.0.1"), a("10.0.0.2")]).is_err());
        assert!(check_node_addresses(&[a("fe80::1")]).is_err());
        assert!(check_node_addresses(&[a("127.0.0.1")]).is_err());
    }
}
