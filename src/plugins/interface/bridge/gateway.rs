//! The bridge as gateway: gateway addresses (on the bridge, or on a
//! `<bridge>.<vid>` veth for a VLAN), default routes, forwarding.

use super::port::{port_vlans, PortVlans};
use super::Conf;
use crate::cni::{CniResult, Code, Error, Route};
use crate::netlink::{sysctl, Link, NetNs, Netlink, VethSpec};
use crate::plugins::pod_interface::random_veth_name;
use ipnet::IpNet;
use std::net::IpAddr;

/// isGateway: gateway-less IPs get the subnet's first address as gateway;
/// isDefaultGateway: add a default route per family via that gateway.
pub(super) fn apply_gateways(conf: &Conf, result: &mut CniResult) {
    if !conf.is_gateway {
        return;
    }
    for ip in &mut result.ips {
        if ip.gateway.is_none() {
            ip.gateway = first_host(ip.address);
        }
    }
    if !conf.is_default_gateway {
        return;
    }
    let gateways: Vec<IpAddr> = result.ips.iter().filter_map(|ip| ip.gateway).collect();
    for gw in gateways {
        let default: IpNet = if gw.is_ipv4() {
            IpNet::new(IpAddr::from([0u8; 4]), 0)
        } else {
            IpNet::new(IpAddr::from([0u16; 8]), 0)
        }
        .unwrap_or_default();
        let exists = result.routes.iter().any(|r| r.dst == default);
        if !exists {
            result.routes.push(Route::new(default, Some(gw)));
        }
    }
}

/// The subnet's network address + 1, as the reference computes the gateway
/// (ipnet's `hosts()` would give the IPv6 subnet-router anycast address).
fn first_host(net: IpNet) -> Option<IpAddr> {
    match net.trunc().network() {
        IpAddr::V4(a) => u32::from(a)
            .checked_add(1)
            .map(|n| IpAddr::from(n.to_be_bytes())),
        IpAddr::V6(a) => u128::from(a)
            .checked_add(1)
            .map(|n| IpAddr::from(n.to_be_bytes())),
    }
}

/// Put each family's gateway on the bridge (idempotent; safe when ADDs race)
/// and enable forwarding. With forceAddress, an older gateway in the same
/// family is replaced; without it, a conflicting one is an error.
pub(super) fn gateway_on_bridge(
    host: &mut Netlink,
    conf: &Conf,
    bridge: &Link,
    result: &CniResult,
) -> Result<(), Error> {
    let gw_link = gateway_link(host, conf, bridge)?;
    let bridge = &gw_link;
    // One dump per family that has a gateway, not one of all families: a
    // family's own dump does not wait for the RTNL on recent kernels.
    let mut present = Vec::new();
    for ipv4 in [true, false] {
        if result
            .ips
            .iter()
            .any(|ip| ip.gateway.is_some_and(|g| g.is_ipv4() == ipv4))
        {
            present.extend(host.family_addresses(bridge.index, ipv4)?);
        }
    }
    for ip in &result.ips {
        let Some(gw) = ip.gateway else { continue };
        let want = IpNet::new(gw, ip.address.prefix_len())
            .map_err(|e| Error::new(Code::Internal, e.to_string()))?;
        if present.contains(&want) {
            continue;
        }
        for other in present
            .iter()
            .filter(|a| a.addr().is_ipv4() == gw.is_ipv4() && a.contains(&gw))
        {
            if !conf.force_address {
                return Err(Error::new(
                    Code::Kernel,
                    format!(
                        "{} already has address {other}, not the gateway {want}; set forceAddress to replace it",
                        bridge.name
                    ),
                ));
            }
            host.del_address(bridge.index, *other)?;
        }
        if gw.is_ipv6() {
            // A tentative gateway would black-hole the first second of traffic.
            sysctl::set(&format!("net/ipv6/conf/{}/accept_dad", bridge.name), "0")?;
        }
        host.add_address(bridge.index, want)?;
        sysctl::enable_forwarding(gw.is_ipv4())?;
    }
    Ok(())
}

/// The link that carries the gateway: the bridge itself, or with `vlan` a
/// veth `<bridge>.<vid>` whose peer is an untagged port of that VLAN. Frames
/// of a VLAN reach the bridge device tagged, so an address on the bridge is
/// unreachable from the VLAN; this is the reference's layout, and unlike an
/// 802.1q device it needs no VLAN support in the kernel beyond filtering.
fn gateway_link(host: &mut Netlink, conf: &Conf, bridge: &Link) -> Result<Link, Error> {
    let Some(vid) = conf.vlan else {
        return Ok(bridge.clone());
    };
    let name = format!("{}.{vid}", conf.bridge);
    crate::cni::env::validate_ifname(&name).map_err(|why| {
        Error::invalid_config(format!(
            "VLAN gateway interface name {name:?} {why}; use a shorter bridge name"
        ))
    })?;
    let (index, peer, created) = match host.link_by_name(&name)? {
        Some(link) => (link.index, link.link, false),
        None => {
            let here = NetNs::current()?;
            let created = host.create_veth(VethSpec {
                host_name: name.clone(),
                peer_name: random_veth_name(),
                peer_netns: &here,
                mtu: conf.mtu,
                peer_mac: None,
                master: None,
            });
            match created {
                Ok(pair) => (pair.host_index, Some(pair.peer_index), true),
                // A concurrent ADD made it first: wire it up below all the same.
                Err(e) if e.kind == crate::netlink::ErrorKind::AlreadyExists => {
                    let link = host.link_by_name(&name)?.ok_or_else(|| gone(&name))?;
                    (link.index, link.link, false)
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let peer = peer.ok_or_else(|| gone(&name))?;
    // Idempotent, so also re-applied to an existing link: a half-made one
    // (an ADD that died midway) is repaired instead of used as it is.
    let wired = wire_vlan_gateway(host, conf, bridge, vid, index, peer);
    if let (Err(_), true) = (&wired, created) {
        let _ = host.delete_link(index);
    }
    wired?;
    host.link_by_index(index)?.ok_or_else(|| gone(&name))
}

fn gone(name: &str) -> Error {
    Error::new(
        Code::Kernel,
        format!("{name} disappeared while being set up"),
    )
}

/// The `<bridge>.<vid>` end up, its peer an untagged PVID port of `vid`.
fn wire_vlan_gateway(
    host: &mut Netlink,
    conf: &Conf,
    bridge: &Link,
    vid: u16,
    index: u32,
    peer: u32,
) -> Result<(), Error> {
    host.set_master(peer, bridge.index)?;
    let vlans = PortVlans {
        vlan: Some(vid),
        trunk: &[],
        preserve_default: conf.preserve_default_vlan,
    };
    port_vlans(host, bridge, peer, &vlans)?;
    host.set_up(peer)?;
    host.set_up(index)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::first_host;

    #[test]
    fn gateway_is_network_plus_one() {
        let gw = |net: &str| first_host(net.parse().unwrap()).unwrap().to_string();
        assert_eq!(gw("10.1.2.77/24"), "10.1.2.1");
        assert_eq!(gw("fd00:1::42/64"), "fd00:1::1");
        assert_eq!(gw("10.9.0.0/16"), "10.9.0.1");
    }
}
