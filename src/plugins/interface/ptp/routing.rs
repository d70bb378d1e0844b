//! ptp's routing, as the reference lays it out. In the pod every
//! destination, its own subnet included, is reached through the gateway,
//! which is on-link by a /32 (/128) route of its own: the kernel's route to
//! the subnet goes. On the host, the host end of the veth carries the
//! gateway address (/32, /128) and a host route to the pod's address.

use crate::cni::{CniResult, Code, Error};
use crate::netlink::{link_local, sysctl, Netlink, Route, VethPair};
use ipnet::IpNet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

const SCOPE_UNIVERSE: u8 = 0;
const SCOPE_LINK: u8 = 253;
const SCOPE_HOST: u8 = 254;

/// One address of the pod and the gateway it is routed through.
#[derive(Debug)]
pub(super) struct Hop {
    pub address: IpNet,
    pub gateway: IpAddr,
}

/// Every address of `result` with its gateway. ptp routes everything
/// through the gateway, so IPAM must give one per address (host-local and
/// ipamd always do); refused before any link is made.
pub(super) fn hops(result: &CniResult) -> Result<Vec<Hop>, Error> {
    if result.ips.is_empty() {
        return Err(Error::new(
            Code::Delegate,
            "IPAM plugin returned no IP addresses",
        ));
    }
    result
        .ips
        .iter()
        .map(|ip| match ip.gateway {
            Some(gw) if gw.is_ipv4() == ip.address.addr().is_ipv4() => Ok(Hop {
                address: ip.address,
                gateway: gw,
            }),
            Some(gw) => Err(Error::new(
                Code::Delegate,
                format!(
                    "IPAM gave {} the gateway {gw} of another address family",
                    ip.address
                ),
            )),
            None => Err(Error::new(
                Code::Delegate,
                format!(
                    "IPAM gave {} no gateway; ptp routes the pod through its gateway",
                    ip.address
                ),
            )),
        })
        .collect()
}

/// IP forwarding on the host, for each family the pod has (as the reference).
pub(super) fn enable_forwarding(hops: &[Hop]) -> Result<(), Error> {
    for v4 in [true, false] {
        if hops.iter().any(|h| h.address.addr().is_ipv4() == v4) {
            sysctl::enable_forwarding(v4)?;
        }
    }
    Ok(())
}

/// The host end's IPv6, before it goes up (the kernel gives it no link-local address:
/// see `Netlink::set_up_with_alias`). With an IPv6 gateway to carry, no router
/// advertisements (the reference's setting: the plugin owns its routes), written only
/// when the end would take them (`accept_ra` 2, or 1 while not forwarding: ptp has
/// turned forwarding on, which new links inherit, so seldom); without, no IPv6 address.
pub(super) fn prepare_host_end(name: &str, pair: &VethPair, hops: &[Hop]) -> Result<(), Error> {
    if pair.host_takes_router_adverts && hops.iter().any(|h| h.gateway.is_ipv6()) {
        sysctl::set(&format!("net/ipv6/conf/{name}/accept_ra"), "0")?;
    }
    Ok(())
}

/// How long the pod's IPv6 addresses may stay tentative: with DAD off only
/// the kernel's work queue has to run (the reference, with DAD on, waits 5 s).
const SETTLE: Duration = Duration::from_secs(5);

/// Waits until no IPv6 address of link `index` (up, addressed) is
/// tentative: ptp's routes name the address as preferred source, which the
/// kernel refuses for a tentative one.
pub(super) fn settle_ipv6(nl: &mut Netlink, index: u32, hops: &[Hop]) -> Result<(), Error> {
    if !hops.iter().any(|h| h.address.addr().is_ipv6()) {
        return Ok(());
    }
    let deadline = Instant::now() + SETTLE;
    while nl.has_tentative_address(index)? {
        if Instant::now() > deadline {
            return Err(Error::new(
                Code::Kernel,
                format!("the pod's IPv6 addresses are still tentative after {SETTLE:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// `ip` as a one-address network (/32 or /128).
fn single(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

/// In the pod, on link `index` (addressed and up): per address, the kernel's
/// route to its subnet replaced by one via the gateway, the gateway itself
/// on-link (scope link), both with the address as preferred source.
pub(super) fn route_pod(nl: &mut Netlink, index: u32, hops: &[Hop]) -> Result<(), Error> {
    for hop in hops {
        let subnet = hop.address.trunc();
        let kernels = Route {
            oif: Some(index),
            ..Route::new(subnet)
        };
        // A /32 address has no such route, nor has a second address in a
        // subnet whose route an earlier one took away.
        match nl.del_route(&kernels) {
            Err(e) if e.is_not_found() => {}
            other => other?,
        }
        let src = Some(hop.address.addr());
        let to_gateway = Route {
            oif: Some(index),
            scope: Some(SCOPE_LINK),
            prefsrc: src,
            ..Route::new(single(hop.gateway))
        };
        let to_subnet = Route {
            gateway: Some(hop.gateway),
            oif: Some(index),
            scope: Some(SCOPE_UNIVERSE),
            prefsrc: src,
            ..Route::new(subnet)
        };
        nl.add_route(&to_gateway)?;
        nl.add_route(&to_subnet)?;
    }
    Ok(())
}

/// On the host, on the host end: per address, the gateway as a /32 (/128) address and
/// a host-scoped route to the pod's address. With an IPv6 gateway, first its link-local
/// address (the kernel's EUI-64 one), which its neighbour probes of the pod come from;
/// IPv6 addresses without DAD, which would leave the gateway tentative, so unanswered,
/// for the pod's first second, and multicast its solicitation.
pub(super) fn route_host(nl: &mut Netlink, pair: &VethPair, hops: &[Hop]) -> Result<(), Error> {
    let index = pair.host_index;
    if hops.iter().any(|h| h.gateway.is_ipv6()) {
        let mac = pair.host_hw.map(Vec::from).unwrap_or_default();
        nl.add_ipv6_address(index, link_local(&mac), true)?;
    }
    for hop in hops {
        match single(hop.gateway) {
            IpNet::V6(gw) => nl.add_ipv6_address(index, gw, true)?,
            gw => nl.add_address(index, gw)?,
        }
        let to_pod = Route {
            oif: Some(index),
            scope: Some(SCOPE_HOST),
            ..Route::new(single(hop.address.addr()))
        };
        nl.add_route(&to_pod)?;
    }
    Ok(())
}

/// CHECK: the route to each address's subnet goes via its gateway (the
/// reference checks that the subnet has a route).
pub(super) fn check_pod_routes(
    nl: &mut Netlink,
    result: &CniResult,
    pos: usize,
) -> Result<(), Error> {
    let routes = nl.routes()?;
    let ips = result
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == pos));
    for ip in ips {
        let subnet = ip.address.trunc();
        let found = routes
            .iter()
            .any(|r| r.dst == subnet && (ip.gateway.is_none() || r.gateway == ip.gateway));
        if !found {
            return Err(Error::check_failed(format_args!(
                "route to {subnet}{} is missing in the container",
                ip.gateway.map(|g| format!(" via {g}")).unwrap_or_default()
            )));
        }
    }
    Ok(())
}
