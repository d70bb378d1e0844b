//! The NETLINK_NETFILTER socket: single requests (get, dump) and nftables
//! batches (BATCH_BEGIN … BATCH_END), which the kernel applies whole or not at
//! all. Same shape as `netlink/socket.rs`: blocking, one request at a time,
//! sequence numbers, errno plus extended-ack text on failure.

use super::{Error, ErrorKind, Result};
use netlink_packet_core::{
    NetlinkBuffer, NetlinkMessage, NlasIterator, NLMSG_DONE, NLMSG_ERROR, NLMSG_OVERRUN, NLM_F_ACK,
    NLM_F_REQUEST,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterProtoFamily, NetfilterSubsystem,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, PoisonError};

const RECV_BUF_SIZE: usize = 64 * 1024;
const NLMSG_HDR_LEN: usize = 16;
const NLM_F_CAPPED: u16 = 0x100;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;
/// NFNL_BATCH_GENID: the batch applies only if the ruleset generation is still
/// this one (optimistic concurrency; the kernel answers ERESTART otherwise).
const NFNL_BATCH_GENID: u16 = 1;
/// A reply that never comes must not hang the runtime forever.
const RECV_TIMEOUT_SECS: libc::time_t = 30;
/// The default socket send buffer; larger batches raise it first.
const DEFAULT_SNDBUF: usize = 200 * 1024;

pub(crate) struct Nfnl {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// This process's netfilter sockets, one per network namespace, opened on
/// first use and closed only when the process exits. Why: closing one makes
/// the kernel take the nftables commit mutex and wait until whatever any
/// recent batch deleted is freed (an RCU grace period, ≈10 ms here), which
/// stalls every nftables user of the netns. A plugin therefore closes at most
/// one, at exit, after its work and with no lock of ours held.
static SOCKETS: Mutex<Vec<(u64, Nfnl)>> = Mutex::new(Vec::new());

/// Why a request or batch failed, before the caller names the operation.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The kernel said -errno; `index` is the batch message it blamed.
    Kernel {
        errno: i32,
        extack: Option<String>,
        index: Option<usize>,
    },
    Io(io::Error),
    Decode(String),
}

impl Failure {
    pub(crate) fn errno(&self) -> Option<i32> {
        match self {
            Failure::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// "create set pm4-any: File exists (kernel text)".
    pub(crate) fn context(self, what: &str) -> Error {
        match self {
            Failure::Kernel { errno, extack, .. } => {
                let mut e = Error::from_errno(errno, what);
                if let Some(text) = extack {
                    e.message = format!("{} ({text})", e.message);
                }
                e
            }
            Failure::Io(err) => Error::io(&format!("{what}: netfilter netlink socket"), &err),
            Failure::Decode(msg) => Error::new(
                ErrorKind::Other,
                format!("{what}: cannot decode kernel reply: {msg}"),
            ),
        }
    }
}

/// One data reply of a request.
pub(crate) struct Reply {
    pub(crate) kind: u16,
    pub(crate) payload: Vec<u8>,
}

impl Reply {
    /// Parsed with the crate's types (fine for small answers; see
    /// `nft::elements_of` for why set dumps are not parsed this way).
    pub(crate) fn decode(&self) -> std::result::Result<NetfilterMessage, Failure> {
        use netlink_packet_core::ParseableParametrized;
        NetfilterMessage::parse_with_param(&self.payload, self.kind)
            .map_err(|e| Failure::Decode(e.to_string()))
    }
}

/// One message of a datagram.
struct Raw {
    seq: u32,
    kind: u16,
    flags: u16,
    payload: Vec<u8>,
}

impl Nfnl {
    /// Runs `f` with this process's socket for the calling thread's netns.
    pub(crate) fn with<T>(f: impl FnOnce(&mut Nfnl) -> Result<T>) -> Result<T> {
        let ns = current_netns()?;
        let mut all = SOCKETS.lock().unwrap_or_else(PoisonError::into_inner);
        let pos = match all.iter().position(|(id, _)| *id == ns) {
            Some(pos) => pos,
            None => {
                all.push((ns, Nfnl::open()?));
                all.len() - 1
            }
        };
        f(&mut all[pos].1)
    }

    fn open() -> Result<Nfnl> {
        let socket = Socket::new(NETLINK_NETFILTER)
            .map_err(|e| Error::io("open netfilter netlink socket", &e))?;
        // Best effort, as in netlink/socket.rs: the kernel's reason text, and
        // error replies that do not echo our whole batch back.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        set_recv_timeout(&socket);
        Ok(Nfnl {
            socket,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF_SIZE),
        })
    }

    /// One request (GET or dump): the data replies (type and payload, which
    /// starts with the nfgenmsg header) until the ACK or NLMSG_DONE.
    pub(crate) fn request(
        &mut self,
        msg: NetfilterMessage,
        flags: u16,
    ) -> std::result::Result<Vec<Reply>, Failure> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = encode(msg, NLM_F_REQUEST | NLM_F_ACK | flags, seq);
        self.send(&bytes)?;
        let mut out = Vec::new();
        loop {
            for raw in self.recv()? {
                if raw.seq != seq {
                    continue;
                }
                match raw.kind {
                    NLMSG_ERROR => return error_code(&raw).map(|()| out),
                    NLMSG_DONE => return Ok(out),
                    NLMSG_OVERRUN => return Err(Failure::Decode("netlink overrun".into())),
                    kind => out.push(Reply {
                        kind,
                        payload: raw.payload,
                    }),
                }
            }
        }
    }

    /// Sends `msgs` as one nftables transaction. Every message asks for an ACK,
    /// so the exchange ends with the reply to the last one; a failure anywhere
    /// (or a changed generation, ERESTART) means nothing was applied.
    pub(crate) fn batch(
        &mut self,
        msgs: Vec<(NetfilterMessage, u16)>,
        genid: Option<u32>,
    ) -> std::result::Result<(), Failure> {
        let Some(count) = u32::try_from(msgs.len()).ok().filter(|n| *n > 0) else {
            return Ok(());
        };
        let begin = self.seq.wrapping_add(1);
        let mut bytes = encode(batch_marker(true, genid), NLM_F_REQUEST, begin);
        for (i, (msg, flags)) in (1..).zip(msgs) {
            let seq = begin.wrapping_add(i);
            bytes.extend(encode(msg, NLM_F_REQUEST | NLM_F_ACK | flags, seq));
        }
        let last = begin.wrapping_add(count);
        bytes.extend(encode(
            batch_marker(false, None),
            NLM_F_REQUEST,
            last.wrapping_add(1),
        ));
        self.seq = last.wrapping_add(1);
        self.raise_sndbuf(bytes.len());
        self.send(&bytes)?;
        self.batch_acks(begin, last)
    }

    /// Collects the acks of a batch whose messages carry `begin+1 ..= last`.
    fn batch_acks(&mut self, begin: u32, last: u32) -> std::result::Result<(), Failure> {
        let mut first_error = None;
        loop {
            for raw in self.recv()? {
                let ours = raw.seq.wrapping_sub(begin) <= last.wrapping_sub(begin);
                if raw.kind != NLMSG_ERROR || !ours {
                    continue;
                }
                if let Err(Failure::Kernel { errno, extack, .. }) = error_code(&raw) {
                    let index = raw.seq.wrapping_sub(begin).checked_sub(1);
                    let failure = Failure::Kernel {
                        errno,
                        extack,
                        index: index.map(|i| i as usize),
                    };
                    // Refused as a whole (generation changed, no permission):
                    // nothing else will be answered.
                    if raw.seq == begin {
                        return Err(failure);
                    }
                    first_error.get_or_insert(failure);
                }
                if raw.seq == last {
                    return first_error.map_or(Ok(()), Err);
                }
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> std::result::Result<(), Failure> {
        loop {
            match self.socket.send(bytes, 0) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::Io(e)),
            }
        }
    }

    /// A batch is one datagram; one larger than the default send buffer
    /// (a GC of thousands of entries) needs a bigger buffer (we are root).
    fn raise_sndbuf(&self, len: usize) {
        if len <= DEFAULT_SNDBUF {
            return;
        }
        let size = libc::c_int::try_from(len * 2).unwrap_or(libc::c_int::MAX);
        // SAFETY: plain setsockopt on our own socket with an int option value.
        unsafe {
            libc::setsockopt(
                self.socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    /// One datagram from the kernel, split into messages.
    fn recv(&mut self) -> std::result::Result<Vec<Raw>, Failure> {
        loop {
            self.buf.clear();
            let (size, _) = self.recv_retry(libc::MSG_PEEK | libc::MSG_TRUNC)?;
            if size > self.buf.capacity() {
                self.buf.reserve(size);
            }
            self.buf.clear();
            let (_, from) = self.recv_retry(0)?;
            if from.port_number() == 0 {
                return split(&self.buf);
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

/// The identity (nsfs inode) of the calling thread's network namespace.
pub(crate) fn current_netns() -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .map_err(|e| Error::io("read the current network namespace", &e))
}

fn set_recv_timeout(socket: &Socket) {
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

/// NFNL_MSG_BATCH_BEGIN / _END; res_id names the nftables subsystem.
fn batch_marker(begin: bool, genid: Option<u32>) -> NetfilterMessage {
    let header = NetfilterHeader::new(
        NetfilterProtoFamily::Unspec,
        0,
        u8::from(NetfilterSubsystem::NfTables).into(),
    );
    let inner = match (begin, genid) {
        (true, Some(id)) => ControlMessage::Other {
            message_type: 16, // NFNL_MSG_BATCH_BEGIN, carrying the generation
            attributes: vec![netlink_packet_core::DefaultNla::new(
                NFNL_BATCH_GENID,
                id.to_be_bytes().to_vec(),
            )],
        },
        (true, None) => ControlMessage::BatchBegin,
        (false, _) => ControlMessage::BatchEnd,
    };
    NetfilterMessage::new(header, inner)
}

fn encode(msg: NetfilterMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut packet = NetlinkMessage::from(msg);
    packet.header.flags = flags;
    packet.header.sequence_number = seq;
    packet.finalize();
    let mut bytes = vec![0u8; align4(packet.buffer_len())];
    packet.serialize(&mut bytes);
    bytes
}

fn split(data: &[u8]) -> std::result::Result<Vec<Raw>, Failure> {
    let mut out = Vec::new();
    let mut offset = 0;
    while let Some(rest) = data.get(offset..).filter(|r| r.len() >= NLMSG_HDR_LEN) {
        let msg = NetlinkBuffer::new_checked(rest).map_err(|e| Failure::Decode(e.to_string()))?;
        offset += align4(msg.length() as usize);
        out.push(Raw {
            seq: msg.sequence_number(),
            kind: msg.message_type(),
            flags: msg.flags(),
            payload: msg.payload().to_vec(),
        });
    }
    Ok(out)
}

/// NLMSG_ERROR: 0 is the ACK; otherwise -errno and maybe extack text.
fn error_code(raw: &Raw) -> std::result::Result<(), Failure> {
    let code = raw
        .payload
        .get(0..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
        .ok_or_else(|| Failure::Decode("short NLMSG_ERROR".into()))?;
    if code == 0 {
        return Ok(());
    }
    Err(Failure::Kernel {
        errno: code.saturating_neg(),
        extack: extack_message(&raw.payload, raw.flags),
        index: None,
    })
}

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
    NlasIterator::new(payload.get(4 + skip..)?)
        .filter_map(|nla| nla.ok())
        .find(|nla| nla.kind() == NLMSGERR_ATTR_MSG)
        .map(|nla| {
            let text = nla.value().split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(text).trim().to_string()
        })
        .filter(|text| !text.is_empty())
}

fn align4(len: usize) -> usize {
    (len + 3) & !3
}
