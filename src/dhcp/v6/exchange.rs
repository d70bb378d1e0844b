//! The DHCPv6 client's exchanges (RFC 8415 §18): SOLICIT with Rapid Commit, answered by
//! a REPLY (Rapid Commit) or by ADVERTISEs, then REQUEST / REPLY; RENEW to the server that
//! granted the lease, REBIND to any; RELEASE. Each is retransmitted on RFC 8415 §15's
//! schedule (IRT doubled up to MRT, ±10 %), never waiting longer than the daemon's
//! `-timeout` for one answer nor past its deadline (`-resendtimeout`, or the next
//! milestone of the lease), as the DHCPv4 client.

use super::super::{Error, ErrorKind, Result, Timing};
use super::lease::Lease6;
use super::message::{self, Fields, Identity};
use super::socket::Socket6;
use crate::netlink::random_bytes;
use dhcproto::v6::{Message, MessageType};
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// RFC 8415 §7.6: SOL_TIMEOUT, REQ_TIMEOUT / REQ_MAX_RT / REQ_MAX_RC, REN_TIMEOUT,
/// REB_TIMEOUT; SOLICIT's and RENEW's maximum pauses are the daemon's `-resendmax`.
const SOL_TIMEOUT: Duration = Duration::from_secs(1);
const REQ_TIMEOUT: Duration = Duration::from_secs(1);
const REQ_MAX_RT: Duration = Duration::from_secs(30);
const REQ_MAX_RC: u32 = 10;
const REN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a wait looks at `cancel`.
const CANCEL_POLL: Duration = Duration::from_millis(200);
const RECV_BUF: usize = 4096;

/// One lease's DHCPv6 client.
pub struct Client6<'a> {
    pub socket: &'a Socket6,
    pub id: &'a Identity,
    pub timing: Timing,
    /// Set by another thread to end an exchange early (the lease is being released).
    pub cancel: Option<&'a AtomicBool>,
}

/// What one transmission schedule is.
struct Schedule {
    irt: Duration,
    mrt: Duration,
    mrc: Option<u32>,
}

impl Client6<'_> {
    /// SOLICIT (Rapid Commit, asking for `hint` when given) until a server answers with a
    /// REPLY to it, or with an ADVERTISE that is then REQUESTed; a REQUEST that goes
    /// unanswered or refused starts over with a SOLICIT.
    pub fn acquire(&self, hint: Option<Ipv6Addr>) -> Result<Lease6> {
        let mut ex = self.exchange("the DHCPv6 lease request ".into());
        let mut refused = None;
        while ex.is_open() {
            let solicit = self.fields(MessageType::Solicit, None, hint);
            let sol = Schedule {
                irt: SOL_TIMEOUT,
                mrt: self.timing.resend_max,
                mrc: None,
            };
            let iaid = self.id.iaid;
            let answer = ex.transact(&solicit, &sol, |m| match m.msg_type() {
                MessageType::Reply if message::rapid_commit(m) => Some(m.clone()),
                MessageType::Advertise
                    if message::failure(m, iaid).is_none()
                        && message::ia_na(m, iaid)
                            .and_then(message::granted_address)
                            .is_some() =>
                {
                    Some(m.clone())
                }
                _ => None,
            })?;
            let Some(answer) = answer else { break };
            if answer.msg_type() == MessageType::Reply {
                match self.granted(answer) {
                    Ok(lease) => return Ok(lease),
                    Err(e) => {
                        refused = Some(e);
                        continue;
                    }
                }
            }
            let server = message::server_id(&answer);
            let offered = message::ia_na(&answer, iaid)
                .and_then(message::granted_address)
                .map(|a| a.addr);
            let request = self.fields(MessageType::Request, server, offered);
            let req = Schedule {
                irt: REQ_TIMEOUT,
                mrt: REQ_MAX_RT,
                mrc: Some(REQ_MAX_RC),
            };
            if let Some(reply) = ex.transact(&request, &req, is_reply)? {
                match self.granted(reply) {
                    Ok(lease) => return Ok(lease),
                    Err(e) => refused = Some(e),
                }
            }
        }
        Err(match refused {
            Some(e) => ex.fail(ErrorKind::Refused, &e.message),
            None => ex.no_answer(),
        })
    }

    /// RENEW the held address with the server that granted it.
    pub fn renew(&self, held: &Lease6) -> Result<Lease6> {
        let address = held.address(self.id.iaid);
        let f = self.fields(MessageType::Renew, held.server_id(), address);
        self.confirm("the DHCPv6 renewal ", f)
    }

    /// REBIND the held address with any server.
    pub fn rebind(&self, held: &Lease6) -> Result<Lease6> {
        let address = held.address(self.id.iaid);
        let f = self.fields(MessageType::Rebind, None, address);
        self.confirm("the DHCPv6 rebinding ", f)
    }

    /// RELEASE, sent once (the pod is going; RFC 8415's retransmissions would hold DEL up
    /// for seconds when the server is gone, and the lease ends at its lifetime anyway).
    pub fn release(&self, held: &Lease6) -> Result<()> {
        let address = held.address(self.id.iaid);
        let f = self.fields(MessageType::Release, held.server_id(), address);
        self.socket.send(&message::client_message(self.id, &f, 0))
    }

    fn fields(
        &self,
        kind: MessageType,
        server_id: Option<Vec<u8>>,
        address: Option<Ipv6Addr>,
    ) -> Fields {
        Fields {
            kind,
            xid: u32::from_le_bytes(random_bytes::<4>()) & 0x00ff_ffff,
            server_id,
            address,
            rapid_commit: kind == MessageType::Solicit,
        }
    }

    /// A REPLY granting an address, or why not.
    fn granted(&self, reply: Message) -> Result<Lease6> {
        let lease = Lease6 { reply };
        super::lease::terms(&lease, self.id.iaid).map(|_| lease)
    }

    /// RENEW or REBIND, answered by a REPLY.
    fn confirm(&self, what: &str, f: Fields) -> Result<Lease6> {
        let mut ex = self.exchange(what.into());
        let schedule = Schedule {
            irt: REN_TIMEOUT,
            mrt: self.timing.resend_max,
            mrc: None,
        };
        match ex.transact(&f, &schedule, is_reply)? {
            Some(reply) => self
                .granted(reply)
                .map_err(|e| ex.fail(ErrorKind::Refused, &e.message)),
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

fn is_reply(m: &Message) -> Option<Message> {
    (m.msg_type() == MessageType::Reply).then(|| m.clone())
}

/// The `sent` count: Transmissions so far.
type Exchange<'c> = super::super::Exchange<'c, Client6<'c>, u32>;

impl Exchange<'_> {
    /// Sends `f` and retransmits it on `schedule` until `accept` takes an answer, the
    /// deadline passes or the transmissions run out (None).
    fn transact(
        &mut self,
        f: &Fields,
        schedule: &Schedule,
        accept: impl Fn(&Message) -> Option<Message>,
    ) -> Result<Option<Message>> {
        let c = self.client;
        let mut buf = vec![0u8; RECV_BUF];
        let mut rt = Duration::ZERO;
        let mut sends = 0;
        // RFC 8415 §21.9: the elapsed time counts from the exchange's first message.
        let first = Instant::now();
        while self.is_open() && schedule.mrc.is_none_or(|m| sends < m) {
            if c.cancelled() {
                return Err(self.fail(ErrorKind::NoAnswer, "cancelled: "));
            }
            let elapsed = u16::try_from(first.elapsed().as_millis() / 10).unwrap_or(u16::MAX);
            c.socket.send(&message::client_message(c.id, f, elapsed))?;
            sends += 1;
            self.sent += 1;
            rt = next_rt(rt, schedule, sends == 1 && f.kind == MessageType::Solicit)
                .min(c.timing.reply);
            let until = (Instant::now() + rt).min(self.deadline);
            while let Some(wait) = until.checked_duration_since(Instant::now()) {
                if c.cancelled() {
                    return Err(self.fail(ErrorKind::NoAnswer, "cancelled: "));
                }
                let Some(n) = c.socket.recv(&mut buf, wait.min(CANCEL_POLL))? else {
                    continue;
                };
                let answer = buf
                    .get(..n)
                    .and_then(|b| message::parse_reply(b, f.xid, c.id))
                    .and_then(|m| accept(&m));
                if answer.is_some() {
                    return Ok(answer);
                }
            }
        }
        Ok(None)
    }

    /// "<head><what>on eth0 in /run/netns/x (3 messages sent in 8s)"
    fn fail(&self, kind: ErrorKind, head: &str) -> Error {
        let link = self.client.socket.link();
        Error::new(
            kind,
            format!(
                "{head}{}on {} ({} message(s) sent in {:.1}s)",
                self.what,
                link.describe(),
                self.sent,
                self.start.elapsed().as_secs_f64()
            ),
        )
    }

    fn no_answer(&self) -> Error {
        self.fail(ErrorKind::NoAnswer, "no DHCPv6 server answered ")
    }
}

/// RFC 8415 §15: RT = IRT ± 10 % (the first SOLICIT's only above IRT), then twice the
/// previous ± 10 %, at most MRT ± 10 %.
fn next_rt(prev: Duration, s: &Schedule, first_solicit: bool) -> Duration {
    let rand = random_tenth(first_solicit);
    let rt = if prev.is_zero() {
        s.irt.mul_f64(1.0 + rand)
    } else {
        (prev * 2).mul_f64(1.0 + rand)
    };
    if rt > s.mrt {
        s.mrt.mul_f64(1.0 + random_tenth(false))
    } else {
        rt
    }
}

/// A uniform value in [-0.1, 0.1] ((0, 0.1] when `positive`).
fn random_tenth(positive: bool) -> f64 {
    let r = f64::from(u32::from_le_bytes(random_bytes::<4>())) / f64::from(u32::MAX);
    if positive {
        r * 0.1
    } else {
        r * 0.2 - 0.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_doubles_up_to_mrt() {
        let s = Schedule {
            irt: Duration::from_secs(1),
            mrt: Duration::from_secs(8),
            mrc: None,
        };
        let mut rt = Duration::ZERO;
        let mut seen = Vec::new();
        for i in 0..8 {
            rt = next_rt(rt, &s, i == 0);
            seen.push(rt.as_secs_f64());
        }
        assert!((1.0..=1.1).contains(&seen[0]), "{seen:?}");
        assert!((1.6..=2.5).contains(&seen[1]), "{seen:?}");
        assert!(seen.iter().all(|s| *s <= 8.8), "{seen:?}");
        assert!(seen[7] >= 7.2, "{seen:?}");
    }
}
