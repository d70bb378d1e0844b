//! What a DHCPv6 REPLY gives a pod: one address of its IA_NA, the name servers and search
//! list, the lease's timers; and the record that keeps the lease across restarts.
//!
//! The address is a /128: IA_NA carries no prefix length (RFC 8415 §21.6), and the
//! on-link prefix is the router advertisements' to give (the kernel makes its route from
//! their prefix information). A /64 made up here would claim an on-link subnet the
//! server never named.

use super::super::lease::Timers;
use super::super::lease_files::{corrupt, unix_millis, Stored};
use super::super::{Error, ErrorKind, Result};
use super::message::{self, Identity};
use crate::hex::{hex, unhex};
use dhcproto::v6::{DhcpOption, Message, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};
use ipamd::attachment::Attachment;
use ipamd::config::Dns;
use ipnet::Ipv6Net;
use serde::{Deserialize, Serialize};
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A granted lease: the server's REPLY, as received.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease6 {
    pub reply: Message,
}

/// A usable DHCPv6 lease, read from its REPLY.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Terms6 {
    pub address: Ipv6Net,
    pub dns: Dns,
    pub timers: Timers,
}

impl Lease6 {
    /// The server that granted it (its DUID).
    pub fn server_id(&self) -> Option<Vec<u8>> {
        message::server_id(&self.reply)
    }

    /// The granted address, if the REPLY grants one to `iaid`.
    pub fn address(&self, iaid: u32) -> Option<Ipv6Addr> {
        message::ia_na(&self.reply, iaid)
            .and_then(message::granted_address)
            .map(|a| a.addr)
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.reply
            .to_vec()
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot encode the REPLY: {e}")))
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Lease6> {
        let reply = Message::decode(&mut Decoder::new(bytes))
            .map_err(|e| Error::new(ErrorKind::Invalid, format!("stored DHCPv6 REPLY: {e}")))?;
        Ok(Lease6 { reply })
    }
}

/// The lease a REPLY grants `iaid`. Refused: no address in it, or a failure status.
pub fn terms(lease: &Lease6, iaid: u32) -> Result<Terms6> {
    let m = &lease.reply;
    if let Some(why) = message::failure(m, iaid) {
        return Err(Error::new(
            ErrorKind::Refused,
            format!("the DHCPv6 REPLY refuses the address: {why}"),
        ));
    }
    let ia = message::ia_na(m, iaid).ok_or_else(|| {
        Error::new(
            ErrorKind::Refused,
            "the DHCPv6 REPLY has no IA_NA for this client",
        )
    })?;
    let granted = message::granted_address(ia).ok_or_else(|| {
        Error::new(
            ErrorKind::Refused,
            "the DHCPv6 REPLY's IA_NA holds no address",
        )
    })?;
    let secs = |s: u32| Duration::from_secs(u64::from(s));
    let expire = secs(granted.valid_life);
    let preferred = secs(granted.preferred_life.min(granted.valid_life));
    // RFC 8415 §21.4: T1 and T2 of 0 leave them to the client: 0.5 and 0.8 of the
    // preferred lifetime. Kept in order T1 ≤ T2 ≤ valid lifetime whatever was sent.
    let rebind = match ia.t2 {
        0 => preferred * 4 / 5,
        t => secs(t),
    }
    .min(expire);
    let renew = match ia.t1 {
        0 => preferred / 2,
        t => secs(t),
    }
    .min(rebind);
    Ok(Terms6 {
        address: Ipv6Net::new(granted.addr, 128).unwrap_or_default(),
        dns: dns(m),
        timers: Timers {
            renew,
            rebind,
            expire,
        },
    })
}

/// Name servers (23) and search list (24).
fn dns(m: &Message) -> Dns {
    let mut dns = Dns::default();
    if let Some(DhcpOption::DomainNameServers(servers)) =
        m.opts().get(OptionCode::DomainNameServers)
    {
        dns.nameservers = servers.iter().map(ToString::to_string).collect();
    }
    if let Some(DhcpOption::DomainSearchList(names)) = m.opts().get(OptionCode::DomainSearchList) {
        dns.search = names
            .iter()
            .map(|n| n.to_utf8().trim_end_matches('.').to_string())
            .collect();
    }
    dns
}

/// One held DHCPv6 lease, as kept on disk (a file of its own beside the attachment's
/// DHCPv4 record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record6 {
    pub format: u32,
    pub attachment: Attachment,
    pub netns: PathBuf,
    /// The client's DUID (hex) and IAID: the same client after a restart.
    pub duid: String,
    pub iaid: u32,
    /// The REPLY as received (hex).
    pub reply: String,
    /// Wall-clock milliseconds since the epoch when the REPLY came.
    pub bound_at_ms: u64,
}

impl Stored for Record6 {
    const EXT: &'static str = "json6";
    const FORMAT: u32 = 1;
    fn attachment(&self) -> &Attachment {
        &self.attachment
    }
    fn format(&self) -> u32 {
        self.format
    }
}

impl Record6 {
    pub fn new(
        attachment: Attachment,
        netns: PathBuf,
        id: &Identity,
        lease: &Lease6,
        bound_at: SystemTime,
    ) -> Result<Record6> {
        Ok(Record6 {
            format: <Record6 as Stored>::FORMAT,
            attachment,
            netns,
            duid: hex(&id.duid),
            iaid: id.iaid,
            reply: hex(&lease.to_bytes()?),
            bound_at_ms: unix_millis(bound_at),
        })
    }

    pub fn identity(&self) -> Result<Identity> {
        let duid = unhex(&self.duid).ok_or_else(|| corrupt("the DUID is not hex"))?;
        Ok(Identity {
            duid,
            iaid: self.iaid,
        })
    }

    pub fn lease(&self) -> Result<Lease6> {
        let bytes = unhex(&self.reply).ok_or_else(|| corrupt("the REPLY is not hex"))?;
        Lease6::from_bytes(&bytes)
    }

    pub fn bound_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.bound_at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v6::{IAAddr, MessageType, IANA};

    fn reply(t1: u32, t2: u32, preferred: u32, valid: u32) -> Lease6 {
        let mut m = Message::new(MessageType::Reply);
        let mut ia = IANA {
            id: 7,
            t1,
            t2,
            opts: Default::default(),
        };
        ia.opts.insert(DhcpOption::IAAddr(IAAddr {
            addr: "fd00:99::60".parse().unwrap(),
            preferred_life: preferred,
            valid_life: valid,
            opts: Default::default(),
        }));
        m.opts_mut().insert(DhcpOption::IANA(ia));
        m.opts_mut()
            .insert(DhcpOption::ServerId(vec![0, 3, 0, 1, 1, 2, 3, 4, 5, 6]));
        m.opts_mut()
            .insert(DhcpOption::DomainNameServers(vec!["fd00:99::53"
                .parse()
                .unwrap()]));
        Lease6 { reply: m }
    }

    #[test]
    fn a_128_with_the_servers_timers_and_dns() {
        let t = terms(&reply(40, 64, 80, 120), 7).unwrap();
        assert_eq!(t.address.to_string(), "fd00:99::60/128");
        assert_eq!(t.dns.nameservers, ["fd00:99::53"]);
        let secs = |s| Duration::from_secs(s);
        assert_eq!(
            (t.timers.renew, t.timers.rebind, t.timers.expire),
            (secs(40), secs(64), secs(120))
        );
        // T1/T2 of 0: half and 4/5 of the preferred lifetime.
        let t = terms(&reply(0, 0, 100, 200), 7).unwrap();
        assert_eq!((t.timers.renew, t.timers.rebind), (secs(50), secs(80)));
        assert!(terms(&reply(40, 64, 80, 120), 8).is_err());
        assert!(terms(&reply(40, 64, 0, 0), 7).is_err());
    }

    #[test]
    fn the_record_round_trips() {
        let lease = reply(40, 64, 80, 120);
        let id = Identity::new([2, 0, 0, 0, 0, 1], b"x");
        let r = Record6::new(
            Attachment::new("net", "c1", "eth0"),
            "/run/netns/p".into(),
            &id,
            &lease,
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(r.lease().unwrap(), lease);
        assert_eq!(r.identity().unwrap(), id);
        assert_eq!(lease.address(7), Some("fd00:99::60".parse().unwrap()));
        assert!(lease.server_id().is_some());
    }
}
