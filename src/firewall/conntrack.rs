//! Stale conntrack entries. A UDP flow tracked before its host port was
//! mapped keeps bypassing the new DNAT until it times out (the reference
//! plugin deletes such entries too). A UDP flow DNATed to a pod whose
//! mapping went keeps going to the pod's old address for as long as the
//! client sends (each datagram renews the entry), so DEL and GC delete
//! those ([`delete_dnated_udp`]; the reference does not: containernetworking
//! /plugins#1190, #1277). Deleted over ctnetlink: in one request with a
//! kernel-side filter where the kernel supports that (flush by filter), else
//! by dumping the table and deleting the matches one by one.

use super::socket::{Failure, Nfnl, Sockets};
use super::Result;
use crate::netlink::nla;
use netlink_packet_core::{DefaultNla, NLM_F_DUMP};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use std::net::{IpAddr, SocketAddr};

const NLA_F_NESTED: u16 = 0x8000;
const IPCTNL_MSG_CT_DELETE: u8 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
/// CTA_FILTER_F_* (kernel-internal names, stable ABI).
const FILTER_IP_SRC: u32 = 1;
const FILTER_IP_DST: u32 = 1 << 1;
const FILTER_PROTO_NUM: u32 = 1 << 3;
const FILTER_PROTO_SRC_PORT: u32 = 1 << 4;
const FILTER_PROTO_DST_PORT: u32 = 1 << 5;
const IPPROTO_UDP: u8 = 17;

/// One flush: UDP entries of one family whose original destination is
/// `port` (on `dst`, or on any address when None).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UdpPort {
    pub port: u16,
    pub dst: Option<IpAddr>,
    pub ipv6: bool,
}

/// The conntrack operation (repeating it is harmless).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op")]
pub enum Op {
    /// Deletes the entries of every target; the first failure is returned
    /// after all were tried.
    #[serde(rename = "conntrack-flush-udp")]
    FlushUdp { targets: Vec<UdpPort> },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::FlushUdp { .. } => "conntrack-flush-udp",
        }
    }

    /// The operation, in this process.
    pub fn run(&self, sockets: &Sockets) -> Result<()> {
        match self {
            Op::FlushUdp { targets } => flush_udp_here(sockets, targets),
        }
    }
}

/// The conntrack entries of the UDP flows one port mapping DNATed to a pod:
/// original destination port `port` (on `dst` when the mapping had a
/// hostIP), answered from `pod` (its address and container port). Flows of
/// the same host port that went elsewhere (to the host, to the pod that maps
/// it now) are not these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dnated {
    pub dst: Option<IpAddr>,
    pub port: u16,
    pub pod: SocketAddr,
}

/// Deletes the entries of every target; the first failure is returned
/// after all were tried.
pub(crate) fn delete_dnated_udp(sockets: &Sockets, targets: &[Dnated]) -> Result<()> {
    let matches: Vec<UdpMatch> = targets
        .iter()
        .map(|t| UdpMatch {
            v6: t.pod.is_ipv6(),
            dst: t.dst,
            port: t.port,
            reply_src: Some(t.pod),
        })
        .collect();
    delete_each(sockets, &matches)
}

/// Which UDP entries one delete takes: those of one family whose original
/// destination is `port` (on `dst`, any address when None) and, when
/// `reply_src` is set, whose reply comes from there.
#[derive(Debug, Clone, Copy)]
struct UdpMatch {
    v6: bool,
    dst: Option<IpAddr>,
    port: u16,
    reply_src: Option<SocketAddr>,
}

fn flush_udp_here(sockets: &Sockets, targets: &[UdpPort]) -> Result<()> {
    let matches: Vec<UdpMatch> = targets
        .iter()
        .map(|t| UdpMatch {
            v6: t.dst.map_or(t.ipv6, |d| d.is_ipv6()),
            dst: t.dst,
            port: t.port,
            reply_src: None,
        })
        .collect();
    delete_each(sockets, &matches)
}

fn delete_each(sockets: &Sockets, matches: &[UdpMatch]) -> Result<()> {
    if matches.is_empty() {
        return Ok(());
    }
    sockets.with(|nl| {
        let mut first_error = None;
        for m in matches {
            if let Err(e) = flush_one(nl, m) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    })
}

fn flush_one(nl: &mut Nfnl, m: &UdpMatch) -> Result<()> {
    let family = match m.v6 {
        false => NetfilterProtoFamily::IPv4,
        true => NetfilterProtoFamily::IPv6,
    };
    let what = match m.reply_src {
        None => format!("delete conntrack entries of udp port {}", m.port),
        Some(pod) => format!(
            "delete conntrack entries of udp port {} DNATed to {pod}",
            m.port
        ),
    };
    match nl.request(filtered_delete(family, m), 0) {
        Ok(_) => Ok(()),
        // Kernels without flush-by-filter refuse the request (EOPNOTSUPP) or
        // read the partial tuple as an exact one (EINVAL, ENOENT).
        Err(f)
            if matches!(
                f.errno(),
                Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOENT)
            ) =>
        {
            delete_matching(nl, family, m).map_err(|f| f.context(&what).into())
        }
        Err(f) => Err(f.context(&what).into()),
    }
}

fn message(family: NetfilterProtoFamily, inner: ConntrackMessage) -> NetfilterMessage {
    NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), inner)
}

/// IPCTNL_MSG_CT_DELETE with a tuple and CTA_FILTER: the kernel deletes
/// every match. Encoded by hand: the crate drops NLA_F_NESTED on attributes
/// it has no type for, and the kernel insists on it for CTA_FILTER.
fn filtered_delete(family: NetfilterProtoFamily, m: &UdpMatch) -> NetfilterMessage {
    let (orig_flags, orig) = filter_tuple(Side::Destination, m.dst, m.port);
    let mut attributes = vec![DefaultNla::new(CTA_TUPLE_ORIG | NLA_F_NESTED, orig)];
    let mut reply_flags = 0;
    if let Some(src) = m.reply_src {
        let (flags, reply) = filter_tuple(Side::Source, Some(src.ip()), src.port());
        reply_flags = flags;
        attributes.push(DefaultNla::new(CTA_TUPLE_REPLY | NLA_F_NESTED, reply));
    }
    let mut filter = nla(CTA_FILTER_ORIG_FLAGS, &orig_flags.to_ne_bytes());
    filter.extend(nla(CTA_FILTER_REPLY_FLAGS, &reply_flags.to_ne_bytes()));
    attributes.push(DefaultNla::new(CTA_FILTER | NLA_F_NESTED, filter));
    let inner = ConntrackMessage::Other {
        message_type: IPCTNL_MSG_CT_DELETE,
        attributes,
    };
    message(family, inner)
}

/// Which end of a tuple a filter names.
#[derive(Clone, Copy)]
enum Side {
    Source,
    Destination,
}

/// A filter tuple: UDP, `port` and, when given, `ip` on one `side`; with the
/// CTA_FILTER_F_* flags saying what the kernel compares.
fn filter_tuple(side: Side, ip: Option<IpAddr>, port: u16) -> (u32, Vec<u8>) {
    let (ip_flag, v4, v6, port_flag, port_attr) = match side {
        Side::Source => (
            FILTER_IP_SRC,
            CTA_IP_V4_SRC,
            CTA_IP_V6_SRC,
            FILTER_PROTO_SRC_PORT,
            CTA_PROTO_SRC_PORT,
        ),
        Side::Destination => (
            FILTER_IP_DST,
            CTA_IP_V4_DST,
            CTA_IP_V6_DST,
            FILTER_PROTO_DST_PORT,
            CTA_PROTO_DST_PORT,
        ),
    };
    let mut flags = FILTER_PROTO_NUM | port_flag;
    let mut tuple = Vec::new();
    if let Some(ip) = ip {
        flags |= ip_flag;
        let addr = match ip {
            IpAddr::V4(a) => nla(v4, &a.octets()),
            IpAddr::V6(a) => nla(v6, &a.octets()),
        };
        tuple.extend(nla(CTA_TUPLE_IP | NLA_F_NESTED, &addr));
    }
    let mut proto = nla(CTA_PROTO_NUM, &[IPPROTO_UDP]);
    proto.extend(nla(port_attr, &port.to_be_bytes()));
    tuple.extend(nla(CTA_TUPLE_PROTO | NLA_F_NESTED, &proto));
    (flags, tuple)
}

/// The fallback: dump, match in userspace, delete each by its tuple.
fn delete_matching(
    nl: &mut Nfnl,
    family: NetfilterProtoFamily,
    m: &UdpMatch,
) -> std::result::Result<(), Failure> {
    let entries = nl.request(message(family, ConntrackMessage::Get(vec![])), NLM_F_DUMP)?;
    for entry in entries {
        let Some((tuple, reply)) = tuples_of(&entry.decode()?) else {
            continue;
        };
        let answered_from = |src: SocketAddr| {
            reply
                .as_deref()
                .is_some_and(|r| matches(r, Side::Source, Some(src.ip()), src.port()))
        };
        if !matches(&tuple, Side::Destination, m.dst, m.port)
            || m.reply_src.is_some_and(|src| !answered_from(src))
        {
            continue;
        }
        let del = ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple)]);
        match nl.request(message(family, del), 0) {
            Err(f) if f.errno() != Some(libc::ENOENT) => return Err(f),
            _ => {}
        }
    }
    Ok(())
}

/// An entry's original tuple and, if it has one, its reply tuple.
fn tuples_of(msg: &NetfilterMessage) -> Option<(Vec<Tuple>, Option<Vec<Tuple>>)> {
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = &msg.inner else {
        return None;
    };
    let orig = attrs.iter().find_map(|a| match a {
        ConntrackAttribute::CtaTupleOrig(t) => Some(t.clone()),
        _ => None,
    })?;
    let reply = attrs.iter().find_map(|a| match a {
        ConntrackAttribute::CtaTupleReply(t) => Some(t.clone()),
        _ => None,
    });
    Some((orig, reply))
}

/// Whether `tuple` is UDP with `port` (and `ip`, when given) on `side`.
fn matches(tuple: &[Tuple], side: Side, ip: Option<IpAddr>, port: u16) -> bool {
    let (want_port, want_ip) = match side {
        Side::Source => (ProtoTuple::SourcePort(port), ip.map(IPTuple::SourceAddress)),
        Side::Destination => (
            ProtoTuple::DestinationPort(port),
            ip.map(IPTuple::DestinationAddress),
        ),
    };
    let mut udp = false;
    let mut port_ok = false;
    let mut ip_ok = want_ip.is_none();
    for t in tuple {
        match t {
            Tuple::Proto(p) => {
                udp |= p.contains(&ProtoTuple::Protocol(Protocol::Udp));
                port_ok |= p.contains(&want_port);
            }
            Tuple::Ip(ips) => ip_ok |= want_ip.as_ref().is_some_and(|w| ips.contains(w)),
            _ => {}
        }
    }
    udp && port_ok && ip_ok
}
