//! The pod's side of an attachment: its interface addressed and routed from an
//! IPAM result (IPv6 only where there is IPv6 to carry), CHECK's read-back of
//! it, and the host veth's name.

use super::pod_netns::open_netns;
use crate::cni::{CniResult, Code, Error, Request};
use crate::netlink::{
    link_local, random_bytes, sysctl, Link, NetNs, Netlink, Route as KernelRoute, VethPair,
    VethSpec, MAIN_TABLE,
};
use ipnet::{IpNet, Ipv6Net};
use std::net::IpAddr;

/// `veth` + 8 random hex digits, like the reference (fits IFNAMSIZ).
pub fn random_veth_name() -> String {
    format!("veth{:08x}", u32::from_be_bytes(random_bytes()))
}

/// Which request turns an interface's IPv6 link-local address from the kernel off
/// (IFLA_INET6_ADDR_GEN_MODE none; see `netlink/ipv6.rs` for when each can).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LinkLocalOff {
    /// A request of its own, before the up.
    #[default]
    BeforeUp,
    /// The request that brings it up: a veth end that cannot be ready in it (a pod end
    /// from `create_pod_veth`, dormant until then; `Netlink::set_up_without_link_local`).
    WithUp,
    /// The request that made the link already did (`LinkSetup::no_link_local`, folded
    /// into a child's rename).
    Done,
}

/// What an interface with IPv6 to carry gets before it goes up, and what is known of it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ipv6Setup<'a> {
    /// Duplicate address detection for its addresses (`enabledad`): `accept_dad` 1, and
    /// the addresses added without IFA_F_NODAD.
    pub dad: bool,
    /// `ndisc_notify`: going up, it sends an unsolicited neighbour advertisement for
    /// each of its addresses, so the LAN forgets the MAC a previous pod with the same
    /// address had (macvlan, ipvlan; why through /proc/sys: at `ipv6_sysctls`).
    pub ndisc_notify: bool,
    /// Where its IPv6 link-local address from the kernel goes off.
    pub link_local_off: LinkLocalOff,
    /// Its hardware address, when the caller has it ("aa:bb:cc:dd:ee:ff"); read from the
    /// kernel otherwise, for the link-local address of a pod with IPv6.
    pub mac: Option<&'a str>,
}

/// The first half of addressing and routing the container interface (the second is
/// [`route_iface`]; ptp puts its own routes between them): IPv6 made ready (or kept
/// off), the addresses, the link up.
///
/// Every interface the plugins address gets no IPv6 link-local address from the
/// kernel (IFLA_INET6_ADDR_GEN_MODE none, over netlink, before it goes up or, where it
/// cannot be ready before that request is done, with its up). One with no
/// IPv6 address or route to carry so has no IPv6 address at all: otherwise its
/// link-local address's DAD, router and MLD solicitations are multicast, which a bridge
/// floods to every port and every pod then handles — a cost of each new pod that grows
/// with the pods already there. One with IPv6 gets its link-local address from the
/// plugin, the kernel's EUI-64 one, and every IPv6 address without DAD (IPAM already
/// made them unique; a tentative address would drop the pod's first second of traffic)
/// unless `enabledad` asks for it: so no `/proc/sys` write and no visit to the pod's
/// netns for `accept_dad` or `disable_ipv6`, which spun on the RTNL at 32 pods at once.
pub fn address_iface(
    ns: &NetNs,
    nl: &mut Netlink,
    index: u32,
    ifname: &str,
    result: &CniResult,
    v6: Ipv6Setup,
) -> Result<(), Error> {
    if v6.link_local_off == LinkLocalOff::BeforeUp {
        nl.no_link_local(index)?;
    }
    // An IPv6 route (say ::/0 from IPAM's routes on an IPv4-only range) needs
    // IPv6 on the interface even without an IPv6 address of its own.
    let has_v6 = result.ips.iter().any(|ip| ip.address.addr().is_ipv6())
        || result.routes.iter().any(|r| r.dst.addr().is_ipv6());
    if has_v6 {
        if v6.dad || v6.ndisc_notify {
            ns.run(|| ipv6_sysctls(ifname, v6))??;
        }
        let mac = match v6.mac {
            Some(mac) => Some(mac.to_string()),
            None => nl.link_by_index(index)?.and_then(|l| l.mac),
        };
        let bytes = mac.as_deref().map(parse_mac).unwrap_or_default();
        add_first_ipv6(ns, nl, index, ifname, link_local(&bytes), !v6.dad)?;
    }
    for ip in &result.ips {
        match ip.address {
            IpNet::V6(addr) => nl.add_ipv6_address(index, addr, !v6.dad)?,
            IpNet::V4(_) => nl.add_address(index, ip.address)?,
        }
    }
    if v6.link_local_off == LinkLocalOff::WithUp {
        nl.set_up_without_link_local(index)?;
    } else {
        nl.set_up(index)?;
    }
    Ok(())
}

/// The second half, after [`address_iface`]: `result`'s routes through link
/// `index`, a gateway-less one via its family's gateway.
pub fn route_iface(nl: &mut Netlink, index: u32, result: &CniResult) -> Result<(), Error> {
    for route in &result.routes {
        let gw = route
            .gw
            .or_else(|| family_gateway(result, route.dst.addr()));
        nl.add_route(&kernel_route(route, gw, index))?;
    }
    Ok(())
}

/// "aa:bb:cc:dd:ee:ff" as bytes (empty when it is not one).
fn parse_mac(mac: &str) -> Vec<u8> {
    mac.split([':', '-'])
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<Vec<u8>, _>>()
        .unwrap_or_default()
}

/// The interface's first IPv6 address (its link-local one). In a netns whose
/// defaults have `disable_ipv6` 1 (`devconf_inherit_init_net` on a host without IPv6)
/// the kernel answers EACCES: IPv6 is turned on for this interface, as the plugins
/// always did before, and the address added again.
fn add_first_ipv6(
    ns: &NetNs,
    nl: &mut Netlink,
    index: u32,
    ifname: &str,
    addr: Ipv6Net,
    nodad: bool,
) -> Result<(), Error> {
    match nl.add_ipv6_address(index, addr, nodad) {
        Err(e) if e.errno == Some(libc::EACCES) => {
            let key = format!("net/ipv6/conf/{ifname}/disable_ipv6");
            ns.run(|| sysctl::set(&key, "0"))??;
            Ok(nl.add_ipv6_address(index, addr, nodad)?)
        }
        other => Ok(other?),
    }
}

/// The `/proc/sys` writes left for an interface with IPv6, both plain integer settings
/// (no RTNL, unlike `disable_ipv6`'s handler), made only when asked: `accept_dad` 1 for
/// `enabledad` (as the reference), and `ndisc_notify`. IPv6 has no netlink path for
/// either (the kernel's `inet6_set_link_af` takes only the token and the address
/// generation mode, not IFLA_INET6_CONF), unlike IPv4's arp_notify, which the plugins
/// set over netlink. `ndisc_notify` is written only for pods with IPv6 to carry, of the
/// plugins whose reference sets it; without it, a peer would keep a re-added macvlan
/// pod's old MAC until its neighbour probes fail, 5 s and more.
fn ipv6_sysctls(ifname: &str, v6: Ipv6Setup) -> Result<(), Error> {
    if v6.dad {
        sysctl::set(&format!("net/ipv6/conf/{ifname}/accept_dad"), "1")?;
    }
    if v6.ndisc_notify {
        sysctl::set(&format!("net/ipv6/conf/{ifname}/ndisc_notify"), "1")?;
    }
    Ok(())
}

fn family_gateway(result: &CniResult, like: IpAddr) -> Option<IpAddr> {
    result
        .ips
        .iter()
        .filter_map(|ip| ip.gateway)
        .find(|gw| gw.is_ipv4() == like.is_ipv4())
}

fn kernel_route(route: &crate::cni::Route, gw: Option<IpAddr>, oif: u32) -> KernelRoute {
    KernelRoute {
        dst: route.dst.trunc(),
        gateway: gw,
        oif: Some(oif),
        mtu: route.mtu,
        advmss: route.advmss,
        priority: route.priority,
        table: route.table,
        scope: route.scope,
        prefsrc: None,
    }
}

/// CHECK: `link` is of `kind` ("veth", "bridge", …).
pub fn expect_kind(link: &Link, kind: &str) -> Result<(), Error> {
    if link.kind.as_deref() != Some(kind) {
        return Err(Error::check_failed(format_args!(
            "{} is a {}, not a {kind}",
            link.name,
            link.kind.as_deref().unwrap_or("device without kind")
        )));
    }
    Ok(())
}

/// CHECK: `link` has the MAC a prevResult lists (none listed: any).
pub fn expect_mac(link: &Link, want: &str) -> Result<(), Error> {
    if !want.is_empty() && link.mac.as_deref() != Some(&want.to_ascii_lowercase()) {
        return Err(Error::check_failed(format_args!(
            "{} has MAC {}, prevResult says {want}",
            link.name,
            link.mac.as_deref().unwrap_or("none")
        )));
    }
    Ok(())
}

fn list(nets: &[IpNet]) -> String {
    if nets.is_empty() {
        return "none".into();
    }
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first interface of `result` named `ifname` inside `netns`.
pub fn container_iface_pos(result: &CniResult, ifname: &str, netns: &str) -> Option<usize> {
    result
        .interfaces
        .iter()
        .position(|i| i.name == ifname && i.sandbox == netns)
}

/// Refuse ADD when the interface name is taken (spec), with a message naming both.
pub fn ensure_ifname_free(nl: &mut Netlink, ifname: &str, netns: &str) -> Result<(), Error> {
    if nl.link_by_name(ifname)?.is_some() {
        return Err(Error::new(
            Code::InterfaceExists,
            format!("interface {ifname} already exists in netns {netns}"),
        ));
    }
    Ok(())
}

/// A pod's veth (bridge, ptp): CNI_IFNAME inside `ns` with MAC `mac` (None:
/// a random one) and a host end of a random name, a port of bridge `master`
/// when given; returns the host end's name and the pair. The pod end is
/// dormant until it comes up (see [`LinkLocalOff::WithUp`]).
pub fn create_pod_veth(
    (host, cont): (&mut Netlink, &mut Netlink),
    req: &Request,
    ns: &NetNs,
    mtu: Option<u32>,
    mac: Option<String>,
    master: Option<u32>,
) -> Result<(String, VethPair), Error> {
    let host_name = random_veth_name();
    let spec = VethSpec {
        host_name: host_name.clone(),
        peer_name: req.ifname().to_string(),
        peer_netns: ns,
        mtu,
        peer_mac: mac,
        master,
    };
    let pair = host
        .create_veth(spec)
        .map_err(|e| ifname_taken_or(cont, req, e))?;
    Ok((host_name, pair))
}

/// A create in the container's netns failed: when the interface name is taken
/// there (EEXIST), say so with the spec's code. Asked only after the create
/// failed, as the reference does, so a successful ADD pays no lookup.
fn ifname_taken_or(nl: &mut Netlink, req: &Request, failed: crate::netlink::Error) -> Error {
    if failed.errno == Some(libc::EEXIST) {
        if let Err(taken) = ensure_ifname_free(nl, req.ifname(), req.netns()) {
            return taken;
        }
    }
    failed.into()
}

/// CHECK's view of the container interface: where prevResult lists it, and
/// the link as it is in the netns (with a socket there for further reads).
pub struct ContainerLink {
    pub pos: usize,
    pub nl: Netlink,
    pub link: Link,
}

/// [`find_container_link`], which must be a link of `kind` with the MAC prevResult gave it.
pub fn find_container_link_as_made(
    req: &Request,
    prev: &CniResult,
    kind: &str,
) -> Result<ContainerLink, Error> {
    let found = find_container_link(req, prev)?;
    expect_kind(&found.link, kind)?;
    expect_mac(&found.link, &prev.interfaces[found.pos].mac)?;
    Ok(found)
}

pub fn find_container_link(req: &Request, prev: &CniResult) -> Result<ContainerLink, Error> {
    let pos = container_iface_pos(prev, req.ifname(), req.netns()).ok_or_else(|| {
        Error::invalid_config(format!(
            "CHECK: prevResult has no interface {} in {}",
            req.ifname(),
            req.netns()
        ))
    })?;
    let ns = open_netns(req.netns())?;
    let mut nl = Netlink::open_in(&ns)?;
    let link = nl.link_by_name(req.ifname())?.ok_or_else(|| {
        Error::check_failed(format_args!(
            "interface {} is missing in {}",
            req.ifname(),
            req.netns()
        ))
    })?;
    Ok(ContainerLink { pos, nl, link })
}

impl ContainerLink {
    /// CHECK: every address of `result` that belongs to this interface is on the
    /// link, and every route is in the table.
    pub fn check_iface_state(&mut self, result: &CniResult) -> Result<(), Error> {
        let ifname = &self.link.name;
        let present = self.nl.addresses(self.link.index)?;
        for ip in result
            .ips
            .iter()
            .filter(|ip| ip.interface.is_none_or(|i| i == self.pos))
        {
            if !present.contains(&ip.address) {
                return Err(Error::check_failed(format_args!(
                    "{ifname} lacks address {} (has {})",
                    ip.address,
                    list(&present)
                )));
            }
        }
        let routes = self.nl.routes()?;
        // `routes()` dumps the main table; routes for other tables are not verified.
        for want in result
            .routes
            .iter()
            .filter(|r| r.table.is_none_or(|t| t == MAIN_TABLE))
        {
            let gw = want.gw.or_else(|| family_gateway(result, want.dst.addr()));
            let found = routes
                .iter()
                .any(|r| r.dst == want.dst.trunc() && r.gateway == gw);
            if !found {
                return Err(Error::check_failed(format_args!(
                    "route to {}{} is missing in the container",
                    want.dst,
                    gw.map(|g| format!(" via {g}")).unwrap_or_default()
                )));
            }
        }
        Ok(())
    }
}
