//! The rtnetlink socket: framing, sequence numbers, ack / dump handling and
//! errno translation. The typed operations live in `linkops.rs`, `bridge.rs`,
//! `addr.rs` and `route.rs` as further `impl Netlink` blocks.
use super::{Error, ErrorKind, NetNs, Result};
use netlink_packet_core::{
    NetlinkBuffer, NetlinkMessage, NlasIterator, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP,
    NLMSG_OVERRUN, NLM_F_ACK, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use std::io;

/// Start size of the receive buffer; dumps of a few hundred links fit, and
/// bigger datagrams are detected with MSG_PEEK|MSG_TRUNC and the buffer grows.
const RECV_BUF_SIZE: usize = 32 * 1024;
const NLMSG_HDR_LEN: usize = 16;
/// Flags of an NLMSG_ERROR: `NLM_F_CAPPED` = only the request's header is
/// echoed (not its body); `NLM_F_ACK_TLVS` = extended-ack attributes follow.
const NLM_F_CAPPED: u16 = 0x100;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;

/// A blocking rtnetlink socket bound to the network namespace it was created in.
pub struct Netlink {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// One reply message of ours: its netlink type and payload (after the nlmsghdr).
pub(crate) struct Reply {
    pub(crate) kind: u16,
    pub(crate) payload: Vec<u8>,
}

/// A request failure before an operation name is attached (see `Failure::context`).
#[derive(Debug)]
pub(crate) enum Failure {
    /// The kernel answered with -errno, plus its extended-ack text if any.
    Kernel {
        errno: i32,
        extack: Option<String>,
    },
    Io(io::Error),
    Decode(String),
}

impl Failure {
    /// The kernel's answer; socket I/O errors deliberately have none so that
    /// callers' "EEXIST is fine" / "ENODEV means absent" checks only ever
    /// look at what the kernel said about the object.
    pub(crate) fn errno(&self) -> Option<i32> {
        match self {
            Failure::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    pub(crate) fn extack(&self) -> Option<&str> {
        match self {
            Failure::Kernel { extack, .. } => extack.as_deref(),
            _ => None,
        }
    }

    /// Names the operation: "create veth a (peer b): File exists (kernel text)".
    pub(crate) fn context(self, what: &str) -> Error {
        match self {
            Failure::Kernel { errno, extack } => {
                let mut e = Error::from_errno(errno, what);
                if let Some(text) = extack {
                    e.message = format!("{} ({text})", e.message);
                }
                e
            }
            Failure::Io(err) => Error::io(&format!("{what}: netlink socket"), &err),
            Failure::Decode(msg) => Error::new(
                ErrorKind::Other,
                format!("{what}: cannot decode kernel reply: {msg}"),
            ),
        }
    }
}

impl Netlink {
    /// A socket in the calling thread's current network namespace.
    pub fn open() -> Result<Netlink> {
        let socket =
            Socket::new(NETLINK_ROUTE).map_err(|e| Error::io("open rtnetlink socket", &e))?;
        // Both are best effort (old kernels): extended acks give us the
        // kernel's own reason ("Unknown device type"), capped acks keep error
        // replies from echoing our whole request back.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        Ok(Netlink {
            socket,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF_SIZE),
        })
    }

    /// A socket bound to `ns`: created while this thread is inside `ns`, it keeps
    /// talking to that namespace after the thread switched back.
    pub fn open_in(ns: &NetNs) -> Result<Netlink> {
        ns.run(Netlink::open)?
    }

    /// Sends one request (NLM_F_REQUEST|NLM_F_ACK|`flags`) and collects our
    /// replies until the ACK (or NLMSG_DONE for dumps).
    pub(crate) fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> std::result::Result<Vec<Reply>, Failure> {
        let seq = self.send(msg, flags)?;
        let mut replies = Vec::new();
        loop {
            self.recv_datagram()?;
            if parse_datagram(&self.buf, seq, &mut replies)? {
                return Ok(replies);
            }
        }
    }

    fn send(&mut self, msg: RouteNetlinkMessage, flags: u16) -> std::result::Result<u32, Failure> {
        self.seq = self.seq.wrapping_add(1);
        let mut packet = NetlinkMessage::from(msg);
        packet.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        packet.header.sequence_number = self.seq;
        packet.finalize();
        let mut bytes = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut bytes);
        loop {
            match self.socket.send(&bytes, 0) {
                Ok(_) => return Ok(self.seq),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::Io(e)),
            }
        }
    }

    /// Reads one datagram from the kernel into `self.buf`, growing the buffer
    /// first when the pending datagram is larger than it.
    fn recv_datagram(&mut self) -> std::result::Result<(), Failure> {
        loop {
            self.buf.clear();
            let (size, _) = self.recv_retry(libc::MSG_PEEK | libc::MSG_TRUNC)?;
            if size > self.buf.capacity() {
                self.buf.reserve(size);
            }
            self.buf.clear();
            let (_, from) = self.recv_retry(0)?;
            // Only the kernel (port 0) may answer; ignore anything else.
            if from.port_number() == 0 {
                return Ok(());
            }
        }
    }

    fn recv_retry(
        &mut self,
        flags: libc::c_int,
    ) -> std::result::Result<(usize, netlink_sys::SocketAddr), Failure> {
        loop {
            match self.socket.recv_from(&mut self.buf, flags) {
                Ok(r) => return Ok(r),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::Io(e)),
            }
        }
    }
}

/// Walks the messages of one datagram; returns true when the exchange is over.
/// Messages with another sequence number (late replies to an earlier request)
/// are skipped.
fn parse_datagram(
    data: &[u8],
    seq: u32,
    replies: &mut Vec<Reply>,
) -> std::result::Result<bool, Failure> {
    let mut offset = 0;
    while let Some(rest) = data.get(offset..).filter(|r| r.len() >= NLMSG_HDR_LEN) {
        let msg = NetlinkBuffer::new_checked(rest).map_err(|e| Failure::Decode(e.to_string()))?;
        let len = msg.length() as usize;
        offset += align4(len);
        if msg.sequence_number() != seq {
            continue;
        }
        let payload = msg.payload();
        match msg.message_type() {
            NLMSG_NOOP => {}
            NLMSG_OVERRUN => return Err(Failure::Decode("netlink overrun".into())),
            NLMSG_ERROR => return error_reply(payload, msg.flags()).map(|()| true),
            NLMSG_DONE => return done_reply(payload).map(|()| true),
            // Data (a dump part, a GET answer or an NLM_F_ECHO copy): the
            // exchange ends with NLMSG_DONE for dumps, the ACK otherwise.
            kind => replies.push(Reply {
                kind,
                payload: payload.to_vec(),
            }),
        }
    }
    Ok(false)
}

/// NLMSG_ERROR with code 0 is the ACK; otherwise -errno and maybe extack text.
fn error_reply(payload: &[u8], flags: u16) -> std::result::Result<(), Failure> {
    let code = read_i32(payload)?;
    if code == 0 {
        return Ok(());
    }
    Err(Failure::Kernel {
        errno: code.saturating_neg(),
        extack: extack_message(payload, flags),
    })
}

/// NLMSG_DONE carries the dump's final status (negative errno on failure).
fn done_reply(payload: &[u8]) -> std::result::Result<(), Failure> {
    match read_i32(payload) {
        Ok(code) if code < 0 => Err(Failure::Kernel {
            errno: code.saturating_neg(),
            extack: None,
        }),
        _ => Ok(()),
    }
}

/// The NLMSGERR_ATTR_MSG string after the echoed request header (and the
/// request body unless the ack is capped).
fn extack_message(payload: &[u8], flags: u16) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let echoed = payload.get(4..8)?;
    let echoed_len = u32::from_ne_bytes(echoed.try_into().ok()?) as usize;
    let skip = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDR_LEN
    } else {
        align4(echoed_len)
    };
    let tlvs = payload.get(4 + skip..)?;
    NlasIterator::new(tlvs)
        .filter_map(|nla| nla.ok())
        .find(|nla| nla.kind() == NLMSGERR_ATTR_MSG)
        .map(|nla| {
            let text = nla.value().split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(text).trim().to_string()
        })
        .filter(|text| !text.is_empty())
}

fn read_i32(payload: &[u8]) -> std::result::Result<i32, Failure> {
    payload
        .get(0..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
        .ok_or_else(|| Failure::Decode("short NLMSG_ERROR/NLMSG_DONE".into()))
}

pub(crate) fn align4(len: usize) -> usize {
    (len + 3) & !3
}
