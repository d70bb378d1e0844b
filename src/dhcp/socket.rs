//! The packet socket a lease's exchanges use, opened inside the pod's network namespace
//! on the pod's interface. A packet socket (not UDP) because the pod has no address yet
//! when it asks for one, and because DHCPRELEASE and renewals must leave from the leased
//! address to the server's MAC whatever the pod's routes say.
//!
//! The socket keeps the pod's link ([`PodLink`]: the namespace handle it was opened with),
//! through which a held lease checks and changes the interface.

use super::pod_link::PodLink;
use super::{Error, ErrorKind, Result};
use crate::netlink::{IpvlanMode, Link};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// `sll_pkttype` of a frame this host sent itself (packet sockets see those too).
const PACKET_OUTGOING: u8 = 4;
/// The DHCP client's UDP port: the only traffic the filter lets through.
const CLIENT_PORT: u32 = 68;

/// An AF_PACKET socket bound to one interface of one network namespace.
#[derive(Debug)]
pub struct PodSocket {
    fd: OwnedFd,
    link: PodLink,
    /// An ipvlan link: its MAC is its master's (see [`PodSocket::needs_broadcast`]).
    ipvlan: bool,
}

impl PodSocket {
    /// Opens `ifname` in the netns at `netns`: looks the link up there (its index and MAC),
    /// sets it up if it is down (as the reference does), and binds a packet socket to it.
    /// A missing netns or link is `ErrorKind::NoInterface`, naming both; an ipvlan link in
    /// l3 or l3s mode, which passes no broadcasts, `ErrorKind::Invalid`.
    pub fn open(netns: &Path, ifname: &str) -> Result<PodSocket> {
        let (link, found) = PodLink::open(netns, ifname, refuse_l3_ipvlan)?;
        let index = link.ifindex();
        let fd = link.run_inside(|| {
            packet_socket(index).map_err(|(what, e)| {
                Error::new(ErrorKind::Io, format!("{what} on {}: {e}", link.describe()))
            })
        })?;
        Ok(PodSocket {
            fd,
            link,
            ipvlan: found.is_kind("ipvlan"),
        })
    }

    /// The pod's interface this socket is bound to.
    pub fn link(&self) -> &PodLink {
        &self.link
    }

    /// Whether the client must ask for broadcast answers (RFC 2131 §4.1: it cannot take
    /// unicasts before it holds its address): an ipvlan link shares its master's MAC, and
    /// ipvlan hands a unicast to the slave holding its destination address, so a server's
    /// unicast OFFER or ACK (dnsmasq's, to a client without the BROADCAST flag) goes to
    /// the master. The reference asks only with its daemon's `-broadcast`.
    pub fn needs_broadcast(&self) -> bool {
        self.ipvlan
    }

    pub fn mac(&self) -> [u8; 6] {
        self.link.mac()
    }

    pub fn ifname(&self) -> &str {
        self.link.ifname()
    }

    /// The path the namespace was opened from (`CNI_NETNS`).
    pub fn netns_path(&self) -> &Path {
        self.link.netns_path()
    }

    /// Sends one IPv4 packet (header included) to `dst_mac` (broadcast: all ones).
    pub fn send(&self, ipv4_packet: &[u8], dst_mac: [u8; 6]) -> Result<()> {
        let addr = self.link_addr(dst_mac);
        // SAFETY: sendto from a live buffer to a sockaddr_ll of the size we pass.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                ipv4_packet.as_ptr().cast(),
                ipv4_packet.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                sockaddr_ll_len(),
            )
        };
        if n < 0 {
            return Err(self.io_error("send a DHCP packet", &io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Waits at most `wait` for one IPv4 packet; its length in `buf` and the sender's MAC.
    /// Frames this host sent are skipped; a packet longer than `buf` is cut to its length.
    pub fn recv(&self, buf: &mut [u8], wait: Duration) -> Result<Option<(usize, [u8; 6])>> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.readable(left)? {
                return Ok(None);
            }
            // SAFETY: all-zero is a valid sockaddr_ll.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = sockaddr_ll_len();
            // SAFETY: recvfrom into a buffer and a sockaddr_ll we own, sizes as passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                    _ => return Err(self.io_error("receive a DHCP packet", &e)),
                }
            }
            if from.sll_pkttype == PACKET_OUTGOING {
                continue;
            }
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&from.sll_addr[..6]);
            return Ok(Some((usize::try_from(n).unwrap_or(0), mac)));
        }
    }

    /// Sets the interface up or down (down: the reference's answer to an expired lease).
    pub fn set_link_up(&self, up: bool) -> Result<()> {
        self.link.set_up(up)?;
        if up {
            self.take_pending_error();
        }
        Ok(())
    }

    /// Taking the link down leaves ENETDOWN pending on the socket (the packet socket's
    /// device notifier), which the next send would fail with although the link is up
    /// again: reading SO_ERROR clears it.
    fn take_pending_error(&self) {
        let mut err: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into a c_int of the size we pass.
        unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut libc::c_int).cast(),
                &mut len,
            );
        }
    }

    /// A socket call's failure; the link having gone away is `NoInterface`.
    fn io_error(&self, what: &str, e: &io::Error) -> Error {
        let kind = match e.raw_os_error() {
            Some(libc::ENXIO) | Some(libc::ENODEV) => ErrorKind::NoInterface,
            _ => ErrorKind::Io,
        };
        Error::new(kind, format!("{what} on {}: {e}", self.link.describe()))
    }

    fn link_addr(&self, mac: [u8; 6]) -> libc::sockaddr_ll {
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        addr.sll_ifindex = self.link.ifindex() as i32;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&mac);
        addr
    }

    /// Polls for input; false when `wait` passed without any.
    fn readable(&self, wait: Duration) -> Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Rounded up, so that a wait of 0.5 ms still polls instead of spinning.
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: poll on one pollfd we own.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(true);
            }
            return Err(self.io_error("wait for a DHCP packet", &e));
        }
        Ok(n > 0)
    }
}

/// The kernel drops an l3/l3s slave's broadcasts (the send fails with ENOBUFS).
pub(super) fn refuse_l3_ipvlan(link: &Link, where_: &str) -> Result<()> {
    if let Some(mode @ (IpvlanMode::L3 | IpvlanMode::L3s)) = link.ipvlan_mode {
        let mode = format!("{mode:?}").to_lowercase();
        return Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "{where_} is ipvlan in mode {mode}, which passes no broadcasts: DHCP needs mode l2"
            ),
        ));
    }
    Ok(())
}

/// The socket is made with protocol 0 (it receives nothing), gets its filter, and only
/// then is bound for IPv4 on the link: no unfiltered packet from another interface can
/// queue up in between.
fn packet_socket(index: u32) -> std::result::Result<OwnedFd, (&'static str, io::Error)> {
    // SAFETY: plain socket(2); the descriptor is owned right away.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(("open a packet socket", io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    attach_filter(fd.as_raw_fd()).map_err(|e| ("attach the DHCP packet filter", e))?;
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = (libc::ETH_P_IP as u16).to_be();
    addr.sll_ifindex = index as i32;
    // SAFETY: bind to a sockaddr_ll of the size we pass.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            sockaddr_ll_len(),
        )
    };
    if rc != 0 {
        return Err(("bind the packet socket", io::Error::last_os_error()));
    }
    Ok(fd)
}

/// Classic BPF: keep unfragmented (or first-fragment) UDP to port 68, so the socket is not
/// handed a copy of every packet the pod receives. On a SOCK_DGRAM packet socket offsets
/// start at the IPv4 header.
fn attach_filter(fd: RawFd) -> io::Result<()> {
    const LD_B_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const LD_H_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
    const LD_H_IND: u16 = 0x48; // BPF_LD | BPF_H | BPF_IND
    const LDX_B_MSH: u16 = 0xb1; // BPF_LDX | BPF_B | BPF_MSH: X = 4 * (P[k] & 0xf)
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut program = [
        op(LD_B_ABS, 0, 0, 9),
        op(JEQ_K, 0, 6, libc::IPPROTO_UDP as u32),
        op(LD_H_ABS, 0, 0, 6),
        op(JSET_K, 4, 0, 0x1fff),
        op(LDX_B_MSH, 0, 0, 0),
        op(LD_H_IND, 0, 0, 2),
        op(JEQ_K, 0, 1, CLIENT_PORT),
        op(RET_K, 0, 0, 0xffff),
        op(RET_K, 0, 0, 0),
    ];
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: the kernel copies the program during the call; `program` outlives it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn sockaddr_ll_len() -> libc::socklen_t {
    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_netns_is_no_interface_naming_both() {
        let e = PodSocket::open(Path::new("/run/netns/cnikit-no-such-ns"), "eth0").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NoInterface, "{e}");
        assert!(e.message.contains("cnikit-no-such-ns"), "{e}");
    }
}
