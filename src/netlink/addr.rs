//! Interface addresses (RTM_NEWADDR / RTM_DELADDR / RTM_GETADDR).
use super::frame::Reply;
use super::{Netlink, Result};
use ipnet::IpNet;
use netlink_packet_core::{NlasIterator, Parseable, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeader, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;

/// sizeof(struct ifaddrmsg)
const ADDR_HEADER_LEN: usize = 8;
const RTM_NEWADDR: u16 = 20;

fn family_of(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

/// A permanent address of `index` from one RTM_NEWADDR, or None to skip it
/// (other link, or a dynamic / SLAAC address the kernel manages itself).
fn decode_address(payload: &[u8], index: u32) -> Option<IpNet> {
    decode_any_address(payload)
        .filter(|(i, _)| *i == index)
        .map(|(_, net)| net)
}

/// A permanent address of any link from one RTM_NEWADDR: (link index, address).
fn decode_any_address(payload: &[u8]) -> Option<(u32, IpNet)> {
    let header = AddressHeader::parse(payload).ok()?;
    let attrs: Vec<AddressAttribute> = NlasIterator::new(payload.get(ADDR_HEADER_LEN..)?)
        .filter_map(|nla| nla.ok())
        .filter_map(|nla| AddressAttribute::parse(&nla).ok())
        .collect();
    if !is_permanent(&header, &attrs) {
        return None;
    }
    // IFA_LOCAL is the interface's own IPv4 address (IFA_ADDRESS is the peer
    // on point-to-point links); IPv6 only has IFA_ADDRESS.
    let local = attrs.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let address = attrs.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    let net = IpNet::new(local.or(address)?, header.prefix_len).ok()?;
    Some((header.index, net))
}

/// IFA_FLAGS (32 bit) supersedes the 8 bit header flags when present.
fn is_permanent(header: &AddressHeader, attrs: &[AddressAttribute]) -> bool {
    has_flag(
        header,
        attrs,
        AddressFlags::Permanent,
        AddressHeaderFlags::Permanent,
    )
}

fn has_flag(
    header: &AddressHeader,
    attrs: &[AddressAttribute],
    flag: AddressFlags,
    header_flag: AddressHeaderFlags,
) -> bool {
    let extended = attrs.iter().find_map(|a| match a {
        AddressAttribute::Flags(flags) => Some(flags.contains(flag)),
        _ => None,
    });
    extended.unwrap_or(header.flags.contains(header_flag))
}

/// Whether one RTM_NEWADDR is a tentative address of `index` (IPv6 before
/// its DAD has run, even when DAD is off: the kernel clears it from a work
/// queue after the link is up).
fn is_tentative(payload: &[u8], index: u32) -> bool {
    let Ok(header) = AddressHeader::parse(payload) else {
        return false;
    };
    let attrs: Vec<AddressAttribute> = match payload.get(ADDR_HEADER_LEN..) {
        Some(rest) => NlasIterator::new(rest)
            .filter_map(|nla| nla.ok())
            .filter_map(|nla| AddressAttribute::parse(&nla).ok())
            .collect(),
        None => return false,
    };
    header.index == index
        && has_flag(
            &header,
            &attrs,
            AddressFlags::Tentative,
            AddressHeaderFlags::Tentative,
        )
}

fn address_message(index: u32, addr: IpNet) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = family_of(addr.addr());
    msg.header.prefix_len = addr.prefix_len();
    msg.header.index = index;
    msg.attributes = match addr {
        IpNet::V4(net) => {
            let ip = IpAddr::V4(net.addr());
            let mut attrs = vec![AddressAttribute::Local(ip), AddressAttribute::Address(ip)];
            // Like the Go netlink library the reference plugins use: a
            // broadcast address for every subnet that has one.
            if net.prefix_len() < 31 {
                attrs.push(AddressAttribute::Broadcast(net.broadcast()));
            }
            attrs
        }
        IpNet::V6(net) => vec![AddressAttribute::Address(IpAddr::V6(net.addr()))],
    };
    msg
}

impl Netlink {
    /// The permanent (not kernel-managed) IPv4 and IPv6 addresses of link
    /// `index`, including the IPv6 link-local one once the link is up.
    pub fn addresses(&mut self, index: u32) -> Result<Vec<IpNet>> {
        let replies = self.link_addresses(AddressFamily::Unspec, index)?;
        Ok(replies
            .iter()
            .filter_map(|r| decode_address(&r.payload, index))
            .collect())
    }

    /// The permanent addresses of link `index` in one family. Recent kernels
    /// (6.18 here, not Debian 12's 6.1) answer a dump of one family under
    /// RCU, where one of all families (`addresses`) waits for the RTNL,
    /// which other pods' veth changes hold for milliseconds at a time on a
    /// busy node.
    pub fn family_addresses(&mut self, index: u32, ipv4: bool) -> Result<Vec<IpNet>> {
        let family = if ipv4 {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let replies = self.link_addresses(family, index)?;
        Ok(replies
            .iter()
            .filter_map(|r| decode_address(&r.payload, index))
            .filter(|a| a.addr().is_ipv4() == ipv4)
            .collect())
    }

    /// The permanent addresses of every link: (link index, address). One dump; for the
    /// daemon's periodic work, never on a plugin's path.
    pub fn all_addresses(&mut self) -> Result<Vec<(u32, IpNet)>> {
        let replies = self.link_addresses(AddressFamily::Unspec, 0)?;
        Ok(replies
            .iter()
            .filter_map(|r| decode_any_address(&r.payload))
            .collect())
    }

    /// Whether link `index` has an address still tentative (IPv6): the
    /// kernel refuses it as a route's preferred source until it is not.
    pub fn has_tentative_address(&mut self, index: u32) -> Result<bool> {
        let replies = self.link_addresses(AddressFamily::Inet6, index)?;
        Ok(replies.iter().any(|r| is_tentative(&r.payload, index)))
    }

    /// The RTM_NEWADDR answers of a dump of link `index`'s addresses in
    /// `family` (Unspec: all). With strict checking the kernel reads only
    /// that link's addresses, not every link's under the RTNL; without it
    /// (older kernels) it sends every link's, so the decoders check the
    /// index too. A missing link is no addresses, as the whole dump said.
    fn link_addresses(&mut self, family: AddressFamily, index: u32) -> Result<Vec<Reply>> {
        let mut msg = AddressMessage::default();
        msg.header.family = family;
        msg.header.index = index;
        match self.request(RouteNetlinkMessage::GetAddress(msg), NLM_F_DUMP) {
            Ok(replies) => Ok(replies
                .into_iter()
                .filter(|r| r.kind == RTM_NEWADDR)
                .collect()),
            // What a strict dump for a link that does not exist answers.
            Err(f) if f.errno() == Some(libc::ENODEV) => Ok(Vec::new()),
            Err(f) => {
                let link = self.describe(index);
                Err(f.context(&format!("list addresses of {link}")))
            }
        }
    }

    /// Adds `addr` (e.g. 10.22.0.5/16) to link `index`; already present is Ok.
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> Result<()> {
        let msg = RouteNetlinkMessage::NewAddress(address_message(index, addr));
        match self.request(msg, NLM_F_CREATE | NLM_F_EXCL) {
            Ok(_) => Ok(()),
            Err(f) if f.errno() == Some(libc::EEXIST) => Ok(()),
            Err(f) => {
                let link = self.describe(index);
                Err(f.context(&format!("add address {addr} to {link}")))
            }
        }
    }

    /// Removes `addr` from link `index`; a missing address is `ErrorKind::NotFound`.
    pub fn del_address(&mut self, index: u32, addr: IpNet) -> Result<()> {
        let msg = RouteNetlinkMessage::DelAddress(address_message(index, addr));
        self.request(msg, 0).map(drop).map_err(|f| {
            let link = self.describe(index);
            f.context(&format!("delete address {addr} from {link}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{host_and_pod, veth};
    use super::*;

    /// Two links with addresses: asking for one answers its addresses only, and
    /// the kernel itself left the other link's out (strict checking took the
    /// index), so the work does not grow with the links of the netns. A link
    /// that does not exist has no addresses, as before.
    #[test]
    fn addresses_of_one_link_only() {
        let Some((host, cont)) = host_and_pod("addresses_of_one_link_only", "al") else {
            return;
        };
        let mut nl = host.netlink();
        let a = nl.create_veth(veth("ala", "ala0", &cont.ns)).expect("veth");
        let b = nl.create_veth(veth("alb", "alb0", &cont.ns)).expect("veth");
        let net = |s: &str| s.parse::<IpNet>().expect("net");
        let (a4, a6, b4) = (net("10.41.0.1/24"), net("fd41::1/64"), net("10.42.0.1/24"));
        for (index, addr) in [(a.host_index, a4), (a.host_index, a6), (b.host_index, b4)] {
            nl.add_address(index, addr).expect("add address");
        }

        let mut of_a = nl.addresses(a.host_index).expect("addresses of a");
        of_a.sort();
        assert_eq!(of_a, [a4, a6]);
        assert_eq!(nl.addresses(b.host_index).expect("addresses of b"), [b4]);

        let raw = nl
            .link_addresses(AddressFamily::Unspec, b.host_index)
            .expect("dump of b");
        let indexes: Vec<u32> = raw
            .iter()
            .map(|r| AddressHeader::parse(&r.payload).expect("header").index)
            .collect();
        assert_eq!(indexes, [b.host_index], "the kernel filtered by link");

        let missing = 999_999;
        assert_eq!(nl.addresses(missing).expect("missing link"), []);
        assert!(!nl.has_tentative_address(missing).expect("missing link"));
    }
}
