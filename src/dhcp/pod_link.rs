//! The pod's interface as a lease's client sees it, whatever the family: the namespace
//! handle it was opened with, the link's index, name and MAC. The link checks of a held
//! lease (`link_present`, `has_address`, `set_link_up`, the routes) talk to that
//! namespace, and `netns_still_at_path` tells whether the runtime still names it (the
//! handle alone keeps a removed pod's namespace alive). The DHCPv4 packet socket and the
//! DHCPv6 UDP socket are each opened inside it.

use super::{Error, ErrorKind, Result};
use crate::netlink::{self, Link, NetNs, Netlink};
use std::path::Path;

/// One interface of one pod's network namespace.
#[derive(Debug)]
pub struct PodLink {
    netns: NetNs,
    ifname: String,
    index: u32,
    mac: [u8; 6],
}

impl PodLink {
    /// Opens the netns at `netns` and looks `ifname` up there; `check` may refuse the link
    /// (before anything is changed), then the link is set up if it is down (as the
    /// reference does). A missing netns or link is `ErrorKind::NoInterface`, naming both;
    /// a link without an Ethernet address `ErrorKind::Invalid`.
    pub fn open(
        netns: &Path,
        ifname: &str,
        check: impl FnOnce(&Link, &str) -> Result<()>,
    ) -> Result<(PodLink, Link)> {
        let ns = NetNs::open(netns).map_err(|e| {
            let kind = match e.kind {
                netlink::ErrorKind::NetnsNotFound => ErrorKind::NoInterface,
                _ => ErrorKind::Io,
            };
            Error::new(kind, format!("{} (looking for {ifname})", e.message))
        })?;
        let where_ = format!("{ifname} in {}", netns.display());
        let mut nl = Netlink::open_in(&ns).map_err(|e| netlink_error(&e, &where_))?;
        let link = nl
            .link_by_name(ifname)
            .map_err(|e| netlink_error(&e, &where_))?
            .ok_or_else(|| Error::new(ErrorKind::NoInterface, format!("no interface {where_}")))?;
        let mac = link.mac.as_deref().and_then(parse_mac).ok_or_else(|| {
            Error::new(
                ErrorKind::Invalid,
                format!("{where_} has no Ethernet address"),
            )
        })?;
        check(&link, &where_)?;
        if !link.up {
            nl.set_up(link.index)
                .map_err(|e| netlink_error(&e, &where_))?;
        }
        let pod = PodLink {
            netns: ns,
            ifname: ifname.to_string(),
            index: link.index,
            mac,
        };
        Ok((pod, link))
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    pub fn ifindex(&self) -> u32 {
        self.index
    }

    /// The path the namespace was opened from (`CNI_NETNS`).
    pub fn netns_path(&self) -> &Path {
        self.netns.path()
    }

    /// Runs `f` inside the pod's namespace (a socket made there stays there).
    pub fn run_inside<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.netns
            .run(f)
            .map_err(|e| netlink_error(&e, &self.describe()))?
    }

    /// Whether the interface still exists under its name in that namespace (a link
    /// deleted, or renamed and replaced, is not).
    pub fn link_present(&self) -> Result<bool> {
        let mut nl = self.netlink()?;
        let link = nl
            .link_by_index(self.index)
            .map_err(|e| self.netlink_error(&e))?;
        Ok(link.is_some_and(|l| l.name == self.ifname))
    }

    /// Whether the netns path still names the namespace this link is in: false once the
    /// runtime removed it (or put another namespace there), although the handle keeps
    /// the old one alive.
    pub fn netns_still_at_path(&self) -> bool {
        let Ok(at_path) = std::fs::metadata(self.netns.path()) else {
            return false;
        };
        use std::os::unix::fs::MetadataExt;
        // SAFETY: fstat of a descriptor the NetNs owns, into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(self.netns.as_raw_fd(), &mut st) } != 0 {
            return false;
        }
        at_path.ino() == st.st_ino && at_path.dev() == st.st_dev
    }

    /// The pod is still there: its netns at its path, its interface in it.
    pub fn present(&self) -> bool {
        self.netns_still_at_path() && self.link_present().unwrap_or(true)
    }

    /// Sets the interface up or down.
    pub fn set_up(&self, up: bool) -> Result<()> {
        let mut nl = self.netlink()?;
        let done = match up {
            true => nl.set_up(self.index),
            false => nl.set_down(self.index),
        };
        done.map_err(|e| self.netlink_error(&e))
    }

    /// Every route through the interface, in every table: taking the link down deletes
    /// them, and a lease taken back must leave the pod as it was.
    pub fn routes_via(&self) -> Result<Vec<netlink::TableRoute>> {
        let mut nl = self.netlink()?;
        let all = nl.all_routes().map_err(|e| self.netlink_error(&e))?;
        let mut mine: Vec<_> = all
            .into_iter()
            .filter(|r| r.oif == Some(self.index))
            .collect();
        // On-link routes first: a route via a gateway needs one to reach it.
        mine.sort_by_key(|r| r.gateway.is_some());
        Ok(mine)
    }

    /// Puts `routes` back (those the kernel made again when the link came up are there
    /// already, which is fine).
    pub fn restore_routes(&self, routes: &[netlink::TableRoute]) -> Result<()> {
        let mut nl = self.netlink()?;
        for r in routes {
            nl.restore_route(r).map_err(|e| self.netlink_error(&e))?;
        }
        Ok(())
    }

    /// The interface's IPv6 addresses, link-local ones first: taking the link down
    /// deletes them (unless `keep_addr_on_down`), so a DHCPv4 lease that was lost takes a
    /// dual-stack pod's IPv6 with it, which must come back with the lease.
    pub fn ipv6_addresses(&self) -> Result<Vec<ipnet::Ipv6Net>> {
        let mut nl = self.netlink()?;
        let addrs = nl
            .addresses(self.index)
            .map_err(|e| self.netlink_error(&e))?;
        let mut v6: Vec<_> = addrs
            .into_iter()
            .filter_map(|a| match a {
                ipnet::IpNet::V6(n) => Some(n),
                ipnet::IpNet::V4(_) => None,
            })
            .collect();
        v6.sort_by_key(|n| n.addr().segments()[0] & 0xffc0 != 0xfe80);
        Ok(v6)
    }

    /// Puts IPv6 addresses back, without DAD, as the plugins add them (those there
    /// already are fine).
    pub fn restore_ipv6_addresses(&self, addrs: &[ipnet::Ipv6Net]) -> Result<()> {
        let mut nl = self.netlink()?;
        for a in addrs {
            nl.add_ipv6_address(self.index, *a, true)
                .map_err(|e| self.netlink_error(&e))?;
        }
        Ok(())
    }

    /// Whether `addr` (address and prefix) is on the interface (CHECK: the lease is
    /// still configured).
    pub fn has_address(&self, addr: ipnet::IpNet) -> Result<bool> {
        let mut nl = self.netlink()?;
        let addrs = nl
            .addresses(self.index)
            .map_err(|e| self.netlink_error(&e))?;
        Ok(addrs.contains(&addr))
    }

    /// A netlink socket in the pod's namespace.
    pub fn netlink(&self) -> Result<Netlink> {
        Netlink::open_in(&self.netns).map_err(|e| self.netlink_error(&e))
    }

    /// "eth0 in /run/netns/x"
    pub fn describe(&self) -> String {
        format!("{} in {}", self.ifname, self.netns.path().display())
    }

    pub fn netlink_error(&self, e: &netlink::Error) -> Error {
        netlink_error(e, &self.describe())
    }
}

/// "aa:bb:cc:dd:ee:ff" as the link read-back gives it.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in mac.iter_mut() {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// A netlink or namespace failure on `where_`: a namespace that is gone is
/// `NoInterface`, anything else `Io`.
pub fn netlink_error(e: &netlink::Error, where_: &str) -> Error {
    let kind = match e.kind {
        netlink::ErrorKind::NetnsNotFound => ErrorKind::NoInterface,
        _ => ErrorKind::Io,
    };
    Error::new(kind, format!("{where_}: {}", e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_strictly() {
        assert_eq!(
            parse_mac("02:42:ac:11:00:02"),
            Some([2, 0x42, 0xac, 0x11, 0, 2])
        );
        assert_eq!(parse_mac("02:42:ac:11:00"), None);
        assert_eq!(parse_mac("02:42:ac:11:00:02:03"), None);
        assert_eq!(parse_mac("zz:42:ac:11:00:02"), None);
    }

    #[test]
    fn a_missing_netns_is_no_interface_naming_both() {
        let e = PodLink::open(Path::new("/run/netns/cnikit-no-such-ns"), "eth0", |_, _| {
            Ok(())
        })
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NoInterface, "{e}");
        assert!(e.message.contains("cnikit-no-such-ns"), "{e}");
        assert!(e.message.contains("eth0"), "{e}");
    }
}
