//! Stale conntrack entries. A UDP flow tracked before its host port was
//! mapped keeps bypassing the new DNAT until it times out (the reference
//! plugin deletes such entries too). Deleted over ctnetlink: in one request
//! with a kernel-side filter where the kernel supports that (flush by
//! filter), else by dumping the table and deleting the matches one by one.

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
use std::net::IpAddr;

const NLA_F_NESTED: u16 = 0x8000;
const IPCTNL_MSG_CT_DELETE: u8 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
/// CTA_FILTER_F_* (kernel-internal names, stable ABI).
const FILTER_IP_DST: u32 = 1 << 1;
const FILTER_PROTO_NUM: u32 = 1 << 3;
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

fn flush_udp_here(sockets: &Sockets, targets: &[UdpPort]) -> Result<()> {
    if targets.is_empty() {
        return Ok(());
    }
    sockets.with(|nl| {
        let mut first_error = None;
        for t in targets {
            if let Err(e) = flush_one(nl, t) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    })
}

fn flush_one(nl: &mut Nfnl, t: &UdpPort) -> Result<()> {
    let family = match t.dst.map_or(t.ipv6, |d| d.is_ipv6()) {
        false => NetfilterProtoFamily::IPv4,
        true => NetfilterProtoFamily::IPv6,
    };
    let what = format!("delete conntrack entries of udp port {}", t.port);
    match nl.request(filtered_delete(family, t.dst, t.port), 0) {
        Ok(_) => Ok(()),
        // Kernels without flush-by-filter refuse the request (EOPNOTSUPP) or
        // read the partial tuple as an exact one (EINVAL, ENOENT).
        Err(f)
            if matches!(
                f.errno(),
                Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOENT)
            ) =>
        {
            delete_matching(nl, family, t.dst, t.port).map_err(|f| f.context(&what).into())
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
fn filtered_delete(
    family: NetfilterProtoFamily,
    dst: Option<IpAddr>,
    port: u16,
) -> NetfilterMessage {
    let mut flags = FILTER_PROTO_NUM | FILTER_PROTO_DST_PORT;
    let mut tuple = Vec::new();
    if let Some(ip) = dst {
        flags |= FILTER_IP_DST;
        let addr = match ip {
            IpAddr::V4(a) => nla(CTA_IP_V4_DST, &a.octets()),
            IpAddr::V6(a) => nla(CTA_IP_V6_DST, &a.octets()),
        };
        tuple.extend(nla(CTA_TUPLE_IP | NLA_F_NESTED, &addr));
    }
    let mut proto = nla(CTA_PROTO_NUM, &[IPPROTO_UDP]);
    proto.extend(nla(CTA_PROTO_DST_PORT, &port.to_be_bytes()));
    tuple.extend(nla(CTA_TUPLE_PROTO | NLA_F_NESTED, &proto));
    let mut filter = nla(CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes());
    filter.extend(nla(CTA_FILTER_REPLY_FLAGS, &0u32.to_ne_bytes()));
    let attributes = vec![
        DefaultNla::new(CTA_TUPLE_ORIG | NLA_F_NESTED, tuple),
        DefaultNla::new(CTA_FILTER | NLA_F_NESTED, filter),
    ];
    let inner = ConntrackMessage::Other {
        message_type: IPCTNL_MSG_CT_DELETE,
        attributes,
    };
    message(family, inner)
}

/// The fallback: dump, match in userspace, delete each by its tuple.
fn delete_matching(
    nl: &mut Nfnl,
    family: NetfilterProtoFamily,
    dst: Option<IpAddr>,
    port: u16,
) -> std::result::Result<(), Failure> {
    let entries = nl.request(message(family, ConntrackMessage::Get(vec![])), NLM_F_DUMP)?;
    for entry in entries {
        let Some(tuple) = orig_of(&entry.decode()?).filter(|t| matches(t, dst, port)) else {
            continue;
        };
        let del = ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple)]);
        match nl.request(message(family, del), 0) {
            Err(f) if f.errno() != Some(libc::ENOENT) => return Err(f),
            _ => {}
        }
    }
    Ok(())
}

fn orig_of(msg: &NetfilterMessage) -> Option<Vec<Tuple>> {
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = &msg.inner else {
        return None;
    };
    attrs.iter().find_map(|a| match a {
        ConntrackAttribute::CtaTupleOrig(t) => Some(t.clone()),
        _ => None,
    })
}

fn matches(tuple: &[Tuple], dst: Option<IpAddr>, port: u16) -> bool {
    let mut udp = false;
    let mut dport = false;
    let mut to = dst.is_none();
    for t in tuple {
        match t {
            Tuple::Proto(p) => {
                udp |= p.contains(&ProtoTuple::Protocol(Protocol::Udp));
                dport |= p.contains(&ProtoTuple::DestinationPort(port));
            }
            Tuple::Ip(ips) => {
                to |= dst.is_some_and(|ip| ips.contains(&IPTuple::DestinationAddress(ip)))
            }
            _ => {}
        }
    }
    udp && dport && to
}
