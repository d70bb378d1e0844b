//! IPv6 on a pod's link over netlink, not `/proc/sys`: no link-local address from the
//! kernel (IFLA_INET6_ADDR_GEN_MODE none), the plugin's own addresses without DAD
//! (IFA_F_NODAD), and what a fresh link's IPv6 settings say (its IFLA_INET6_CONF).
//!
//! Why: a `disable_ipv6` write per pod and per host port spun on the RTNL
//! (`addrconf_sysctl_disable` → `rtnl_trylock` → `restart_syscall`), 12 % of all CPU at 32
//! pods at once, and `accept_dad` needed a visit to the pod's netns. What the kernel
//! takes (6.1 and 6.18, net/ipv6/addrconf.c and net/core/rtnetlink.c):
//! - IFLA_AF_SPEC → AF_INET6 → IFLA_INET6_ADDR_GEN_MODE in RTM_SETLINK, yes
//!   (`inet6_set_link_af`). With IN6_ADDR_GEN_MODE_NONE the link gets no link-local
//!   address when it comes up, so sends no DAD, router solicitation or MLD for one; it
//!   joins only the all-nodes groups, which are never reported. The mode is read when the
//!   link becomes ready (`addrconf_link_ready`: a qdisc, which comes with a carrier, and an
//!   operstate of up or unknown), and `do_setlink` applies IFLA_AF_SPEC after the IFF_UP of
//!   the same request: so it goes in a request before the up, or with the up of a veth end
//!   that cannot be ready before the request is done. One whose peer is still down has no
//!   carrier. One whose peer is up gets its carrier in that request, but a fresh link's
//!   operstate is unknown until the kernel's link-watch work first looks at it (up to a
//!   second after a veth's create, 6.1 and 6.18 alike), so only one made dormant
//!   (`VethSpec::peer_attributes`) waits: the link-watch work sets its operstate up after
//!   the request, as it needs the RTNL the request holds. A link made with a carrier
//!   (a macvlan on a link that is up, for one) is ready when it comes up.
//! - in the RTM_NEWLINK that creates the link (veth ends, macvlan, ipvlan), no:
//!   EAFNOSUPPORT since `rtnl_create_link` validates the request against the new device,
//!   which has no IPv6 device yet (backported to 6.1 stable in June 2023; before that
//!   a create validated it against no device and then ignored it).
//! - a link with no IPv6 device (MTU below 1280, or IPv6 off in the kernel) answers
//!   EAFNOSUPPORT: it has no link-local address to turn off.
//! - IFLA_INET6_CONF (`accept_dad`, `disable_ipv6`, `ndisc_notify`) is refused on set
//!   (`inet6_validate_link_af` wants a token or a mode). A link with no link-local address
//!   and addresses added with IFA_F_NODAD has nothing to DAD; `disable_ipv6` = 1 (a netns
//!   whose defaults have it) makes an address add fail with EACCES, which is the one case
//!   the plugins still write it.
//! - a once-per-netns default (`net/ipv6/conf/default/*`) is no saving: every pod is a
//!   netns of its own; and a bridge's settings are not its ports'.
use super::linkops::link_message;
use super::{Error, Netlink, Result};
use ipnet::Ipv6Net;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, LinkAttribute, LinkFlags,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::{IpAddr, Ipv6Addr};

/// IFLA_AF_SPEC's AF_INET6 entry with IFLA_INET6_ADDR_GEN_MODE = IN6_ADDR_GEN_MODE_NONE.
pub(crate) fn no_link_local_spec() -> AfSpecUnspec {
    AfSpecUnspec::Inet6(vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)])
}

/// A request failed for want of an IPv6 device on the link (see the module doc).
pub(crate) fn lacks_ipv6(e: &Error) -> bool {
    e.errno == Some(libc::EAFNOSUPPORT)
}

/// The link-local address the kernel's EUI-64 mode gives a link with hardware address
/// `mac` (fe80::/64, the MAC with its universal/local bit flipped and ff:fe in the middle);
/// any other length, a random interface identifier, as the kernel's random mode.
pub fn link_local(mac: &[u8]) -> Ipv6Net {
    let mut id = [0u8; 8];
    match mac {
        [a, b, c, d, e, f] => id = [a ^ 2, *b, *c, 0xff, 0xfe, *d, *e, *f],
        _ => id.copy_from_slice(&super::random_bytes::<8>()),
    }
    let mut octets = [0u8; 16];
    octets[..2].copy_from_slice(&[0xfe, 0x80]);
    octets[8..].copy_from_slice(&id);
    Ipv6Net::new(Ipv6Addr::from(octets), 64).unwrap_or_default()
}

/// RTM_NEWADDR for IPv6 address `addr` on link `index`, with IFA_F_NODAD when `nodad`.
fn ipv6_address_message(index: u32, addr: Ipv6Net, nodad: bool) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = AddressFamily::Inet6;
    msg.header.prefix_len = addr.prefix_len();
    msg.header.index = index;
    msg.attributes = vec![AddressAttribute::Address(IpAddr::V6(addr.addr()))];
    if nodad {
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    msg
}

impl Netlink {
    /// Link `index` gets no IPv6 link-local address from the kernel when it comes up
    /// (one RTM_SETLINK; before the up). A link without IPv6 has none to turn off.
    pub fn no_link_local(&mut self, index: u32) -> Result<()> {
        let attr = LinkAttribute::AfSpecUnspec(vec![no_link_local_spec()]);
        match self.send_setlink(index, link_message(index, vec![attr]), "addrgenmode none") {
            Err(e) if lacks_ipv6(&e) => Ok(()),
            other => other,
        }
    }

    /// Names link `index`'s owner in its alias and brings it up, in one request (the
    /// kernel ignores an alias in a create request); with `no_link_local`, the kernel
    /// gives it no IPv6 link-local address. That mode is applied after the up of the
    /// same request, so it is only for a veth end that cannot be ready within the request
    /// (see the module doc): one whose peer is still down, which has no carrier, and whose
    /// link-local address would be made only when the peer comes up, after this request.
    pub fn set_up_with_alias(
        &mut self,
        index: u32,
        alias: &str,
        no_link_local: bool,
    ) -> Result<()> {
        self.set_up_af(index, Some(alias), no_link_local, "up with alias")
    }

    /// Brings link `index` up with no IPv6 link-local address from the kernel, in one
    /// request: only for a veth end that cannot be ready within it (see the module doc),
    /// a dormant one or one whose peer is down. A link without IPv6 comes up all the same.
    pub fn set_up_without_link_local(&mut self, index: u32) -> Result<()> {
        self.set_up_af(index, None, true, "up")
    }

    fn set_up_af(
        &mut self,
        index: u32,
        alias: Option<&str>,
        no_link_local: bool,
        word: &str,
    ) -> Result<()> {
        let msg = |no_ll: bool| {
            let mut attrs: Vec<_> = alias
                .map(|a| LinkAttribute::IfAlias(a.to_string()))
                .into_iter()
                .collect();
            if no_ll {
                attrs.push(LinkAttribute::AfSpecUnspec(vec![no_link_local_spec()]));
            }
            let mut msg = link_message(index, attrs);
            msg.header.change_mask = LinkFlags::Up;
            msg.header.flags = LinkFlags::Up;
            msg
        };
        match self.send_setlink(index, msg(no_link_local), word) {
            Err(e) if no_link_local && lacks_ipv6(&e) => self.send_setlink(index, msg(false), word),
            other => other,
        }
    }

    /// Adds IPv6 address `addr` to link `index`, without duplicate address detection
    /// when `nodad` (the address is usable at once and nothing is multicast for it);
    /// already present is Ok. On a link whose `disable_ipv6` is 1 the kernel answers
    /// EACCES.
    pub fn add_ipv6_address(&mut self, index: u32, addr: Ipv6Net, nodad: bool) -> Result<()> {
        let msg = RouteNetlinkMessage::NewAddress(ipv6_address_message(index, addr, nodad));
        match self.request(msg, NLM_F_CREATE | NLM_F_EXCL) {
            Ok(_) => Ok(()),
            Err(f) if f.errno() == Some(libc::EEXIST) => Ok(()),
            Err(f) => {
                let link = self.describe(index);
                let flag = if nodad { " nodad" } else { "" };
                Err(f.context(&format!("add address {addr}{flag} to {link}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{host_and_pod, veth};
    use super::super::LinkSetup;
    use super::*;
    use netlink_packet_core::Emitable;
    use netlink_packet_route::link::State;

    #[test]
    fn link_local_is_the_kernels_eui64() {
        let ll = link_local(&[0x0a, 0x58, 0x0a, 0x16, 0x00, 0x05]);
        assert_eq!(ll.to_string(), "fe80::858:aff:fe16:5/64");
        let random = link_local(&[1, 2, 3]);
        assert_eq!(random.prefix_len(), 64);
        assert_eq!(random.addr().segments()[..4], [0xfe80, 0, 0, 0]);
    }

    /// IFLA_AF_SPEC { AF_INET6 (10) { IFLA_INET6_ADDR_GEN_MODE (8): u8 1 } }.
    #[test]
    fn no_link_local_attr_is_one_mode_entry() {
        let attr = LinkAttribute::AfSpecUnspec(vec![no_link_local_spec()]);
        let mut buf = vec![0; attr.buffer_len()];
        attr.emit(&mut buf);
        let mut want = Vec::new();
        for (len, kind) in [(16u16, 26u16), (12, 10), (5, 8)] {
            want.extend(len.to_ne_bytes());
            want.extend(kind.to_ne_bytes());
        }
        want.extend([1, 0, 0, 0]);
        assert_eq!(buf, want);
    }

    /// The kernel takes the mode on a fresh veth end, alone or with arp_notify in one
    /// IFLA_AF_SPEC; a link with the mode none comes up without a link-local address, and
    /// one added with IFA_F_NODAD is not tentative. A link without IPv6 (MTU below 1280)
    /// has nothing to turn off, and the rest of a request is set all the same.
    #[test]
    fn address_generation_mode_over_netlink() {
        let Some((host, cont)) = host_and_pod("addrgenmode_over_netlink", "ag") else {
            return;
        };
        let mut nl = host.netlink();
        let pair = nl
            .create_veth(veth("agmaster", "agpeer", &cont.ns))
            .expect("veth");
        nl.no_link_local(pair.host_index).expect("host end");
        let mut pod = cont.netlink();
        let setup = LinkSetup {
            arp_notify: true,
            no_link_local: true,
            ..LinkSetup::default()
        };
        pod.setup_link(pair.peer_index, &setup).expect("pod end");
        nl.set_up(pair.host_index).expect("up");
        pod.set_up(pair.peer_index).expect("up");
        // The kernel would add its link-local address from its link-watch work, soon after.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let addrs = pod.addresses(pair.peer_index).expect("addresses");
        assert!(addrs.is_empty(), "{addrs:?}");
        assert!(nl.addresses(pair.host_index).expect("addresses").is_empty());
        let ll = link_local(&[2, 0, 0, 0, 0, 1]);
        pod.add_ipv6_address(pair.peer_index, ll, true)
            .expect("nodad");
        pod.add_ipv6_address(pair.peer_index, ll, true)
            .expect("again");
        assert!(!pod.has_tentative_address(pair.peer_index).expect("dump"));
        let addrs = pod.addresses(pair.peer_index).expect("addresses");
        assert_eq!(addrs, vec![ipnet::IpNet::V6(ll)]);

        let mut small = veth("agsmall", "agsmallp", &cont.ns);
        small.mtu = Some(1200);
        let small = nl.create_veth(small).expect("veth");
        nl.no_link_local(small.host_index)
            .expect("no IPv6, nothing to do");
        let setup = LinkSetup {
            mtu: Some(1000),
            no_link_local: true,
            ..LinkSetup::default()
        };
        pod.setup_link(small.peer_index, &setup)
            .expect("mtu all the same");
        assert_eq!(cont.link("agsmallp").mtu, 1000);
        pod.set_up_without_link_local(small.peer_index)
            .expect("up all the same");
        assert!(cont.link("agsmallp").up);
    }

    /// A veth's pod end is made dormant, so it can come up second, its host end already
    /// up, with the mode in its up request: neither end gets a link-local address (an end
    /// not made dormant that comes up second so soon after its create is ready in its up
    /// request and gets one, on 6.1 as on 6.18), and the kernel's link-watch work then
    /// sets the pod end's operstate up from its carrier.
    #[test]
    fn dormant_end_comes_up_second_without_link_local() {
        let Some((host, cont)) = host_and_pod("dormant_end_second", "ds") else {
            return;
        };
        let mut nl = host.netlink();
        let mut pod = cont.netlink();
        let pair = nl
            .create_veth(veth("dsmaster", "dspeer", &cont.ns))
            .expect("veth");
        nl.set_up_with_alias(pair.host_index, "owner", true)
            .expect("host end first");
        pod.set_up_without_link_local(pair.peer_index)
            .expect("pod end second");
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(nl.addresses(pair.host_index).expect("dump").is_empty());
        let addrs = pod.addresses(pair.peer_index).expect("dump");
        assert!(addrs.is_empty(), "{addrs:?}");
        // Both ends have index 2 in their fresh netns: the kernel does not count their
        // events as urgent (as with a peer's index it would), and may take a second.
        let up = LinkAttribute::OperState(State::Up);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        loop {
            let msg = link_message(pair.peer_index, vec![]);
            let (_, attrs) = pod.get_link(msg).expect("read").expect("pod end");
            if attrs.contains(&up) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{attrs:?}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
