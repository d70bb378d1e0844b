//! What a DHCPACK gives a pod: its address, gateway, routes and DNS, the lease's timers,
//! and the CNI result made of them — mapped as the reference v1.9.1 maps them (`IPNet`,
//! `Gateway`, `Routes` in its lease.go), with DNS added. The plugin makes the CNI result
//! of them.

use super::exchange::Ack;
use super::{Error, ErrorKind, Result};
use dhcproto::v4::{DhcpOption, OptionCode};
use ipamd::config::Dns;
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::time::Duration;

/// The reference's lease time when the server names none.
const DEFAULT_LEASE: Duration = Duration::from_secs(3600);
/// RT_SCOPE_LINK: a classless route without a router is on the link.
const SCOPE_LINK: u8 = 253;

/// A usable lease, read from its ACK.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Terms {
    pub address: Ipv4Net,
    pub gateway: Option<Ipv4Addr>,
    pub routes: Vec<Route>,
    pub dns: Dns,
    pub timers: Timers,
}

/// A route the server gave: `gw` 0.0.0.0 with `scope` link for an on-link one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: Ipv4Net,
    pub gw: Ipv4Addr,
    pub scope: Option<u8>,
}

/// When, counted from the ACK, the lease is renewed (T1), rebound (T2) and lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timers {
    pub renew: Duration,
    pub rebind: Duration,
    pub expire: Duration,
}

/// The lease an ACK grants. Refused: an ACK without an address or a subnet mask (the
/// reference's "DHCP option Subnet Mask not found in DHCPACK").
pub fn terms(ack: &Ack) -> Result<Terms> {
    let msg = &ack.message;
    let yiaddr = msg.yiaddr();
    if yiaddr.is_unspecified() {
        return Err(Error::new(
            ErrorKind::Refused,
            "the DHCPACK grants no address (yiaddr 0.0.0.0)",
        ));
    }
    let Some(DhcpOption::SubnetMask(mask)) = msg.opts().get(OptionCode::SubnetMask) else {
        return Err(Error::new(
            ErrorKind::Refused,
            format!("the DHCPACK for {yiaddr} has no subnet mask (option 1); cannot size the pod's subnet"),
        ));
    };
    let prefix = u32::from(*mask).leading_ones() as u8;
    let address = Ipv4Net::new(yiaddr, prefix)
        .map_err(|e| Error::new(ErrorKind::Refused, format!("subnet mask {mask}: {e}")))?;
    let gateway = match msg.opts().get(OptionCode::Router) {
        Some(DhcpOption::Router(routers)) => routers.first().copied(),
        _ => None,
    };
    Ok(Terms {
        address,
        gateway,
        routes: routes(ack, gateway),
        dns: dns(ack),
        timers: timers(ack),
    })
}

/// RFC 3442: classless static routes (121), when sent, replace the static routes (33) and
/// the router; else the static routes, then a default route via the router.
fn routes(ack: &Ack, gateway: Option<Ipv4Addr>) -> Vec<Route> {
    let opts = ack.message.opts();
    if let Some(DhcpOption::ClasslessStaticRoute(list)) = opts.get(OptionCode::ClasslessStaticRoute)
    {
        if !list.is_empty() {
            return list
                .iter()
                .map(|(dst, router)| Route {
                    dst: *dst,
                    gw: *router,
                    scope: router.is_unspecified().then_some(SCOPE_LINK),
                })
                .collect();
        }
    }
    let mut out = Vec::new();
    if let Some(DhcpOption::StaticRoutingTable(pairs)) = opts.get(OptionCode::StaticRoutingTable) {
        for (dst, router) in pairs {
            out.push(Route {
                dst: classful(*dst),
                gw: *router,
                scope: None,
            });
        }
    }
    if let Some(gw) = gateway {
        out.push(Route {
            dst: Ipv4Net::default(),
            gw,
            scope: None,
        });
    }
    out
}

/// Option 33's destinations are classful networks (Go's `IP.DefaultMask`).
fn classful(dst: Ipv4Addr) -> Ipv4Net {
    let prefix = match dst.octets()[0] {
        0..=127 => 8,
        128..=191 => 16,
        _ => 24,
    };
    Ipv4Net::new(dst, prefix).unwrap_or_default()
}

/// Name servers (6), domain (15) and search list (119). The reference returns none.
fn dns(ack: &Ack) -> Dns {
    let opts = ack.message.opts();
    let mut dns = Dns::default();
    if let Some(DhcpOption::DomainNameServer(servers)) = opts.get(OptionCode::DomainNameServer) {
        dns.nameservers = servers.iter().map(ToString::to_string).collect();
    }
    if let Some(DhcpOption::DomainName(name)) = opts.get(OptionCode::DomainName) {
        dns.domain = name.trim_end_matches('.').to_string();
    }
    if let Some(DhcpOption::DomainSearch(names)) = opts.get(OptionCode::DomainSearch) {
        dns.search = names
            .iter()
            .map(|n| n.to_utf8().trim_end_matches('.').to_string())
            .collect();
    }
    dns
}

/// The server's timers, or the reference's defaults (T1 half the lease, T2 85 %), kept in
/// order T1 ≤ T2 ≤ lease whatever the server sent.
fn timers(ack: &Ack) -> Timers {
    let opts = ack.message.opts();
    let secs = |code| match opts.get(code) {
        Some(
            DhcpOption::AddressLeaseTime(s) | DhcpOption::Renewal(s) | DhcpOption::Rebinding(s),
        ) => Some(Duration::from_secs(u64::from(*s))),
        _ => None,
    };
    let expire = secs(OptionCode::AddressLeaseTime).unwrap_or(DEFAULT_LEASE);
    let rebind = secs(OptionCode::Rebinding)
        .filter(|t| *t <= expire)
        .unwrap_or(expire * 85 / 100);
    let renew = secs(OptionCode::Renewal)
        .filter(|t| *t <= rebind)
        .unwrap_or((expire / 2).min(rebind));
    Timers {
        renew,
        rebind,
        expire,
    }
}

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Bound,
    Renewing,
    Rebinding,
    /// Lost: the interface is down until the server grants the address again.
    Expired,
    /// The thread ended: released, or the pod is gone.
    Ended,
}

impl Timers {
    /// RFC 2131's infinite lease (0xffffffff seconds): never renewed.
    pub fn infinite(&self) -> bool {
        self.expire.as_secs() == u64::from(u32::MAX)
    }

    /// Where a lease acknowledged `elapsed` ago stands by its timers alone.
    pub fn phase_at(&self, elapsed: Duration) -> Phase {
        if self.infinite() || elapsed < self.renew {
            Phase::Bound
        } else if elapsed < self.rebind {
            Phase::Renewing
        } else if elapsed < self.expire {
            Phase::Rebinding
        } else {
            Phase::Expired
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v4::{Message, MessageType};

    fn ack(opts: Vec<DhcpOption>) -> Ack {
        let mut m = Message::default();
        m.set_yiaddr(Ipv4Addr::new(10, 99, 0, 50));
        m.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Ack));
        for o in opts {
            m.opts_mut().insert(o);
        }
        Ack {
            message: m,
            server_mac: [0; 6],
        }
    }

    #[test]
    fn address_gateway_default_route_and_default_timers() {
        let t = terms(&ack(vec![
            DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)),
            DhcpOption::Router(vec![Ipv4Addr::new(10, 99, 0, 1)]),
        ]))
        .unwrap();
        assert_eq!(t.address.to_string(), "10.99.0.50/24");
        assert_eq!(t.gateway, Some(Ipv4Addr::new(10, 99, 0, 1)));
        assert_eq!(t.routes.len(), 1);
        assert_eq!(t.routes[0].dst.to_string(), "0.0.0.0/0");
        assert_eq!(t.timers.expire, Duration::from_secs(3600));
        assert_eq!(t.timers.renew, Duration::from_secs(1800));
        assert_eq!(t.timers.rebind, Duration::from_secs(3060));
    }

    #[test]
    fn no_mask_is_refused_and_no_router_means_no_default_route() {
        let e = terms(&ack(vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Refused);
        let t = terms(&ack(vec![DhcpOption::SubnetMask(Ipv4Addr::new(
            255, 255, 0, 0,
        ))]))
        .unwrap();
        assert_eq!(t.gateway, None);
        assert!(t.routes.is_empty());
    }

    /// A /24 with a router and one static route (option 33) via another router.
    fn router_and_static_route() -> Vec<DhcpOption> {
        vec![
            DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)),
            DhcpOption::Router(vec![Ipv4Addr::new(10, 99, 0, 1)]),
            DhcpOption::StaticRoutingTable(vec![(
                Ipv4Addr::new(172, 16, 0, 0),
                Ipv4Addr::new(10, 99, 0, 2),
            )]),
        ]
    }

    #[test]
    fn classless_routes_replace_static_routes_and_the_router() {
        let mut options = router_and_static_route();
        options.push(DhcpOption::ClasslessStaticRoute(vec![
            (
                "192.168.7.0/24".parse().unwrap(),
                Ipv4Addr::new(10, 99, 0, 3),
            ),
            ("10.98.0.0/16".parse().unwrap(), Ipv4Addr::UNSPECIFIED),
        ]));
        let t = terms(&ack(options)).unwrap();
        let shown: Vec<String> = t
            .routes
            .iter()
            .map(|r| format!("{} {} {:?}", r.dst, r.gw, r.scope))
            .collect();
        assert_eq!(
            shown,
            [
                "192.168.7.0/24 10.99.0.3 None",
                "10.98.0.0/16 0.0.0.0 Some(253)"
            ]
        );
    }

    #[test]
    fn static_routes_are_classful_then_the_default_route() {
        let t = terms(&ack(router_and_static_route())).unwrap();
        let dsts: Vec<String> = t.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["172.16.0.0/16", "0.0.0.0/0"]);
    }

    #[test]
    fn dns_and_server_timers_kept_in_order() {
        let t = terms(&ack(vec![
            DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)),
            DhcpOption::DomainNameServer(vec![Ipv4Addr::new(10, 99, 0, 53)]),
            DhcpOption::DomainName("lan.example.".into()),
            DhcpOption::AddressLeaseTime(40),
            DhcpOption::Renewal(50),
            DhcpOption::Rebinding(30),
        ]))
        .unwrap();
        assert_eq!(t.dns.nameservers, ["10.99.0.53"]);
        assert_eq!(t.dns.domain, "lan.example");
        assert_eq!(t.timers.expire, Duration::from_secs(40));
        assert_eq!(t.timers.rebind, Duration::from_secs(30));
        assert_eq!(t.timers.renew, Duration::from_secs(20));
    }

    #[test]
    fn phases_by_elapsed_time() {
        let t = Timers {
            renew: Duration::from_secs(10),
            rebind: Duration::from_secs(17),
            expire: Duration::from_secs(20),
        };
        let at = |s| t.phase_at(Duration::from_secs(s));
        assert_eq!(
            [at(0), at(10), at(17), at(20), at(99)],
            [
                Phase::Bound,
                Phase::Renewing,
                Phase::Rebinding,
                Phase::Expired,
                Phase::Expired
            ]
        );
        let forever = Timers {
            expire: Duration::from_secs(u64::from(u32::MAX)),
            ..t
        };
        assert_eq!(forever.phase_at(Duration::from_secs(99)), Phase::Bound);
    }
}
