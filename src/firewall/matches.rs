//! Match expressions the layout's rules share: the family, and addresses
//! against a prefix.

use super::expr::{
    and_mask, cmp, meta_load, payload, reg_at, Expr, NETWORK_HEADER, NFPROTO_IPV4, NFPROTO_IPV6,
};
use ipnet::IpNet;
use netlink_packet_netfilter::nftables::{MetaKey, Operator};
use std::net::IpAddr;

pub(crate) fn family_of(net: &IpNet) -> u8 {
    if net.addr().is_ipv4() {
        NFPROTO_IPV4
    } else {
        NFPROTO_IPV6
    }
}

pub(crate) enum Side {
    Source,
    Destination,
}

/// `ip saddr|daddr <net>` (`ip6` alike): the address, masked to the prefix,
/// equals the network.
pub(crate) fn prefix_match(nfproto: u8, side: Side, net: IpNet) -> Vec<Expr> {
    let (alen, saddr, daddr) = addr_layout(nfproto);
    let at = match side {
        Side::Source => saddr,
        Side::Destination => daddr,
    };
    let octets = |a: IpAddr| match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut r = vec![payload(NETWORK_HEADER, at, alen, reg_at(0))];
    if net.prefix_len() < net.max_prefix_len() {
        r.push(and_mask(&octets(net.netmask())));
    }
    r.push(cmp(Operator::Equal, &octets(net.network())));
    r
}

pub(crate) fn is_family(nfproto: u8) -> Vec<Expr> {
    vec![
        meta_load(MetaKey::Nfproto, reg_at(0)),
        cmp(Operator::Equal, &[nfproto]),
    ]
}

/// Where the family keeps its addresses in the network header: (length,
/// source offset, destination offset).
pub(crate) fn addr_layout(nfproto: u8) -> (u32, u32, u32) {
    if nfproto == NFPROTO_IPV4 {
        (4, 12, 16)
    } else {
        (16, 8, 24)
    }
}
