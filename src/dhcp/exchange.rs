//! The client's exchanges with the server (RFC 2131 §3, §4.4), each bounded by a deadline
//! and retransmitted on the reference's schedule.
//!
//! One exchange has one random xid (a NAK during acquire starts a new one), a deadline of
//! `timing.exchange` from its start, and retransmits the same message (only `secs`
//! changes) after 2 s ±1 s four times, then after 4 s ±1 s doubling up to
//! `timing.resend_max`, never waiting longer than `timing.reply` for an answer. An answer
//! to any transmission of the exchange counts.

use super::options::ClientOptions;
use super::socket::PodSocket;
use super::wire::{self, message_type, server_identifier, Fields, Reply, BROADCAST_MAC};
use super::{Error, ErrorKind, Result, Timing};
use crate::netlink::random_bytes;
use dhcproto::v4::{DhcpOption, MessageType};
use dhcproto::Encodable;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The reference's fast retransmissions: this many, 2 s ±1 s apart.
const FAST_RETRIES: u32 = 4;
const FAST_DELAY: Duration = Duration::from_secs(2);
/// The first delay of the exponential backoff after the fast ones (RFC 2131 §4.1).
const BACKOFF_START: Duration = Duration::from_secs(4);
const JITTER: Duration = Duration::from_secs(1);
/// REQUESTs sent for one OFFER before the client starts over with a DISCOVER
/// (the offering server may have gone away).
const REQUEST_TRIES: u32 = 4;
/// How often a wait looks at `cancel`.
const CANCEL_POLL: Duration = Duration::from_millis(200);
const RECV_BUF: usize = 4096;
const NO_ADDRESS: Ipv4Addr = Ipv4Addr::UNSPECIFIED;
/// Format of [`Ack::to_bytes`].
const ACK_FORMAT: u8 = 1;

/// An acknowledged lease: the server's DHCPACK as received, and where it came from.
/// An ACK without option 54 gets one made of its IP source, so that the server's
/// address stays with the message (in the lease file too).
#[derive(Debug, Clone, PartialEq)]
pub struct Ack {
    pub message: dhcproto::v4::Message,
    /// The link-layer source of the ACK: where unicasts (renew, release) go.
    pub server_mac: [u8; 6],
}

impl Ack {
    /// The ACK in `reply`, option 54 filled in from its IP source when missing.
    fn received(reply: &Reply, server_mac: [u8; 6]) -> Ack {
        let mut message = reply.message.clone();
        if server_identifier(&message).is_none() {
            message
                .opts_mut()
                .insert(DhcpOption::ServerIdentifier(reply.source));
        }
        Ack {
            message,
            server_mac,
        }
    }

    /// The leased address.
    pub fn yiaddr(&self) -> Ipv4Addr {
        self.message.yiaddr()
    }

    /// Option 54 (server identifier; for a received ACK, else its IP source). An ACK made
    /// elsewhere without one gives siaddr, else the broadcast address.
    pub fn server_id(&self) -> Ipv4Addr {
        server_identifier(&self.message).unwrap_or(match self.message.siaddr() {
            ip if ip.is_unspecified() => Ipv4Addr::BROADCAST,
            ip => ip,
        })
    }

    /// For the lease file: a format byte, the server's MAC (6 bytes), then the DHCP
    /// message as dhcproto encodes it.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let message = self
            .message
            .to_vec()
            .map_err(|e| Error::new(ErrorKind::Invalid, format!("encode the DHCPACK: {e}")))?;
        let mut out = Vec::with_capacity(7 + message.len());
        out.push(ACK_FORMAT);
        out.extend(self.server_mac);
        out.extend(message);
        Ok(out)
    }

    /// The inverse of [`Ack::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Ack> {
        let invalid = |why| Error::new(ErrorKind::Invalid, format!("stored DHCPACK: {why}"));
        let (head, message) = bytes
            .split_first_chunk::<7>()
            .filter(|(head, _)| head[0] == ACK_FORMAT)
            .ok_or_else(|| invalid("too short, or of another format"))?;
        let message = wire::decode_message(message).ok_or_else(|| invalid("no DHCP message"))?;
        let mut server_mac = [0u8; 6];
        server_mac.copy_from_slice(&head[1..]);
        Ok(Ack {
            message,
            server_mac,
        })
    }
}

/// One lease's client: its socket, identity and options, and how long it waits.
pub struct Client<'a> {
    pub socket: &'a PodSocket,
    pub options: &'a ClientOptions,
    pub timing: Timing,
    /// `-broadcast`: ask for broadcast answers (BROADCAST flag); ipvlan links always do.
    pub broadcast: bool,
    /// Set by another thread to end an exchange early (the lease is being released).
    pub cancel: Option<&'a AtomicBool>,
}

impl Client<'_> {
    /// INIT: DISCOVER → OFFER → REQUEST → ACK (a NAK starts over), asking for `requested`
    /// (option 50) when given.
    pub fn acquire(&self, requested: Option<Ipv4Addr>) -> Result<Ack> {
        let mut ex = self.exchange(String::new());
        let mut nak = None;
        while ex.is_open() {
            let extra = requested.map(DhcpOption::RequestedIpAddress);
            let discover = self.outgoing(
                MessageType::Discover,
                NO_ADDRESS,
                extra.into_iter().collect(),
            );
            let Some((offered, server)) = ex.transact(&discover, None, offer_of)? else {
                break;
            };
            nak = None;
            let extra = vec![
                DhcpOption::RequestedIpAddress(offered),
                DhcpOption::ServerIdentifier(server),
            ];
            let mut request = self.outgoing(MessageType::Request, NO_ADDRESS, extra);
            // The REQUEST answers the OFFER: same transaction (RFC 2131 §4.4.1).
            request.fields.xid = discover.fields.xid;
            let from_chosen = |r: &Reply, mac| {
                let id = server_identifier(&r.message).unwrap_or(r.source);
                (id == server).then(|| answer_of(r, mac)).flatten()
            };
            match ex.transact(&request, Some(REQUEST_TRIES), from_chosen)? {
                Some(Answer::Ack(ack)) => return Ok(ack),
                Some(Answer::Nak(refusal)) => nak = Some(refusal),
                None => {}
            }
        }
        Err(match nak {
            Some(refusal) => ex.refused(&refusal),
            None => ex.no_answer(),
        })
    }

    /// RENEWING: REQUEST with ciaddr, unicast from the leased address to the server.
    pub fn renew(&self, held: &Ack) -> Result<Ack> {
        let (addr, server) = (held.yiaddr(), held.server_id());
        let mut out = self.outgoing(MessageType::Request, addr, vec![]);
        (out.dst, out.mac) = (server, unicast_mac(held.server_mac));
        self.confirm(format!("the renewal of {addr} at {server} "), out)
    }

    /// REBINDING: REQUEST with ciaddr, broadcast.
    pub fn rebind(&self, held: &Ack) -> Result<Ack> {
        let addr = held.yiaddr();
        let out = self.outgoing(MessageType::Request, addr, vec![]);
        self.confirm(format!("the rebinding of {addr} "), out)
    }

    /// INIT-REBOOT: REQUEST for `address` (option 50), broadcast, from 0.0.0.0.
    pub fn reboot(&self, address: Ipv4Addr) -> Result<Ack> {
        let extra = vec![DhcpOption::RequestedIpAddress(address)];
        let out = self.outgoing(MessageType::Request, NO_ADDRESS, extra);
        self.confirm(format!("the INIT-REBOOT request for {address} "), out)
    }

    /// DHCPRELEASE, unicast from the leased address to the server. Sent once.
    pub fn release(&self, held: &Ack) -> Result<()> {
        let (addr, server) = (held.yiaddr(), held.server_id());
        let msg = wire::release_message(self.options, self.socket.mac(), new_xid(), addr, server);
        let packet = wire::client_packet(&msg, addr, server)?;
        self.socket.send(&packet, unicast_mac(held.server_mac))
    }

    /// A message of a new transaction from `ciaddr`, broadcast; the caller may make it a
    /// unicast.
    fn outgoing(&self, kind: MessageType, ciaddr: Ipv4Addr, extra: Vec<DhcpOption>) -> Outgoing {
        Outgoing {
            fields: Fields {
                kind,
                xid: new_xid(),
                secs: 0,
                ciaddr,
                extra,
                broadcast: self.broadcast || self.socket.needs_broadcast(),
            },
            src: ciaddr,
            dst: Ipv4Addr::BROADCAST,
            mac: BROADCAST_MAC,
        }
    }

    /// One REQUEST exchange answered by ACK (returned) or NAK (refused).
    fn confirm(&self, what: String, out: Outgoing) -> Result<Ack> {
        let mut ex = self.exchange(what);
        match ex.transact(&out, None, answer_of)? {
            Some(Answer::Ack(ack)) => Ok(ack),
            Some(Answer::Nak(refusal)) => Err(ex.refused(&refusal)),
            None => Err(ex.no_answer()),
        }
    }

    fn exchange(&self, what: String) -> Exchange<'_> {
        Exchange::open(self, what, self.timing.exchange)
    }

    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// One message to (re)transmit, and where to.
struct Outgoing {
    fields: Fields,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    mac: [u8; 6],
}

enum Answer {
    Ack(Ack),
    Nak(Refusal),
}

/// A DHCPNAK: who sent it and its option 56.
struct Refusal {
    server: Ipv4Addr,
    message: Option<String>,
}

/// The `sent` count: DISCOVERs and REQUESTs sent so far.
type Exchange<'c> = super::Exchange<'c, Client<'c>, [u32; 2]>;

impl Exchange<'_> {
    /// Sends `out` and retransmits it on the schedule until `accept` takes a reply, the
    /// deadline passes, or `max_sends` transmissions went unanswered (None).
    fn transact<T>(
        &mut self,
        out: &Outgoing,
        max_sends: Option<u32>,
        mut accept: impl FnMut(&Reply, [u8; 6]) -> Option<T>,
    ) -> Result<Option<T>> {
        let client = self.client;
        let mut schedule = Schedule::new(client.timing);
        let mut sends = 0;
        let mut buf = vec![0u8; RECV_BUF];
        while self.is_open() && max_sends.is_none_or(|max| sends < max) {
            if client.cancelled() {
                return Err(self.cancelled());
            }
            let fields = Fields {
                secs: u16::try_from(self.start.elapsed().as_secs()).unwrap_or(u16::MAX),
                ..out.fields.clone()
            };
            let msg = wire::client_message(client.options, client.socket.mac(), &fields);
            let packet = wire::client_packet(&msg, out.src, out.dst)?;
            client.socket.send(&packet, out.mac)?;
            sends += 1;
            self.sent[usize::from(out.fields.kind != MessageType::Discover)] += 1;
            let until = (Instant::now() + schedule.next_wait()).min(self.deadline);
            while let Some(wait) = until.checked_duration_since(Instant::now()) {
                if client.cancelled() {
                    return Err(self.cancelled());
                }
                let Some((n, mac)) = client.socket.recv(&mut buf, wait.min(CANCEL_POLL))? else {
                    continue;
                };
                let reply = buf
                    .get(..n)
                    .and_then(|p| wire::parse_reply(p, out.fields.xid, client.socket.mac()));
                if let Some(taken) = reply.and_then(|r| accept(&r, mac)) {
                    return Ok(Some(taken));
                }
            }
        }
        Ok(None)
    }

    /// "3 DISCOVERs, 1 REQUEST sent"
    fn sent(&self) -> String {
        let [d, r] = self.sent;
        let plural = |n: u32, name: &str| format!("{n} {name}{}", if n == 1 { "" } else { "s" });
        match (d, r) {
            (0, r) => format!("{} sent", plural(r, "REQUEST")),
            (d, 0) => format!("{} sent", plural(d, "DISCOVER")),
            (d, r) => format!("{}, {} sent", plural(d, "DISCOVER"), plural(r, "REQUEST")),
        }
    }

    /// "<head>on eth0 in /run/netns/x <tail> (3 DISCOVERs sent)"
    fn fail(&self, kind: ErrorKind, head: &str, tail: &str) -> Error {
        let (s, sent) = (self.client.socket, self.sent());
        let (ifname, ns) = (s.ifname(), s.netns_path().display());
        Error::new(kind, format!("{head}on {ifname} in {ns} {tail} ({sent})"))
    }

    /// What the exchange was about, for a message: acquire's is the lease request.
    fn what(&self) -> &str {
        match self.what.is_empty() {
            true => "the lease request ",
            false => &self.what,
        }
    }

    fn no_answer(&self) -> Error {
        let head = format!("no DHCP server answered {}", self.what);
        let tail = format!("within {}", seconds(self.client.timing.exchange));
        self.fail(ErrorKind::NoAnswer, &head, &tail)
    }

    fn refused(&self, nak: &Refusal) -> Error {
        let head = format!("DHCP server {} refused {}", nak.server, self.what());
        let tail = match &nak.message {
            Some(text) => format!("with DHCPNAK {text:?}"),
            None => "with a DHCPNAK".into(),
        };
        self.fail(ErrorKind::Refused, &head, &tail)
    }

    /// Cancelled by another thread: no answer, as far as the caller is concerned.
    fn cancelled(&self) -> Error {
        let head = format!("cancelled: stopped waiting for {}", self.what());
        let tail = format!("after {}", seconds(self.start.elapsed()));
        self.fail(ErrorKind::NoAnswer, &head, &tail)
    }
}

/// The reference's pauses between transmissions (`backoffRetry`), capped by `reply`.
struct Schedule {
    timing: Timing,
    retries: u32,
    backoff: Duration,
}

impl Schedule {
    fn new(timing: Timing) -> Schedule {
        Schedule {
            timing,
            retries: 0,
            backoff: BACKOFF_START,
        }
    }

    fn next_wait(&mut self) -> Duration {
        let base = if self.retries < FAST_RETRIES {
            FAST_DELAY
        } else {
            let base = self.backoff.min(self.timing.resend_max);
            if self.backoff < self.timing.resend_max {
                self.backoff *= 2;
            }
            base
        };
        self.retries += 1;
        jittered(base).min(self.timing.reply)
    }
}

/// `base` ±1 s, uniformly; never below half of `base`, so a small `resend_max` still
/// paces the retransmissions.
fn jittered(base: Duration) -> Duration {
    let r = u64::from_le_bytes(random_bytes::<8>());
    let span = JITTER.as_nanos() as u64 * 2;
    let offset = Duration::from_nanos(r % span);
    (base + offset).saturating_sub(JITTER).max(base / 2)
}

fn new_xid() -> u32 {
    u32::from_le_bytes(random_bytes::<4>())
}

/// An OFFER's address and server.
fn offer_of(r: &Reply, _mac: [u8; 6]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let offered = r.message.yiaddr();
    let usable = message_type(&r.message) == Some(MessageType::Offer) && !offered.is_unspecified();
    usable.then(|| (offered, server_identifier(&r.message).unwrap_or(r.source)))
}

fn answer_of(r: &Reply, mac: [u8; 6]) -> Option<Answer> {
    match message_type(&r.message)? {
        MessageType::Ack => Some(Answer::Ack(Ack::received(r, mac))),
        MessageType::Nak => Some(Answer::Nak(Refusal {
            server: server_identifier(&r.message).unwrap_or(r.source),
            message: wire::server_message(&r.message),
        })),
        _ => None,
    }
}

/// An unknown server MAC (zeros, e.g. an `Ack` made elsewhere) means broadcast.
fn unicast_mac(mac: [u8; 6]) -> [u8; 6] {
    if mac == [0; 6] {
        BROADCAST_MAC
    } else {
        mac
    }
}

/// "3s", or "2.5s" when not whole.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(reply: u64, resend_max: u64) -> Timing {
        let (reply, resend_max) = (Duration::from_secs(reply), Duration::from_secs(resend_max));
        Timing {
            reply,
            resend_max,
            ..Timing::default()
        }
    }

    #[test]
    fn the_schedule_is_the_references() {
        let mut s = Schedule::new(timing(100, 62));
        let waits: Vec<f64> = (0..10).map(|_| s.next_wait().as_secs_f64()).collect();
        let bases = [2.0, 2.0, 2.0, 2.0, 4.0, 8.0, 16.0, 32.0, 62.0, 62.0];
        for (w, base) in waits.iter().zip(bases) {
            assert!((base - 1.0..=base + 1.0).contains(w), "{waits:?}");
        }
    }

    #[test]
    fn no_wait_is_longer_than_the_reply_timeout() {
        let mut s = Schedule::new(timing(1, 2));
        assert!((0..8).all(|_| s.next_wait() <= Duration::from_secs(1)));
    }

    #[test]
    fn an_ack_round_trips_through_its_bytes() {
        let mut message = dhcproto::v4::Message::default();
        message
            .set_yiaddr([10, 99, 0, 9])
            .set_chaddr(&[2, 0, 0, 0, 0, 1]);
        let ack_type = DhcpOption::MessageType(MessageType::Ack);
        message.opts_mut().insert(ack_type);
        let source = Ipv4Addr::new(10, 99, 0, 1);
        let reply = Reply { message, source };
        let ack = Ack::received(&reply, [2, 0, 0, 0, 0, 2]);
        let back = Ack::from_bytes(&ack.to_bytes().unwrap()).unwrap();
        assert_eq!(back, ack);
        assert_eq!(back.yiaddr(), Ipv4Addr::new(10, 99, 0, 9));
        // No option 54: the ACK's source stands in, also after the round trip.
        assert_eq!(back.server_id(), Ipv4Addr::new(10, 99, 0, 1));
        let bare = Ack {
            message: reply.message.clone(),
            server_mac: [0; 6],
        };
        assert_eq!(bare.server_id(), Ipv4Addr::BROADCAST);
        let bytes = ack.to_bytes().unwrap();
        for len in 0..bytes.len().min(60) {
            assert!(Ack::from_bytes(&bytes[..len]).is_err(), "cut at {len}");
        }
        assert!(Ack::from_bytes(&[9; 300]).is_err());
    }

    #[test]
    fn seconds_and_macs_for_messages_and_unicasts() {
        assert_eq!(seconds(Duration::from_secs(3)), "3s");
        assert_eq!(seconds(Duration::from_millis(2500)), "2.5s");
        assert_eq!(unicast_mac([0; 6]), BROADCAST_MAC);
        assert_eq!(unicast_mac([2, 0, 0, 0, 0, 1]), [2, 0, 0, 0, 0, 1]);
    }
}
