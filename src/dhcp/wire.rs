//! DHCP messages in IPv4/UDP packets, both ways: a client message (made here with the
//! lease's options) leaves as a whole IPv4 packet (the packet socket adds the Ethernet
//! header), and a received packet is a reply to us only when it is UDP to port 68, a
//! BOOTREPLY, for our transaction and our MAC.

use super::options::{ClientOptions, CLIENT_IDENTIFIER};
use super::{Error, ErrorKind, Result};
use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode, UnknownOption};
use dhcproto::{Decodable, Encodable};
use etherparse::{IpNumber, Ipv4Slice, PacketBuilder, UdpSlice};
use std::net::Ipv4Addr;

pub const CLIENT_PORT: u16 = 68;
pub const SERVER_PORT: u16 = 67;
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];

/// RFC 1542 §2.1: relay agents and some servers drop BOOTP messages shorter than this.
const MIN_MESSAGE_LEN: usize = 300;
const TTL: u8 = 64;
/// Option 57: what we can take (an Ethernet MTU's worth).
const MAX_MESSAGE_SIZE: u16 = 1500;

/// What one transmission says besides the lease's own options.
#[derive(Debug, Clone)]
pub struct Fields {
    pub kind: MessageType,
    pub xid: u32,
    /// Seconds since the exchange began.
    pub secs: u16,
    pub ciaddr: Ipv4Addr,
    /// The exchange's options (50, 54), before the lease's.
    pub extra: Vec<DhcpOption>,
    /// `-broadcast`: the BROADCAST flag, for a client without an address.
    pub broadcast: bool,
}

/// One client message: the type and the exchange's own options, option 57, the client
/// identifier, the `provide` options (each replacing an earlier one of its code, as the
/// reference's `Options.Update`), then the parameter request list when there is one.
pub fn client_message(options: &ClientOptions, mac: [u8; 6], f: &Fields) -> Message {
    let none = Ipv4Addr::UNSPECIFIED;
    let mut msg = Message::new_with_id(f.xid, f.ciaddr, none, none, none, &mac);
    msg.set_secs(f.secs);
    // A client that has an address takes unicasts (RFC 2131 §4.1).
    if f.broadcast && f.ciaddr.is_unspecified() {
        msg.set_flags(Flags::default().set_broadcast());
    }
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(f.kind));
    for option in &f.extra {
        opts.insert(option.clone());
    }
    opts.insert(DhcpOption::MaxMessageSize(MAX_MESSAGE_SIZE));
    if !options.client_id.is_empty() {
        opts.insert(DhcpOption::ClientIdentifier(options.client_id.clone()));
    }
    for (code, value) in options.provide.iter().filter(|(c, _)| providable(*c)) {
        opts.remove(OptionCode::from(*code));
        opts.insert(raw_option(*code, value));
    }
    if !options.request.is_empty() {
        let codes = options
            .request
            .iter()
            .map(|&c| OptionCode::from(c))
            .collect();
        opts.insert(DhcpOption::ParameterRequestList(codes));
    }
    msg
}

/// DHCPRELEASE of `ciaddr` to `server`, carrying the identifier the server knows us by.
pub fn release_message(
    options: &ClientOptions,
    mac: [u8; 6],
    xid: u32,
    ciaddr: Ipv4Addr,
    server: Ipv4Addr,
) -> Message {
    let none = Ipv4Addr::UNSPECIFIED;
    let mut msg = Message::new_with_id(xid, ciaddr, none, none, none, &mac);
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(MessageType::Release));
    opts.insert(DhcpOption::ServerIdentifier(server));
    let provided = options
        .provide
        .iter()
        .rev()
        .find(|(code, _)| *code == CLIENT_IDENTIFIER);
    if let Some((code, value)) = provided {
        opts.insert(raw_option(*code, value));
    } else if !options.client_id.is_empty() {
        opts.insert(DhcpOption::ClientIdentifier(options.client_id.clone()));
    }
    msg
}

/// Pad, End and the message type belong to the protocol, not to the user: a provided
/// one would make the message unreadable to the server.
fn providable(code: u8) -> bool {
    !matches!(code, 0 | 53 | 255)
}

/// A provided value goes on the wire as given, whatever its code's usual type.
fn raw_option(code: u8, value: &[u8]) -> DhcpOption {
    DhcpOption::Unknown(UnknownOption::new(OptionCode::from(code), value.to_vec()))
}

/// Option 53.
pub fn message_type(msg: &Message) -> Option<MessageType> {
    match msg.opts().get(OptionCode::MessageType) {
        Some(DhcpOption::MessageType(t)) => Some(*t),
        _ => None,
    }
}

/// Option 54, when set to an address.
pub fn server_identifier(msg: &Message) -> Option<Ipv4Addr> {
    match msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) if !ip.is_unspecified() => Some(*ip),
        _ => None,
    }
}

/// Option 56: a NAK's reason.
pub fn server_message(msg: &Message) -> Option<String> {
    match msg.opts().get(OptionCode::Message) {
        Some(DhcpOption::Message(text)) => Some(text.clone()),
        _ => None,
    }
}

/// A reply addressed to us, and the IP address it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub message: Message,
    pub source: Ipv4Addr,
}

/// `msg` in an IPv4/UDP packet from `src`:68 to `dst`:67, checksums filled in.
pub fn client_packet(msg: &Message, src: Ipv4Addr, dst: Ipv4Addr) -> Result<Vec<u8>> {
    let mut payload = msg.to_vec().map_err(|e| {
        Error::new(
            ErrorKind::Invalid,
            format!("encode DHCP message (xid {:#010x}): {e}", msg.xid()),
        )
    })?;
    if payload.len() < MIN_MESSAGE_LEN {
        payload.resize(MIN_MESSAGE_LEN, 0);
    }
    let builder =
        PacketBuilder::ipv4(src.octets(), dst.octets(), TTL).udp(CLIENT_PORT, SERVER_PORT);
    let mut packet = Vec::with_capacity(builder.size(payload.len()));
    builder.write(&mut packet, &payload).map_err(|e| {
        Error::new(
            ErrorKind::Invalid,
            format!("build the IPv4/UDP packet of a DHCP message: {e}"),
        )
    })?;
    Ok(packet)
}

/// The reply in `packet` (an IPv4 packet, padding after it allowed) when it is UDP to
/// port 68 and a BOOTREPLY for `xid` and `chaddr`; anything else is None.
///
/// The UDP checksum is not verified: on a veth or another offloading link the packet
/// socket sees the checksum before the hardware would fill it in, so a correct packet
/// can carry a partial one. The IPv4 header checksum is always complete, and is checked.
pub fn parse_reply(packet: &[u8], xid: u32, chaddr: [u8; 6]) -> Option<Reply> {
    let ip = Ipv4Slice::from_slice(packet).ok()?;
    let header = ip.header();
    if ip.is_payload_fragmented() || ip.payload_ip_number() != IpNumber::UDP {
        return None;
    }
    if header.to_header().calc_header_checksum() != header.header_checksum() {
        return None;
    }
    let udp = UdpSlice::from_slice(ip.payload().payload).ok()?;
    if udp.destination_port() != CLIENT_PORT {
        return None;
    }
    let message = decode_message(udp.payload())?;
    let ours =
        message.opcode() == Opcode::BootReply && message.xid() == xid && message.chaddr() == chaddr;
    ours.then(|| Reply {
        message,
        source: header.source_addr(),
    })
}

/// A DHCP message from bytes someone else wrote, None when dhcproto would fail or panic
/// on it (its accessors trust hlen, its option decoders some lengths).
pub fn decode_message(bytes: &[u8]) -> Option<Message> {
    if !options_decodable(bytes.get(OPTIONS_AT..).unwrap_or_default()) {
        return None;
    }
    let message = Message::from_bytes(bytes).ok()?;
    (message.hlen() <= 16).then_some(message)
}

/// Where a DHCP message's options start: after the fixed fields and the magic cookie.
const OPTIONS_AT: usize = 240;

/// Whether dhcproto can decode these options without tripping over a length it takes for
/// granted (its debug assertions, and a subtraction, for a few codes). It joins
/// consecutive options of one code (RFC 3396), so their lengths are summed here too.
fn options_decodable(options: &[u8]) -> bool {
    let length_ok = |run: Option<(u8, usize)>| match run {
        Some((80, len)) => len == 0,
        Some((81, len)) => len >= 3,
        Some((94, len)) => len == 3,
        Some((151, len)) => len >= 1,
        Some((152..=155, len)) => len == 4,
        _ => true,
    };
    let mut run: Option<(u8, usize)> = None;
    let mut at = 0;
    while let Some(&code) = options.get(at) {
        if code == 0 || code == 255 {
            if !length_ok(run.take()) {
                return false;
            }
            if code == 255 {
                return true;
            }
            at += 1;
            continue;
        }
        let Some(&len) = options.get(at + 1) else {
            break;
        };
        let len = usize::from(len);
        at += 2 + len;
        run = match run {
            Some((c, sum)) if c == code => Some((c, sum + len)),
            other if !length_ok(other) => return false,
            _ => Some((code, len)),
        };
    }
    length_ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v4::HType;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 7];
    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

    fn ack(xid: u32, chaddr: &[u8]) -> Message {
        let mut m = Message::new_with_id(
            xid,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::new(10, 99, 0, 50),
            SERVER,
            Ipv4Addr::UNSPECIFIED,
            chaddr,
        );
        m.set_opcode(Opcode::BootReply).set_htype(HType::Eth);
        m.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Ack));
        m.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
        m
    }

    /// A server's packet: the same framing as ours, with the ports swapped.
    fn server_packet(msg: &Message, src: Ipv4Addr) -> Vec<u8> {
        let payload = msg.to_vec().unwrap();
        let builder = PacketBuilder::ipv4(src.octets(), [255; 4], 64).udp(67, 68);
        let mut out = Vec::new();
        builder.write(&mut out, &payload).unwrap();
        out
    }

    #[test]
    fn a_client_message_round_trips_through_ipv4_and_udp() {
        let mut m = Message::new_with_id(
            0x1234_5678,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &MAC,
        );
        m.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Discover));
        let packet = client_packet(&m, Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST).unwrap();
        let ip = Ipv4Slice::from_slice(&packet).unwrap();
        let h = ip.header();
        assert_eq!(h.source_addr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(h.destination_addr(), Ipv4Addr::BROADCAST);
        assert_eq!(h.to_header().calc_header_checksum(), h.header_checksum());
        let udp = UdpSlice::from_slice(ip.payload().payload).unwrap();
        assert_eq!((udp.source_port(), udp.destination_port()), (68, 67));
        let sum = udp
            .to_header()
            .calc_checksum_ipv4(&h.to_header(), udp.payload())
            .unwrap();
        assert_eq!(sum, udp.checksum());
        assert!(udp.payload().len() >= MIN_MESSAGE_LEN);
        assert_eq!(Message::from_bytes(udp.payload()).unwrap(), m);
    }

    #[test]
    fn a_reply_for_us_parses_with_its_source() {
        let mut packet = server_packet(&ack(7, &MAC), SERVER);
        // Ethernet's minimum frame size pads short packets; total_len says where to stop.
        packet.extend([0; 20]);
        let reply = parse_reply(&packet, 7, MAC).unwrap();
        assert_eq!(reply.source, SERVER);
        assert_eq!(reply.message, ack(7, &MAC));
    }

    #[test]
    fn foreign_transactions_macs_ports_and_requests_are_ignored() {
        assert!(parse_reply(&server_packet(&ack(8, &MAC), SERVER), 7, MAC).is_none());
        let other = [2, 0, 0, 0, 0, 8];
        assert!(parse_reply(&server_packet(&ack(7, &other), SERVER), 7, MAC).is_none());
        let mut request = ack(7, &MAC);
        request.set_opcode(Opcode::BootRequest);
        assert!(parse_reply(&server_packet(&request, SERVER), 7, MAC).is_none());
        // Another client's request to the server (port 67).
        let ours = client_packet(&ack(7, &MAC), Ipv4Addr::UNSPECIFIED, SERVER).unwrap();
        assert!(parse_reply(&ours, 7, MAC).is_none());
    }

    fn options(provide: Vec<(u8, Vec<u8>)>, request: Vec<u8>) -> ClientOptions {
        ClientOptions {
            client_id: b"\0c1/net/eth0".to_vec(),
            provide,
            request,
        }
    }

    fn fields(kind: MessageType, ciaddr: Ipv4Addr) -> Fields {
        Fields {
            kind,
            xid: 9,
            secs: 3,
            ciaddr,
            extra: vec![DhcpOption::RequestedIpAddress([10, 99, 0, 5].into())],
            broadcast: true,
        }
    }

    /// The message as the server decodes it.
    fn on_the_wire(m: &Message) -> Message {
        Message::from_bytes(&m.to_vec().unwrap()).unwrap()
    }

    #[test]
    fn provided_options_replace_earlier_ones_of_their_code() {
        let o = options(
            vec![
                (12, b"a".to_vec()),
                (12, b"web-0".to_vec()),
                (61, b"\x01mine".to_vec()),
            ],
            vec![3, 1],
        );
        let m = on_the_wire(&client_message(
            &o,
            MAC,
            &fields(MessageType::Discover, Ipv4Addr::UNSPECIFIED),
        ));
        let get = |code: u8| m.opts().get(OptionCode::from(code)).cloned();
        assert_eq!(get(12), Some(DhcpOption::Hostname("web-0".into())));
        assert_eq!(
            get(61),
            Some(DhcpOption::ClientIdentifier(b"\x01mine".to_vec()))
        );
        assert_eq!(
            get(50),
            Some(DhcpOption::RequestedIpAddress([10, 99, 0, 5].into()))
        );
        assert_eq!(get(57), Some(DhcpOption::MaxMessageSize(1500)));
        let prl = vec![OptionCode::Router, OptionCode::SubnetMask];
        assert_eq!(get(55), Some(DhcpOption::ParameterRequestList(prl)));
        assert_eq!(message_type(&m), Some(MessageType::Discover));
        assert_eq!((m.xid(), m.secs(), m.chaddr()), (9, 3, &MAC[..]));
        assert!(m.flags().broadcast());
    }

    #[test]
    fn the_identifier_and_no_request_list_when_nothing_is_asked_for() {
        let o = options(vec![(53, vec![1])], vec![]);
        let m = on_the_wire(&client_message(
            &o,
            MAC,
            &fields(MessageType::Request, [10, 99, 0, 5].into()),
        ));
        let id = DhcpOption::ClientIdentifier(b"\0c1/net/eth0".to_vec());
        assert_eq!(m.opts().get(OptionCode::ClientIdentifier), Some(&id));
        assert!(m.opts().get(OptionCode::ParameterRequestList).is_none());
        // The message type is not the user's to replace.
        assert_eq!(message_type(&m), Some(MessageType::Request));
        // A client with an address takes unicasts.
        assert!(!m.flags().broadcast());
        assert_eq!(m.ciaddr(), Ipv4Addr::new(10, 99, 0, 5));
    }

    #[test]
    fn a_release_names_the_server_and_the_identifier_the_server_knows() {
        let addr = Ipv4Addr::new(10, 99, 0, 5);
        let o = options(vec![(12, b"x".to_vec())], vec![1]);
        let m = on_the_wire(&release_message(&o, MAC, 5, addr, SERVER));
        assert_eq!(message_type(&m), Some(MessageType::Release));
        assert_eq!(server_identifier(&m), Some(SERVER));
        assert_eq!(m.ciaddr(), addr);
        let id = DhcpOption::ClientIdentifier(b"\0c1/net/eth0".to_vec());
        assert_eq!(m.opts().get(OptionCode::ClientIdentifier), Some(&id));
        assert!(m.opts().get(OptionCode::Hostname).is_none());
        let o = options(vec![(61, b"\x01mine".to_vec())], vec![]);
        let m = on_the_wire(&release_message(&o, MAC, 5, addr, SERVER));
        let id = DhcpOption::ClientIdentifier(b"\x01mine".to_vec());
        assert_eq!(m.opts().get(OptionCode::ClientIdentifier), Some(&id));
    }

    #[test]
    fn options_dhcproto_would_assert_on_are_refused() {
        let end = |mut v: Vec<u8>| {
            v.push(255);
            v
        };
        assert!(options_decodable(&end(vec![
            53, 1, 5, 1, 4, 255, 255, 255, 0
        ])));
        assert!(!options_decodable(&end(vec![53, 1, 5, 151, 0])));
        assert!(!options_decodable(&end(vec![81, 2, 0, 0])));
        assert!(!options_decodable(&[80, 1, 0]));
        // Two parts of one option are one option of their summed length.
        assert!(options_decodable(&end(vec![152, 2, 0, 0, 152, 2, 0, 0])));
        assert!(!options_decodable(&end(vec![
            152, 2, 0, 0, 0, 152, 2, 0, 0
        ])));
    }

    #[test]
    fn a_bad_ip_header_checksum_is_ignored() {
        let mut packet = server_packet(&ack(7, &MAC), SERVER);
        packet[10] ^= 0xff;
        assert!(parse_reply(&packet, 7, MAC).is_none());
    }

    #[test]
    fn truncated_and_garbage_packets_are_ignored_without_panics() {
        let packet = server_packet(&ack(7, &MAC), SERVER);
        for len in 0..packet.len() {
            assert!(
                parse_reply(&packet[..len], 7, MAC).is_none(),
                "cut at {len}"
            );
        }
        // A consistent IPv4/UDP packet whose DHCP message is cut short.
        let payload = ack(7, &MAC).to_vec().unwrap();
        for len in [0, 1, 20, 100, 235, 239] {
            let mut out = Vec::new();
            PacketBuilder::ipv4(SERVER.octets(), [255; 4], 64)
                .udp(67, 68)
                .write(&mut out, &payload[..len])
                .unwrap();
            assert!(parse_reply(&out, 7, MAC).is_none(), "message cut at {len}");
        }
        // Random bytes in the message, and random options after a valid fixed part
        // (where dhcproto's per-option decoders run).
        let mut state = 0x2545_f491_u32;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        for round in 0..20000 {
            let mut junk = packet.clone();
            for _ in 0..8 {
                let r = next();
                let at = r as usize % junk.len();
                junk[at] = (r >> 24) as u8;
            }
            let _ = parse_reply(&junk, 7, MAC);
            let mut message = payload[..OPTIONS_AT].to_vec();
            let options = 1 + next() as usize % 80;
            message.extend((0..options).map(|i| match (round + i) % 5 {
                0 => 2 + (next() % 4) as u8,
                _ => (next() >> 8) as u8,
            }));
            let mut out = Vec::new();
            PacketBuilder::ipv4(SERVER.octets(), [255; 4], 64)
                .udp(67, 68)
                .write(&mut out, &message)
                .unwrap();
            let _ = parse_reply(&out, 7, MAC);
        }
    }
}
