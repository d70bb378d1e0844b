//! The netlink socket, one type for every protocol family this crate speaks
//! (rtnetlink for links, addresses and routes; netfilter for nftables and
//! conntrack): sequence numbers, sending a datagram, and reading the answers
//! of an exchange. Messages are built elsewhere (the message crates, and
//! `frame.rs` for the netlink header); what a family adds on top lives in
//! `linkops.rs`, `bridge.rs`, `addr.rs`, `route.rs` (route) and `netfilter.rs`.

use super::frame::{self, Answer, Message, Reply};
use super::{Error, Failure, NetNs, Result};
use netlink_packet_core::{NetlinkSerializable, NLM_F_ACK, NLM_F_REQUEST};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;
use std::io;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;

/// Start size of the receive buffer; the kernel sizes dump datagrams after
/// the reader's buffer but caps them near 32 KiB, and a bigger datagram is
/// detected with MSG_PEEK|MSG_TRUNC and the buffer grows.
const RECV_BUF_SIZE: usize = 32 * 1024;
/// The kernel answers while it handles our send, so a reply that has not
/// come after this long never will; the caller must not hang forever.
const RECV_TIMEOUT_SECS: libc::time_t = 30;
/// The default socket send buffer; a larger datagram (an nftables batch of
/// thousands of elements) raises it first.
const DEFAULT_SNDBUF: usize = 200 * 1024;

/// A netlink protocol family: its protocol number and message type.
pub trait Family {
    const PROTOCOL: isize;
    /// Names the socket in errors: "open rtnetlink socket".
    const NAME: &'static str;
    type Message: NetlinkSerializable;
    /// Whether the family's sockets ask for NETLINK_GET_STRICT_CHK: the
    /// kernel then honours the filters in a dump request's header (and
    /// refuses a request with fields or attributes it cannot filter on).
    const STRICT_CHECK: bool = false;
}

/// NETLINK_ROUTE: links, addresses, routes, bridge ports.
pub struct Rtnetlink;

impl Family for Rtnetlink {
    const PROTOCOL: isize = NETLINK_ROUTE;
    const NAME: &'static str = "rtnetlink";
    type Message = RouteNetlinkMessage;
    /// So that a dump of one link's addresses (`ifa_index`) makes the kernel
    /// walk that link only, not every link of the netns. Every request this
    /// crate sends is valid under strict checking: dumps of links, routes,
    /// rules and addresses send all-zero headers without attributes (but for
    /// that index and a family), gets name only what the kernel looks up by
    /// (an index, IFLA_IFNAME, RTA_DST), and tc does not check. The kernel
    /// tests (`tests.rs`, the modules' own) send each of them.
    const STRICT_CHECK: bool = true;
}

/// A blocking netlink socket bound to the network namespace it was created
/// in. One request (or one batch) at a time; `&mut self` guarantees that.
pub struct Socket<F: Family> {
    socket: netlink_sys::Socket,
    seq: u32,
    buf: Vec<u8>,
    /// An exchange ended before all of its answers were read (an I/O error,
    /// a batch refused as a whole): they are discarded before the next send.
    unread: bool,
    family: PhantomData<F>,
}

/// The rtnetlink socket the plugins use.
pub type Netlink = Socket<Rtnetlink>;

impl<F: Family> Socket<F> {
    /// A socket in the calling thread's current network namespace.
    pub fn open() -> Result<Self> {
        let socket = netlink_sys::Socket::new(F::PROTOCOL)
            .map_err(|e| Error::io(&format!("open {} socket", F::NAME), &e))?;
        // Both are best effort (old kernels): extended acks give us the
        // kernel's own reason ("Unknown device type"), capped acks keep error
        // replies from echoing our whole request back.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        // Best effort too (Linux 4.20+): without it the kernel ignores a
        // dump's filters: whoever filters a dump checks its answers too.
        if F::STRICT_CHECK {
            let _ = socket.set_netlink_get_strict_chk(true);
        }
        set_recv_timeout(&socket);
        Ok(Socket {
            socket,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF_SIZE),
            unread: false,
            family: PhantomData,
        })
    }

    /// The socket's descriptor, for a caller that decides when it closes
    /// (`linger.rs`).
    pub(crate) fn into_fd(self) -> std::os::fd::OwnedFd {
        use std::os::fd::{FromRawFd, IntoRawFd};
        // SAFETY: into_raw_fd gives up the socket's ownership of its descriptor.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(self.socket.into_raw_fd()) }
    }

    /// A socket bound to `ns`: created while this thread is inside `ns`, it keeps
    /// talking to that namespace after the thread switched back.
    pub fn open_in(ns: &NetNs) -> Result<Self> {
        ns.run(Self::open)?
    }

    /// Sends one request (NLM_F_REQUEST|NLM_F_ACK|`flags`) and collects its
    /// data replies until the ACK (or NLMSG_DONE for dumps).
    pub(crate) fn request(&mut self, msg: F::Message, flags: u16) -> Result<Vec<Reply>, Failure> {
        let seq = self.next_seqs(1);
        self.send(&frame::encode(msg, NLM_F_REQUEST | NLM_F_ACK | flags, seq))?;
        let mut replies = Vec::new();
        self.receive(|m| {
            if m.seq != seq {
                return Ok(false);
            }
            match m.answer {
                Answer::Data(reply) => {
                    replies.push(reply);
                    Ok(false)
                }
                Answer::Ack => Ok(true),
                Answer::Failed(f) => Err(f),
            }
        })?;
        Ok(replies)
    }

    /// Reserves `n` consecutive sequence numbers and returns the first.
    pub(crate) fn next_seqs(&mut self, n: u32) -> u32 {
        let first = self.seq.wrapping_add(1);
        self.seq = self.seq.wrapping_add(n);
        first
    }

    /// Sends one datagram: a request or a batch of them.
    pub(crate) fn send(&mut self, datagram: &[u8]) -> Result<(), Failure> {
        super::fault::before_send().map_err(|e| self.io(e))?;
        if self.unread {
            self.discard_unread();
        }
        if datagram.len() > DEFAULT_SNDBUF {
            self.raise_sndbuf(datagram.len());
        }
        loop {
            match self.socket.send(datagram, 0) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io(e)),
            }
        }
    }

    /// Hands every received message to `on` until it says the exchange is
    /// over (`Ok(true)`) or fails. Messages of other sequence numbers are
    /// `on`'s to skip (late answers to an earlier exchange).
    pub(crate) fn receive(
        &mut self,
        mut on: impl FnMut(Message) -> Result<bool, Failure>,
    ) -> Result<(), Failure> {
        loop {
            self.recv_datagram(0)?;
            for m in frame::parse(&self.buf).inspect_err(|_| self.unread = true)? {
                if on(m)? {
                    return Ok(());
                }
            }
        }
    }

    /// Joins multicast group `group` (events of the family). The socket is
    /// bound first: the kernel delivers multicast only to bound sockets.
    pub(crate) fn join_group(&mut self, group: u32) -> Result<(), Failure> {
        self.socket.bind_auto().map_err(|e| self.io(e))?;
        self.socket.add_membership(group).map_err(|e| self.io(e))
    }

    /// Waits for one datagram (up to the receive timeout) and parses it.
    pub(crate) fn next_datagram(&mut self) -> Result<Vec<Message>, Failure> {
        self.recv_datagram(0)?;
        frame::parse(&self.buf)
    }

    /// We are root: SO_RCVBUFFORCE may exceed the system's maximum.
    pub(crate) fn raise_rcvbuf(&self, size: usize) {
        self.set_buffer(libc::SO_RCVBUFFORCE, size);
    }

    /// Marks the exchange unfinished: answers may still be queued.
    pub(crate) fn abandon(&mut self) {
        self.unread = true;
    }

    /// Reads one datagram from the kernel into `self.buf`, growing the buffer
    /// first when the pending datagram is larger than it.
    fn recv_datagram(&mut self, flags: libc::c_int) -> Result<(), Failure> {
        loop {
            self.buf.clear();
            let (size, _) = self.recv_retry(flags | libc::MSG_PEEK | libc::MSG_TRUNC)?;
            if size > self.buf.capacity() {
                self.buf.reserve(size);
            }
            self.buf.clear();
            let (_, from) = self.recv_retry(flags)?;
            // Only the kernel (port 0) may answer; ignore anything else.
            if from.port_number() == 0 {
                return Ok(());
            }
        }
    }

    fn recv_retry(
        &mut self,
        flags: libc::c_int,
    ) -> Result<(usize, netlink_sys::SocketAddr), Failure> {
        loop {
            match self.socket.recv_from(&mut self.buf, flags) {
                Ok(r) => return Ok(r),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // After ENOBUFS or a timeout the rest of the exchange
                    // may still arrive; it must not be taken for the next one's.
                    self.unread = true;
                    return Err(self.io(e));
                }
            }
        }
    }

    /// Reads and drops whatever is queued. The kernel has answered by the
    /// time our send returned, so nothing is still on its way.
    fn discard_unread(&mut self) {
        while self.recv_datagram(libc::MSG_DONTWAIT).is_ok() {}
        self.unread = false;
    }

    /// We are root: SO_SNDBUFFORCE may exceed the system's maximum.
    fn raise_sndbuf(&self, len: usize) {
        self.set_buffer(libc::SO_SNDBUFFORCE, len.saturating_mul(2));
    }

    /// A socket buffer size option (best effort: the default size stays).
    fn set_buffer(&self, option: libc::c_int, size: usize) {
        let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
        // SAFETY: plain setsockopt on our own socket with an int option value.
        unsafe {
            libc::setsockopt(
                self.socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    fn io(&self, err: io::Error) -> Failure {
        Failure::Io {
            socket: F::NAME,
            err,
        }
    }
}

fn set_recv_timeout(socket: &netlink_sys::Socket) {
    let tv = libc::timeval {
        tv_sec: RECV_TIMEOUT_SECS,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a timeval, as SO_RCVTIMEO expects.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}
