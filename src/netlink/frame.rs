//! Netlink framing, the same for every protocol family: a message with its
//! flags and sequence number as bytes, a received datagram as messages, and
//! what NLMSG_ERROR / NLMSG_DONE say (with the kernel's extended-ack text).
//! Pure functions over bytes; the socket does the I/O.

use super::Failure;
use netlink_packet_core::{
    NetlinkBuffer, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable, NlasIterator, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN,
};

const NLMSG_HDR_LEN: usize = 16;
/// Flags of an NLMSG_ERROR: `NLM_F_CAPPED` = only the request's header is
/// echoed (not its body); `NLM_F_ACK_TLVS` = extended-ack attributes follow.
const NLM_F_CAPPED: u16 = 0x100;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;

/// One data reply: its netlink type and payload (after the nlmsghdr).
pub(crate) struct Reply {
    pub(crate) kind: u16,
    pub(crate) payload: Vec<u8>,
}

impl Reply {
    /// Parsed with the message crate's types (fine for small answers; large
    /// dumps are better read attribute by attribute).
    pub(crate) fn decode<M: NetlinkDeserializable>(&self) -> Result<M, Failure> {
        let mut header = NetlinkHeader::default();
        header.message_type = self.kind;
        M::deserialize(&header, &self.payload).map_err(|e| Failure::Decode(e.to_string()))
    }
}

/// What one received message says.
pub(crate) enum Answer {
    /// Data: a dump part, a GET answer.
    Data(Reply),
    /// NLMSG_ERROR with code 0, or NLMSG_DONE: the request is through.
    Ack,
    /// NLMSG_ERROR or NLMSG_DONE with -errno.
    Failed(Failure),
}

/// One message of a datagram: the sequence number of the request it answers.
pub(crate) struct Message {
    pub(crate) seq: u32,
    pub(crate) answer: Answer,
}

/// `msg` as one netlink message, padded to a multiple of 4 so that messages
/// can be concatenated into one datagram.
pub(crate) fn encode<M: NetlinkSerializable>(msg: M, flags: u16, seq: u32) -> Vec<u8> {
    let mut packet =
        NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(msg));
    packet.header.flags = flags;
    packet.header.sequence_number = seq;
    packet.finalize();
    let mut bytes = vec![0u8; align4(packet.buffer_len())];
    packet.serialize(&mut bytes);
    bytes
}

/// The messages of one received datagram (NLMSG_NOOP left out).
pub(crate) fn parse(datagram: &[u8]) -> Result<Vec<Message>, Failure> {
    let mut out = Vec::new();
    let mut offset = 0;
    while let Some(rest) = datagram.get(offset..).filter(|r| r.len() >= NLMSG_HDR_LEN) {
        let msg = NetlinkBuffer::new_checked(rest).map_err(|e| Failure::Decode(e.to_string()))?;
        offset += align4(msg.length() as usize);
        let payload = msg.payload();
        let answer = match msg.message_type() {
            NLMSG_NOOP => continue,
            NLMSG_OVERRUN => return Err(Failure::Decode("netlink overrun".into())),
            NLMSG_ERROR => error_answer(payload, msg.flags())?,
            NLMSG_DONE => done_answer(payload),
            kind => Answer::Data(Reply {
                kind,
                payload: payload.to_vec(),
            }),
        };
        out.push(Message {
            seq: msg.sequence_number(),
            answer,
        });
    }
    Ok(out)
}

/// NLMSG_ERROR with code 0 is the ACK; otherwise -errno and maybe extack text.
fn error_answer(payload: &[u8], flags: u16) -> Result<Answer, Failure> {
    let code = read_i32(payload).ok_or_else(|| Failure::Decode("short NLMSG_ERROR".into()))?;
    if code == 0 {
        return Ok(Answer::Ack);
    }
    Ok(Answer::Failed(Failure::Kernel {
        errno: code.saturating_neg(),
        extack: extack_message(payload, flags),
    }))
}

/// NLMSG_DONE carries the dump's final status (negative errno on failure);
/// old kernels send it without one.
fn done_answer(payload: &[u8]) -> Answer {
    match read_i32(payload) {
        Some(code) if code < 0 => Answer::Failed(Failure::Kernel {
            errno: code.saturating_neg(),
            extack: None,
        }),
        _ => Answer::Ack,
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
    NlasIterator::new(payload.get(4 + skip..)?)
        .filter_map(|nla| nla.ok())
        .find(|nla| nla.kind() == NLMSGERR_ATTR_MSG)
        .map(|nla| {
            let text = nla.value().split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(text).trim().to_string()
        })
        .filter(|text| !text.is_empty())
}

fn read_i32(payload: &[u8]) -> Option<i32> {
    payload.get(0..4)?.try_into().ok().map(i32::from_ne_bytes)
}

pub(crate) fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// One netlink attribute (length, type, value), padded to 4 bytes: for nests the
/// message crates have no type for, and for tests that lay out what the kernel sends.
pub(crate) fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut out = Vec::with_capacity(align4(len));
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(align4(len), 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An nlmsghdr plus payload, as the kernel would send it.
    fn message(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let len = NLMSG_HDR_LEN + payload.len();
        let mut out = Vec::new();
        out.extend((len as u32).to_ne_bytes());
        out.extend(kind.to_ne_bytes());
        out.extend(flags.to_ne_bytes());
        out.extend(seq.to_ne_bytes());
        out.extend(0u32.to_ne_bytes());
        out.extend(payload);
        out.resize(align4(out.len()), 0);
        out
    }

    /// A capped NLMSG_ERROR: code, the echoed request header, then an
    /// NLMSGERR_ATTR_MSG attribute when `text` is given.
    fn error(code: i32, seq: u32, text: Option<&str>) -> Vec<u8> {
        let mut payload = code.to_ne_bytes().to_vec();
        payload.extend(message(0x10, 0, seq, &[]));
        let mut flags = NLM_F_CAPPED;
        if let Some(text) = text {
            flags |= NLM_F_ACK_TLVS;
            let mut value = text.as_bytes().to_vec();
            value.push(0);
            payload.extend(nla(NLMSGERR_ATTR_MSG, &value));
        }
        message(NLMSG_ERROR, flags, seq, &payload)
    }

    #[test]
    fn a_datagram_splits_into_answers() {
        let mut datagram = message(16, 0x2, 7, &[1, 2, 3, 4, 5]);
        datagram.extend(message(NLMSG_NOOP, 0, 7, &[]));
        datagram.extend(message(NLMSG_DONE, 0x2, 7, &0i32.to_ne_bytes()));
        datagram.extend(error(0, 8, None));
        datagram.extend(error(-libc::EEXIST, 9, Some("File already there")));
        datagram.extend(message(NLMSG_DONE, 0x2, 10, &(-libc::EINTR).to_ne_bytes()));
        let msgs = parse(&datagram).expect("parse");
        let seqs: Vec<u32> = msgs.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [7, 7, 8, 9, 10]);
        assert!(
            matches!(&msgs[0].answer, Answer::Data(r) if r.kind == 16 && r.payload == [1, 2, 3, 4, 5])
        );
        assert!(matches!(msgs[1].answer, Answer::Ack));
        assert!(matches!(msgs[2].answer, Answer::Ack));
        let Answer::Failed(f) = &msgs[3].answer else {
            panic!("error expected");
        };
        assert_eq!(f.errno(), Some(libc::EEXIST));
        assert_eq!(f.extack(), Some("File already there"));
        assert!(matches!(&msgs[4].answer, Answer::Failed(f) if f.errno() == Some(libc::EINTR)));
    }

    #[test]
    fn truncated_replies_are_decode_failures() {
        let short = message(NLMSG_ERROR, 0, 1, &[0, 0]);
        assert!(matches!(parse(&short), Err(Failure::Decode(_))));
        let mut overrun = message(NLMSG_OVERRUN, 0, 1, &[]);
        overrun.truncate(NLMSG_HDR_LEN);
        assert!(matches!(parse(&overrun), Err(Failure::Decode(_))));
    }

    #[test]
    fn encoded_messages_are_padded_and_numbered() {
        use netlink_packet_route::link::LinkMessage;
        use netlink_packet_route::RouteNetlinkMessage;
        let bytes = encode(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            0x5,
            42,
        );
        assert_eq!(bytes.len() % 4, 0);
        let header = NetlinkBuffer::new_checked(&bytes[..]).expect("header");
        assert_eq!(header.sequence_number(), 42);
        assert_eq!(header.flags(), 0x5);
        assert_eq!(header.message_type(), 18); // RTM_GETLINK
    }
}
