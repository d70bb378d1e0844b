//! The DHCPv6 client's socket: UDP, made inside the pod's network namespace and bound to
//! the interface's link-local address and port 546 (RFC 8415 §7.2: servers answer the
//! client's link-local address). No packet socket as for DHCPv4: a link-local address is
//! there before any lease, so the kernel's UDP does the framing and the filtering.
//!
//! cnikit's macvlan and ipvlan make pod links without the kernel's link-local address
//! (see `netlink/ipv6.rs`); the socket then adds the one the plugin adds when it
//! configures the result (the kernel's EUI-64 address of the MAC, without DAD, as the
//! plugin adds it), so the plugin finds it there. A link whose own link-local address is
//! still tentative (DAD) is waited for: the kernel refuses to bind it until DAD is over.

use super::super::pod_link::PodLink;
use super::super::{Error, ErrorKind, Result};
use super::message::{ALL_SERVERS, CLIENT_PORT, SERVER_PORT};
use crate::netlink::link_local;
use ipamd::log::Level;
use ipamd::log_at;
use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

/// How often a tentative link-local address is tried again.
const TENTATIVE_POLL: Duration = Duration::from_millis(20);

/// A UDP socket on one pod interface's link-local address, port 546.
#[derive(Debug)]
pub struct Socket6 {
    udp: UdpSocket,
    link: PodLink,
    source: Ipv6Addr,
}

impl Socket6 {
    /// Opens `ifname` in the netns at `netns` (up if it was down), gives it a link-local
    /// address if it has none, and binds the socket to it, waiting at most `wait` for the
    /// address to leave DAD.
    pub fn open(netns: &Path, ifname: &str, wait: Duration) -> Result<Socket6> {
        let (link, _) = PodLink::open(netns, ifname, super::super::socket::refuse_l3_ipvlan)?;
        let source = link_local_of(&link)?;
        let index = link.ifindex();
        let started = Instant::now();
        let deadline = started + wait;
        let mut tries = 0u32;
        let udp = loop {
            tries += 1;
            let bound = link.run_inside(|| {
                Ok(UdpSocket::bind(SocketAddrV6::new(
                    source,
                    CLIENT_PORT,
                    0,
                    index,
                )))
            })?;
            match bound {
                Ok(s) => break s,
                // Tentative (DAD running): the kernel refuses the address for now.
                Err(e)
                    if e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(TENTATIVE_POLL);
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::Io,
                        format!(
                            "cannot bind the DHCPv6 client to [{source}]:{CLIENT_PORT} on {} \
                             (waited {:.1}s for its link-local address to leave DAD): {e}",
                            link.describe(),
                            wait.as_secs_f64()
                        ),
                    ))
                }
            }
        };
        if tries > 1 {
            log_at!(
                Level::Debug,
                "dhcp: {} bound [{source}]:{CLIENT_PORT} after {:?} ({tries} tries: the address was tentative)",
                link.describe(),
                started.elapsed()
            );
        }
        Ok(Socket6 { udp, link, source })
    }

    /// The pod's interface this socket is bound to.
    pub fn link(&self) -> &PodLink {
        &self.link
    }

    /// The link-local address the client sends from.
    pub fn source(&self) -> Ipv6Addr {
        self.source
    }

    /// Sends one message to All_DHCP_Relay_Agents_and_Servers on the link.
    pub fn send(&self, message: &[u8]) -> Result<()> {
        let to = SocketAddrV6::new(ALL_SERVERS, SERVER_PORT, 0, self.link.ifindex());
        self.udp
            .send_to(message, to)
            .map(drop)
            .map_err(|e| self.io_error("send a DHCPv6 message", &e))
    }

    /// Waits at most `wait` for one datagram from a server's port; its length in `buf`.
    /// A datagram longer than `buf` is cut to its length.
    pub fn recv(&self, buf: &mut [u8], wait: Duration) -> Result<Option<usize>> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // A timeout of zero would block for good: at least a millisecond.
            let timeout = left.max(Duration::from_millis(1));
            self.udp
                .set_read_timeout(Some(timeout))
                .map_err(|e| self.io_error("set the receive timeout", &e))?;
            match self.udp.recv_from(buf) {
                Ok((n, SocketAddr::V6(from))) if from.port() == SERVER_PORT => return Ok(Some(n)),
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(self.io_error("receive a DHCPv6 message", &e)),
            }
        }
    }

    fn io_error(&self, what: &str, e: &io::Error) -> Error {
        let kind = match e.raw_os_error() {
            Some(libc::ENXIO) | Some(libc::ENODEV) | Some(libc::EADDRNOTAVAIL) => {
                ErrorKind::NoInterface
            }
            _ => ErrorKind::Io,
        };
        Error::new(kind, format!("{what} on {}: {e}", self.link.describe()))
    }
}

/// The link's link-local address; one is added (the kernel's EUI-64 of its MAC, without
/// DAD) when it has none.
fn link_local_of(link: &PodLink) -> Result<Ipv6Addr> {
    let mut nl = link.netlink()?;
    let index = link.ifindex();
    let addrs = nl.addresses(index).map_err(|e| link.netlink_error(&e))?;
    let existing = addrs.iter().find_map(|a| match a {
        ipnet::IpNet::V6(v6) if v6.addr().segments()[0] & 0xffc0 == 0xfe80 => Some(v6.addr()),
        _ => None,
    });
    if let Some(addr) = existing {
        return Ok(addr);
    }
    let ll = link_local(&link.mac());
    nl.add_ipv6_address(index, ll, true).map_err(|e| {
        if e.errno == Some(libc::EACCES) {
            Error::new(
                ErrorKind::Invalid,
                format!(
                    "IPv6 is disabled on {} (net.ipv6.conf.{}.disable_ipv6 = 1): DHCPv6 needs it on, \
                     or set \"ipv6\": false in the dhcp IPAM config",
                    link.describe(),
                    link.ifname()
                ),
            )
        } else {
            link.netlink_error(&e)
        }
    })?;
    Ok(ll.addr())
}
