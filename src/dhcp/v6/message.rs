//! The client's DHCPv6 messages, built and read with dhcproto's `v6` module: its identity
//! (a DUID-LL made of the interface's MAC, and an IAID made of the attachment), the
//! options it sends, and the checks an answer must pass to be ours.

use dhcproto::v6::{self, DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};
use sha2::{Digest, Sha256};
use std::net::Ipv6Addr;

/// The client's and the servers' UDP ports (RFC 8415 §7.2).
pub const CLIENT_PORT: u16 = v6::CLIENT_PORT;
pub const SERVER_PORT: u16 = v6::SERVER_PORT;
/// All_DHCP_Relay_Agents_and_Servers (RFC 8415 §7.1).
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);

/// Who the client is to the server: the DUID names the client, the IAID its IA_NA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub duid: Vec<u8>,
    pub iaid: u32,
}

impl Identity {
    /// DUID-LL (type 3, hardware type 1) of the interface's MAC: the same for every
    /// exchange of the lease, and kept in its record, so a restarted daemon is the same
    /// client. The IAID is made of the attachment's identifier (`containerID/network/
    /// ifname`), so two attachments never share one.
    pub fn new(mac: [u8; 6], client_id: &[u8]) -> Identity {
        let mut duid = vec![0, 3, 0, 1];
        duid.extend_from_slice(&mac);
        let digest = Sha256::digest(client_id);
        let iaid = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        Identity { duid, iaid }
    }
}

/// What one message of the client says besides its identity.
#[derive(Debug, Clone)]
pub struct Fields {
    pub kind: MessageType,
    /// 24 bits.
    pub xid: u32,
    /// The server's DUID (REQUEST, RENEW, RELEASE).
    pub server_id: Option<Vec<u8>>,
    /// The address asked for or held, in the IA_NA.
    pub address: Option<Ipv6Addr>,
    /// Rapid Commit (SOLICIT): a server that does it answers with the REPLY at once.
    pub rapid_commit: bool,
}

/// The encoded message, `elapsed` hundredths of a second into its exchange.
pub fn client_message(id: &Identity, f: &Fields, elapsed: u16) -> Vec<u8> {
    let mut m = Message::new_with_id(f.kind, xid_bytes(f.xid));
    let opts = m.opts_mut();
    opts.insert(DhcpOption::ClientId(id.duid.clone()));
    if let Some(server) = &f.server_id {
        opts.insert(DhcpOption::ServerId(server.clone()));
    }
    let mut ia_opts = v6::DhcpOptions::new();
    if let Some(addr) = f.address {
        ia_opts.insert(DhcpOption::IAAddr(v6::IAAddr {
            addr,
            preferred_life: 0,
            valid_life: 0,
            opts: v6::DhcpOptions::new(),
        }));
    }
    // T1 and T2 0: the server chooses (RFC 8415 §21.4).
    opts.insert(DhcpOption::IANA(v6::IANA {
        id: id.iaid,
        t1: 0,
        t2: 0,
        opts: ia_opts,
    }));
    opts.insert(DhcpOption::ElapsedTime(elapsed));
    if f.kind != MessageType::Release {
        opts.insert(DhcpOption::ORO(v6::ORO {
            opts: vec![OptionCode::DomainNameServers, OptionCode::DomainSearchList],
        }));
    }
    if f.rapid_commit {
        opts.insert(DhcpOption::RapidCommit);
    }
    // A message of a few options: encoding into a Vec cannot fail.
    m.to_vec().unwrap_or_default()
}

/// A server's message for this client: decodes, is of the exchange `xid`, names this
/// client's DUID and some server's. Anything else is not for us (None).
pub fn parse_reply(bytes: &[u8], xid: u32, id: &Identity) -> Option<Message> {
    let m = Message::decode(&mut Decoder::new(bytes)).ok()?;
    let ours = m.xid() == xid_bytes(xid)
        && matches!(m.opts().get(OptionCode::ClientId), Some(DhcpOption::ClientId(d)) if *d == id.duid)
        && server_id(&m).is_some();
    ours.then_some(m)
}

/// The message's server identifier (option 2).
pub fn server_id(m: &Message) -> Option<Vec<u8>> {
    match m.opts().get(OptionCode::ServerId) {
        Some(DhcpOption::ServerId(d)) if !d.is_empty() => Some(d.clone()),
        _ => None,
    }
}

/// The message's IA_NA for `iaid`.
pub fn ia_na(m: &Message, iaid: u32) -> Option<&v6::IANA> {
    m.opts()
        .get_all(OptionCode::IANA)?
        .iter()
        .find_map(|o| match o {
            DhcpOption::IANA(ia) if ia.id == iaid => Some(ia),
            _ => None,
        })
}

/// The first address of the IA_NA with a lifetime left (a lifetime of 0 withdraws it).
pub fn granted_address(ia: &v6::IANA) -> Option<&v6::IAAddr> {
    ia.opts
        .get_all(OptionCode::IAAddr)?
        .iter()
        .find_map(|o| match o {
            DhcpOption::IAAddr(a) if a.valid_life > 0 && !a.addr.is_unspecified() => Some(a),
            _ => None,
        })
}

/// A status that is not Success, at the top of the message or in the IA_NA: its code
/// and text ("NoAddrsAvail: no addresses").
pub fn failure(m: &Message, iaid: u32) -> Option<String> {
    let top = m.opts().get(OptionCode::StatusCode);
    let in_ia = ia_na(m, iaid).and_then(|ia| ia.opts.get(OptionCode::StatusCode));
    [top, in_ia].into_iter().flatten().find_map(|o| match o {
        DhcpOption::StatusCode(s) if s.status != v6::Status::Success => {
            Some(format!("{:?}: {}", s.status, s.msg))
        }
        _ => None,
    })
}

/// Whether the message carries Rapid Commit (a REPLY to a SOLICIT must).
pub fn rapid_commit(m: &Message) -> bool {
    m.opts().get(OptionCode::RapidCommit).is_some()
}

/// The server's preference (0 when absent; 255: take it at once).
pub fn preference(m: &Message) -> u8 {
    match m.opts().get(OptionCode::Preference) {
        Some(DhcpOption::Preference(p)) => *p,
        _ => 0,
    }
}

fn xid_bytes(xid: u32) -> [u8; 3] {
    let b = xid.to_be_bytes();
    [b[1], b[2], b[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity::new([2, 0, 0, 0, 0, 9], b"\0c1/net/eth0")
    }

    #[test]
    fn duid_ll_of_the_mac_and_a_stable_iaid() {
        let id = identity();
        assert_eq!(id.duid, [0, 3, 0, 1, 2, 0, 0, 0, 0, 9]);
        assert_eq!(id.iaid, identity().iaid);
        assert_ne!(id.iaid, Identity::new([2; 6], b"\0c2/net/eth0").iaid);
    }

    #[test]
    fn a_solicit_round_trips_and_answers_are_matched() {
        let id = identity();
        let f = Fields {
            kind: MessageType::Solicit,
            xid: 0x0012_3456,
            server_id: None,
            address: Some("fd00::5".parse().unwrap()),
            rapid_commit: true,
        };
        let bytes = client_message(&id, &f, 7);
        let m = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(m.msg_type(), MessageType::Solicit);
        assert!(rapid_commit(&m));
        let ia = ia_na(&m, id.iaid).unwrap();
        assert_eq!(ia.t1, 0);
        // No server id: not an answer.
        assert!(parse_reply(&bytes, f.xid, &id).is_none());
        let mut reply = m.clone();
        reply.set_msg_type(MessageType::Reply);
        reply
            .opts_mut()
            .insert(DhcpOption::ServerId(vec![0, 3, 0, 1, 1, 1, 1, 1, 1, 1]));
        let bytes = reply.to_vec().unwrap();
        assert!(parse_reply(&bytes, f.xid, &id).is_some());
        assert!(parse_reply(&bytes, f.xid + 1, &id).is_none());
        assert!(parse_reply(&bytes, f.xid, &Identity::new([3; 6], b"x")).is_none());
        assert!(parse_reply(&bytes[..3], f.xid, &id).is_none());
    }

    #[test]
    fn withdrawn_addresses_and_failures() {
        let mut ia = v6::IANA {
            id: 1,
            t1: 10,
            t2: 20,
            opts: v6::DhcpOptions::new(),
        };
        ia.opts.insert(DhcpOption::IAAddr(v6::IAAddr {
            addr: "fd00::7".parse().unwrap(),
            preferred_life: 0,
            valid_life: 0,
            opts: v6::DhcpOptions::new(),
        }));
        assert!(granted_address(&ia).is_none());
        ia.opts.insert(DhcpOption::StatusCode(v6::StatusCode {
            status: v6::Status::NoAddrsAvail,
            msg: "none left".into(),
        }));
        let mut m = Message::new(MessageType::Reply);
        m.opts_mut().insert(DhcpOption::IANA(ia));
        assert_eq!(failure(&m, 1).as_deref(), Some("NoAddrsAvail: none left"));
        assert_eq!(failure(&m, 2), None);
    }
}
