//! A fresh link set up in one RTM_SETLINK ([`LinkSetup`]: name, MTU, MAC, `arp_notify`
//! and no IPv6 link-local address from the kernel, see `ipv6.rs`).
//!
//! The reference plugins set `net/ipv4/conf/<ifname>/arp_notify=1` on the pod's
//! interface before it goes up (bridge, macvlan, ipvlan, tap), so that bringing it up
//! sends a gratuitous ARP for each of its IPv4 addresses and the LAN forgets the MAC a
//! previous pod with that address had (on a bridge that announcement is lost: the pod's
//! end going up is what gives the veth its carrier, and the bridge enables the host end's
//! port later, in the kernel's link-watch work; so bridge does not set it, see
//! docs/reference-compatibility.md). cnikit sets it over netlink instead of writing
//! `/proc/sys` per pod: RTM_SETLINK with IFLA_AF_SPEC → AF_INET → IFLA_INET_CONF
//! holding IPV4_DEVCONF_ARP_NOTIFY=1 (`inet_set_link_af`). What the kernel takes:
//! - in RTM_SETLINK, yes; but `do_setlink` applies IFLA_AF_SPEC *after* the IFF_UP of
//!   the same request, so in the request that brings the link up it comes too late for
//!   that up: it goes in a request before (with a rename it is fine: IFLA_IFNAME is
//!   applied before it);
//! - in the RTM_NEWLINK that creates the link, no: EAFNOSUPPORT, the link has no IPv4
//!   device yet when the kernel validates the request;
//! - for IPv6 (`ndisc_notify`), no: `inet6_validate_link_af` wants IFLA_INET6_TOKEN or
//!   IFLA_INET6_ADDR_GEN_MODE (EINVAL without) and `inet6_set_link_af` sets nothing
//!   else, so IFLA_INET6_CONF cannot carry it (see `plugins::pod_interface`); the address
//!   generation mode it does take goes in the same IFLA_AF_SPEC ([`LinkSetup::no_link_local`]).
use super::ipv6::{lacks_ipv6, no_link_local_spec};
use super::link::parse_mac;
use super::linkops::link_message;
use super::{Netlink, Result};
use netlink_packet_route::link::{AfSpecInet, AfSpecUnspec, InetDevConf, LinkAttribute};

/// What one RTM_SETLINK sets on a link (that is down, as a fresh one is); `None` and
/// `false` leave that alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkSetup<'a> {
    /// A new name.
    pub name: Option<&'a str>,
    pub mtu: Option<u32>,
    /// The hardware address, "aa:bb:cc:dd:ee:ff".
    pub mac: Option<&'a str>,
    /// `net/ipv4/conf/<link>/arp_notify` to 1: bringing the link up (or changing its
    /// address) then sends a gratuitous ARP for each of its IPv4 addresses.
    pub arp_notify: bool,
    /// IFLA_INET6_ADDR_GEN_MODE none: the link gets no IPv6 link-local address from the
    /// kernel when it comes up (the plugin adds one itself where the pod has IPv6). A link
    /// without IPv6 (EAFNOSUPPORT) has none to turn off: the rest is set all the same.
    pub no_link_local: bool,
}

/// IFLA_AF_SPEC → AF_INET → IFLA_INET_CONF with IPV4_DEVCONF_ARP_NOTIFY = 1 alone (a
/// devconf request carries only the entries that are not 0).
fn arp_notify_spec() -> AfSpecUnspec {
    let mut conf = InetDevConf::default();
    conf.arp_notify = 1;
    AfSpecUnspec::Inet(vec![AfSpecInet::DevConfRequest(conf)])
}

impl Netlink {
    /// Sets what `s` asks of link `index` in one RTM_SETLINK; nothing asked, no request.
    pub fn setup_link(&mut self, index: u32, s: &LinkSetup) -> Result<()> {
        match self.setup_link_once(index, s, s.no_link_local) {
            Err(e) if s.no_link_local && lacks_ipv6(&e) => self.setup_link_once(index, s, false),
            other => other,
        }
    }

    fn setup_link_once(&mut self, index: u32, s: &LinkSetup, no_ll: bool) -> Result<()> {
        let (mut attrs, mut words) = (Vec::new(), Vec::new());
        if let Some(name) = s.name {
            attrs.push(LinkAttribute::IfName(name.to_string()));
            words.push(format!("name {name}"));
        }
        if let Some(mtu) = s.mtu {
            attrs.push(LinkAttribute::Mtu(mtu));
            words.push(format!("mtu {mtu}"));
        }
        if let Some(mac) = s.mac {
            attrs.push(LinkAttribute::Address(parse_mac(mac)?));
            words.push(format!("address {mac}"));
        }
        let mut af = Vec::new();
        if s.arp_notify {
            af.push(arp_notify_spec());
            words.push("arp_notify 1".to_string());
        }
        if no_ll {
            af.push(no_link_local_spec());
            words.push("addrgenmode none".to_string());
        }
        if !af.is_empty() {
            attrs.push(LinkAttribute::AfSpecUnspec(af));
        }
        if attrs.is_empty() {
            return Ok(());
        }
        let msg = link_message(index, attrs);
        self.send_setlink(index, msg, &words.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::super::child_tests::{bridge_macvlan, child_link};
    use super::super::tests::{host_and_pod, veth};
    use super::super::{sysctl, ChildLink, NetNs};
    use super::*;
    use netlink_packet_core::Emitable;

    fn arp_notify(ns: &NetNs, name: &str) -> String {
        let key = format!("net/ipv4/conf/{name}/arp_notify");
        ns.run(|| sysctl::get(&key)).expect("run").expect("read")
    }

    /// arp_notify goes on with the rename of a child created into a netns, by a request
    /// of its own for one created in place, and with a link's MTU and MAC; a veth up on
    /// both ends reads operationally up, and the kernel takes its announcement.
    #[test]
    fn arp_notify_over_netlink() {
        let Some((host, cont)) = host_and_pod("arp_notify_over_netlink", "an") else {
            return;
        };
        let mut nl = host.netlink();
        let pair = nl
            .create_veth(veth("anmaster", "anpeer", &cont.ns))
            .expect("veth");
        let spec = |name: &str, netns| {
            bridge_macvlan(ChildLink {
                arp_notify: true,
                ..child_link(name, pair.host_index, netns)
            })
        };
        nl.create_macvlan(spec("an0", Some(&cont.ns)))
            .expect("into the pod");
        nl.create_macvlan(spec("an1", None)).expect("in place");
        assert_eq!(arp_notify(&cont.ns, "an0"), "1");
        assert_eq!(arp_notify(&host.ns, "an1"), "1");

        let mut pod = cont.netlink();
        assert_eq!(arp_notify(&cont.ns, "anpeer"), "0");
        let setup = LinkSetup {
            mtu: Some(1300),
            mac: Some("02:00:00:00:00:01"),
            arp_notify: true,
            ..LinkSetup::default()
        };
        pod.setup_link(pair.peer_index, &setup).expect("setup");
        let peer = cont.link("anpeer");
        assert_eq!(peer.mtu, 1300);
        assert_eq!(peer.mac.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(arp_notify(&cont.ns, "anpeer"), "1");
    }

    /// The request carries IFLA_AF_SPEC { AF_INET { IFLA_INET_CONF (nested)
    /// { IPV4_DEVCONF_ARP_NOTIFY (22): u32 1 } } } and nothing else.
    #[test]
    fn arp_notify_attr_is_one_devconf_entry() {
        let attr = LinkAttribute::AfSpecUnspec(vec![arp_notify_spec()]);
        let mut buf = vec![0; attr.buffer_len()];
        attr.emit(&mut buf);
        let mut want = Vec::new();
        for (len, kind) in [(20u16, 26u16), (16, 2), (12, 1 | 0x8000), (8, 22)] {
            want.extend(len.to_ne_bytes());
            want.extend(kind.to_ne_bytes());
        }
        want.extend(1u32.to_ne_bytes());
        assert_eq!(buf, want);
    }
}
