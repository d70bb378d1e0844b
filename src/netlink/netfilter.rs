//! NETLINK_NETFILTER: the family of nftables and conntrack, and its batches.
//!
//! An nftables transaction is one datagram: NFNL_MSG_BATCH_BEGIN, the
//! messages, NFNL_MSG_BATCH_END. The kernel applies it whole or not at all
//! and, optionally, only if the ruleset generation is still the one the
//! caller read (optimistic concurrency: ERESTART otherwise).
//!
//! Acks. The kernel answers every failed message of a batch, but a message
//! that worked only when it asked for an ACK, and it sends all those answers
//! after the commit. Were every message to ask, a batch of a few hundred
//! messages would overflow the receive buffer with ACKs (ENOBUFS) after it
//! committed, and its success would be lost. So only the last message asks:
//! its answer is always the batch's last one, and the others are errors.

use super::frame::{self, Answer};
use super::socket::{Family, Socket};
use super::Failure;
use netlink_packet_core::{DefaultNla, NLM_F_ACK, NLM_F_REQUEST};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterProtoFamily, NetfilterSubsystem,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

/// NFNL_MSG_BATCH_BEGIN, here carrying the generation attribute.
const NFNL_MSG_BATCH_BEGIN: u8 = 16;
/// NFNL_BATCH_GENID: the batch applies only if the ruleset generation is
/// still this one.
const NFNL_BATCH_GENID: u16 = 1;

/// NETLINK_NETFILTER: nftables, conntrack.
pub struct Netfilter;

impl Family for Netfilter {
    const PROTOCOL: isize = NETLINK_NETFILTER;
    const NAME: &'static str = "netfilter netlink";
    type Message = NetfilterMessage;
}

/// NFNLGRP_NFTABLES: the multicast group of every committed nftables change.
const NFNLGRP_NFTABLES: u32 = 7;
/// The events socket's receive buffer: a flush of a ruleset with thousands
/// of elements is reported in one burst, and an overrun loses events.
const EVENTS_RCVBUF: usize = 8 << 20;

/// What a read of the events socket gave.
pub(crate) enum Events {
    /// The data messages of one datagram (`nft monitor`'s events, each
    /// batch's ending with NFT_MSG_NEWGEN).
    Got(Vec<frame::Reply>),
    /// None came within the socket's receive timeout.
    Quiet,
    /// The kernel dropped events (the buffer overran): anything may have
    /// changed.
    Lost,
}

impl Socket<Netfilter> {
    /// A socket that is told of every committed nftables change of its
    /// network namespace (as `nft monitor` is).
    pub(crate) fn nftables_events() -> Result<Self, Failure> {
        let mut s = Self::open().map_err(|e| Failure::Io {
            socket: Netfilter::NAME,
            err: std::io::Error::other(e.to_string()),
        })?;
        s.join_group(NFNLGRP_NFTABLES)?;
        s.raise_rcvbuf(EVENTS_RCVBUF);
        Ok(s)
    }

    /// The next datagram's events.
    pub(crate) fn events(&mut self) -> Result<Events, Failure> {
        match self.next_datagram() {
            Ok(messages) => Ok(Events::Got(
                messages
                    .into_iter()
                    .filter_map(|m| match m.answer {
                        Answer::Data(reply) => Some(reply),
                        _ => None,
                    })
                    .collect(),
            )),
            Err(f) if f.io_errno() == Some(libc::ENOBUFS) => Ok(Events::Lost),
            Err(f) if matches!(f.io_errno(), Some(libc::EAGAIN)) => Ok(Events::Quiet),
            Err(f) => Err(f),
        }
    }
}

/// Why a batch was not applied: the failure, and the index of the message
/// the kernel blamed (None: the batch as a whole, e.g. a changed generation,
/// a failed commit, or the socket).
#[derive(Debug)]
pub(crate) struct BatchFailure {
    pub(crate) index: Option<usize>,
    pub(crate) failure: Failure,
}

impl Socket<Netfilter> {
    /// Sends `msgs` (each with its own NLM_F_* flags) as one nftables
    /// transaction, conditional on `genid` when given. Ok means the kernel
    /// committed it; on any failure nothing was applied.
    pub(crate) fn batch(
        &mut self,
        msgs: Vec<(NetfilterMessage, u16)>,
        genid: Option<u32>,
    ) -> Result<(), BatchFailure> {
        let whole = |failure| BatchFailure {
            index: None,
            failure,
        };
        let Some(count) = u32::try_from(msgs.len()).ok().filter(|n| *n > 0) else {
            return Ok(());
        };
        let begin = self.next_seqs(count + 2);
        let last = begin.wrapping_add(count);
        self.send(&batch_datagram(msgs, genid, begin))
            .map_err(whole)?;
        let mut first_error = None;
        let answered = self.receive(|m| {
            let offset = m.seq.wrapping_sub(begin);
            if offset > count {
                return Ok(false);
            }
            if let Answer::Failed(failure) = m.answer {
                // The batch refused as a whole; the individual answers that
                // may follow say nothing more.
                if offset == 0 {
                    return Err(failure);
                }
                first_error.get_or_insert(BatchFailure {
                    index: Some(offset as usize - 1),
                    failure,
                });
            }
            Ok(m.seq == last)
        });
        if let Err(failure) = answered {
            self.abandon();
            return Err(whole(failure));
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The datagram of a batch whose BATCH_BEGIN has sequence number `begin`
/// and whose messages follow it one by one; only the last one asks for an
/// ACK (see the module docs).
fn batch_datagram(msgs: Vec<(NetfilterMessage, u16)>, genid: Option<u32>, begin: u32) -> Vec<u8> {
    let count = msgs.len();
    let mut bytes = frame::encode(batch_begin(genid), NLM_F_REQUEST, begin);
    for (i, (msg, flags)) in msgs.into_iter().enumerate() {
        let ack = if i + 1 == count { NLM_F_ACK } else { 0 };
        let seq = begin.wrapping_add(i as u32 + 1);
        bytes.extend(frame::encode(msg, NLM_F_REQUEST | ack | flags, seq));
    }
    let end = begin.wrapping_add(count as u32 + 1);
    bytes.extend(frame::encode(batch_end(), NLM_F_REQUEST, end));
    bytes
}

/// res_id names the subsystem the batch is for: nftables.
fn batch_header() -> NetfilterHeader {
    NetfilterHeader::new(
        NetfilterProtoFamily::Unspec,
        0,
        u8::from(NetfilterSubsystem::NfTables).into(),
    )
}

fn batch_begin(genid: Option<u32>) -> NetfilterMessage {
    let inner = match genid {
        Some(id) => ControlMessage::Other {
            message_type: NFNL_MSG_BATCH_BEGIN,
            attributes: vec![DefaultNla::new(NFNL_BATCH_GENID, id.to_be_bytes().to_vec())],
        },
        None => ControlMessage::BatchBegin,
    };
    NetfilterMessage::new(batch_header(), inner)
}

fn batch_end() -> NetfilterMessage {
    NetfilterMessage::new(batch_header(), ControlMessage::BatchEnd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::NetlinkBuffer;

    /// (type, flags, seq) of every message of a datagram.
    fn headers(mut bytes: &[u8]) -> Vec<(u16, u16, u32)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let msg = NetlinkBuffer::new_checked(bytes).expect("message");
            out.push((msg.message_type(), msg.flags(), msg.sequence_number()));
            bytes = &bytes[frame::align4(msg.length() as usize)..];
        }
        out
    }

    #[test]
    fn only_the_last_message_of_a_batch_asks_for_an_ack() {
        let msg = || (batch_end(), 0x400);
        let bytes = batch_datagram(vec![msg(), msg(), msg()], Some(9), 100);
        let h = headers(&bytes);
        let seqs: Vec<u32> = h.iter().map(|m| m.2).collect();
        assert_eq!(seqs, [100, 101, 102, 103, 104]);
        assert_eq!(h[0], (0x10, NLM_F_REQUEST, 100));
        let acks: Vec<bool> = h.iter().map(|m| m.1 & NLM_F_ACK != 0).collect();
        assert_eq!(acks, [false, false, false, true, false]);
        assert!(h[1..4].iter().all(|m| m.1 & 0x400 != 0));
        assert_eq!(h[4].0, 0x11); // NFNL_MSG_BATCH_END
    }

    #[test]
    fn the_generation_rides_on_batch_begin() {
        let with = frame::encode(batch_begin(Some(0x01020304)), NLM_F_REQUEST, 1);
        let without = frame::encode(batch_begin(None), NLM_F_REQUEST, 1);
        assert_eq!(with.len(), without.len() + 8);
        assert_eq!(&with[with.len() - 4..], &[1, 2, 3, 4]);
    }
}
