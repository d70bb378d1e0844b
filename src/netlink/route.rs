//! Routes of the main table (RTM_NEWROUTE / RTM_DELROUTE / RTM_GETROUTE).
use super::{Failure, Link, Netlink, Result};
use ipnet::IpNet;
use netlink_packet_core::{
    NlasIterator, ParseableParametrized, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteLwEnCapType, RouteMessage, RouteMetric,
    RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A route in the main table.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    /// Output interface index.
    pub oif: Option<u32>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    /// None = main table.
    pub table: Option<u32>,
    /// RT_SCOPE_* (0 universe, 253 link, 254 host); None = kernel default for the route.
    pub scope: Option<u8>,
    /// RTA_PREFSRC: the source address the kernel picks for what the route carries.
    pub prefsrc: Option<IpAddr>,
}

/// sizeof(struct rtmsg)
pub(super) const ROUTE_HEADER_LEN: usize = 12;
const RTM_NEWROUTE: u16 = 24;
/// The kernel's main table, where routes without a table land.
pub const MAIN_TABLE: u32 = 254;

impl Route {
    /// A plain route to `dst`, everything else unset.
    pub fn new(dst: IpNet) -> Route {
        Route {
            dst,
            gateway: None,
            oif: None,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
            prefsrc: None,
        }
    }

    /// True for 0.0.0.0/0 and ::/0.
    pub fn is_default(&self) -> bool {
        self.dst.prefix_len() == 0
    }

    fn family(&self) -> AddressFamily {
        match self.dst {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        }
    }

    /// The header and attributes shared by add and delete.
    pub(super) fn message(&self) -> RouteMessage {
        let table = self.table.unwrap_or(MAIN_TABLE);
        let mut msg = RouteMessage::default();
        msg.header.address_family = self.family();
        msg.header.destination_prefix_length = self.dst.prefix_len();
        // rtm_table is 8 bits; bigger ids travel only in RTA_TABLE.
        msg.header.table = u8::try_from(table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
        msg.attributes.push(RouteAttribute::Table(table));
        if self.dst.prefix_len() > 0 {
            // trunc(): the kernel rejects host bits ("10.0.0.5/24") with EINVAL.
            let dst = self.dst.trunc().addr();
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(dst)));
        }
        if let Some(gw) = self.gateway {
            msg.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        if let Some(oif) = self.oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(src) = self.prefsrc {
            msg.attributes
                .push(RouteAttribute::PrefSource(RouteAddress::from(src)));
        }
        if let Some(priority) = self.priority {
            msg.attributes.push(RouteAttribute::Priority(priority));
        }
        msg
    }

    fn metrics(&self) -> Vec<RouteMetric> {
        let mtu = self.mtu.map(RouteMetric::Mtu);
        let advmss = self.advmss.map(RouteMetric::Advmss);
        mtu.into_iter().chain(advmss).collect()
    }

    /// Route from one RTM_NEWROUTE; None for other tables and non-unicast
    /// entries (local, broadcast, unreachable ...).
    pub(super) fn decode(payload: &[u8]) -> Option<Route> {
        let header = RouteHeader::parse(payload).ok()?;
        if header.kind != RouteType::Unicast {
            return None;
        }
        let param = (header.address_family, header.kind, RouteLwEnCapType::None);
        let attrs: Vec<RouteAttribute> = NlasIterator::new(payload.get(ROUTE_HEADER_LEN..)?)
            .filter_map(|nla| nla.ok())
            .filter_map(|nla| RouteAttribute::parse_with_param(&nla, param).ok())
            .collect();
        let mut route = Route::new(unspecified(
            header.address_family,
            header.destination_prefix_length,
        )?);
        route.scope = Some(u8::from(header.scope));
        let mut table = u32::from(header.table);
        for attr in &attrs {
            route.apply(attr, &mut table);
        }
        // The public struct says None for the main table; callers filter on it.
        route.table = (table != MAIN_TABLE).then_some(table);
        Some(route)
    }

    fn apply(&mut self, attr: &RouteAttribute, table: &mut u32) {
        match attr {
            RouteAttribute::Destination(addr) => {
                if let Some(ip) = to_ip(addr) {
                    self.dst = IpNet::new(ip, self.dst.prefix_len()).unwrap_or(self.dst);
                }
            }
            RouteAttribute::Gateway(addr) => self.gateway = to_ip(addr),
            RouteAttribute::Oif(oif) => self.oif = Some(*oif),
            RouteAttribute::PrefSource(addr) => self.prefsrc = to_ip(addr),
            RouteAttribute::Priority(p) => self.priority = Some(*p),
            RouteAttribute::Table(t) => *table = *t,
            RouteAttribute::Metrics(metrics) => {
                for metric in metrics {
                    match metric {
                        RouteMetric::Mtu(v) => self.mtu = Some(*v),
                        RouteMetric::Advmss(v) => self.advmss = Some(*v),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

impl fmt::Display for Route {
    /// `ip route` style, used in error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " dev index {oif}")?;
        }
        if let Some(src) = self.prefsrc {
            write!(f, " src {src}")?;
        }
        if let Some(p) = self.priority {
            write!(f, " metric {p}")?;
        }
        if let Some(t) = self.table {
            write!(f, " table {t}")?;
        }
        Ok(())
    }
}

/// The all-zero network of `family` with `prefix` bits (RTA_DST is absent for
/// default routes); None for families other than IPv4 and IPv6.
pub(super) fn unspecified(family: AddressFamily, prefix: u8) -> Option<IpNet> {
    let ip = match family {
        AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    IpNet::new(ip, prefix).ok()
}

/// Whether a route lookup failed because of the routes, not of the request.
fn is_no_route(f: &Failure) -> bool {
    match f.errno() {
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EACCES) => true,
        Some(libc::EINVAL) => f.extack().is_none(),
        _ => false,
    }
}

fn to_ip(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

impl Netlink {
    /// Unicast routes of the main table, IPv4 and IPv6.
    pub fn routes(&mut self) -> Result<Vec<Route>> {
        let main = |payload: &[u8]| Route::decode(payload).filter(|r| r.table.is_none());
        self.dump_routes("list routes", main)
    }

    /// The route the kernel would send a packet to `dst` by (`ip route get`):
    /// one lookup through the policy rules and tables, whatever the number
    /// of routes. None when there is no such route, or when what matches is
    /// not a unicast route (unreachable, blackhole, prohibit, local ...).
    pub fn route_to(&mut self, dst: IpAddr) -> Result<Option<Route>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = match dst {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
        match self.request(RouteNetlinkMessage::GetRoute(msg), 0) {
            Ok(replies) => Ok(replies
                .iter()
                .filter(|r| r.kind == RTM_NEWROUTE)
                .find_map(|r| Route::decode(&r.payload))),
            // The lookup's own verdicts: no route (ENETUNREACH), or an
            // unreachable (EHOSTUNREACH), prohibit (EACCES) or blackhole
            // (EINVAL) route matched. A request the kernel refuses is EINVAL
            // too, but with its reason attached.
            Err(f) if is_no_route(&f) => Ok(None),
            Err(f) => Err(f.context(&format!("look up the route to {dst}"))),
        }
    }

    /// One dump of the routes of every table, each RTM_NEWROUTE `decode`d (None
    /// drops it); `what` names the dump in errors.
    pub(super) fn dump_routes<T>(
        &mut self,
        what: &str,
        decode: impl Fn(&[u8]) -> Option<T>,
    ) -> Result<Vec<T>> {
        let msg = RouteNetlinkMessage::GetRoute(RouteMessage::default());
        let replies = self.request(msg, NLM_F_DUMP).map_err(|f| f.context(what))?;
        Ok(replies
            .iter()
            .filter(|r| r.kind == RTM_NEWROUTE)
            .filter_map(|r| decode(&r.payload))
            .collect())
    }

    /// Adds the route (protocol boot; scope link without a gateway, universe
    /// with one, unless `route.scope` says otherwise). An identical existing
    /// route is Ok.
    pub fn add_route(&mut self, route: &Route) -> Result<()> {
        let mut msg = route.message();
        msg.header.protocol = RouteProtocol::Boot;
        msg.header.kind = RouteType::Unicast;
        msg.header.scope = match (route.scope, route.gateway) {
            (Some(scope), _) => RouteScope::from(scope),
            (None, None) => RouteScope::Link,
            (None, Some(_)) => RouteScope::Universe,
        };
        let metrics = route.metrics();
        if !metrics.is_empty() {
            msg.attributes.push(RouteAttribute::Metrics(metrics));
        }
        // Appended, as the reference plugins do: a second attachment's
        // default route via another gateway is installed beside the first
        // one instead of being skipped. Only an identical route is EEXIST.
        match self.request(
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_APPEND,
        ) {
            Ok(_) => Ok(()),
            Err(f) if f.errno() == Some(libc::EEXIST) => Ok(()),
            Err(f) => Err(f.context(&format!("add route {route}"))),
        }
    }

    /// Deletes the route matching dst/gateway/oif/priority/table (scope
    /// "nowhere" matches any scope unless given). Missing is `ErrorKind::NotFound`.
    pub fn del_route(&mut self, route: &Route) -> Result<()> {
        let mut msg = route.message();
        msg.header.scope = route.scope.map_or(RouteScope::NoWhere, RouteScope::from);
        self.request(RouteNetlinkMessage::DelRoute(msg), 0)
            .map(drop)
            .map_err(|f| f.context(&format!("delete route {route}")))
    }

    /// The link of the first IPv4 default route, else of the first IPv6 one.
    pub fn default_route_link(&mut self) -> Result<Option<Link>> {
        let routes = self.routes()?;
        let oif = [true, false].iter().find_map(|&v4| {
            routes
                .iter()
                .filter(|r| r.is_default() && r.dst.addr().is_ipv4() == v4)
                .find_map(|r| r.oif)
        });
        match oif {
            Some(index) => self.link_by_index(index),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{host_and_pod, veth};
    use super::*;

    /// What portmap decided from a dump of the main table: the link of the
    /// longest unicast route with one that covers `ip`.
    fn dump_choice(nl: &mut Netlink, ip: IpAddr) -> Option<u32> {
        let routes = nl.routes().expect("routes");
        let covering = routes
            .into_iter()
            .filter(|r| r.dst.contains(&ip) && r.oif.is_some());
        covering
            .max_by_key(|r| r.dst.prefix_len())
            .and_then(|r| r.oif)
    }

    /// The lookup names the link the dump named: a connected subnet's, a more
    /// specific route's, the default route's, and none without a route. For a
    /// local address (127.0.0.1, the host's own) it names none, being no
    /// unicast route; the dump named the link of a covering route, which such
    /// a packet never leaves by.
    #[test]
    fn route_lookup_decides_as_the_dump() {
        let Some((host, cont)) = host_and_pod("route_lookup_decides_as_the_dump", "rl") else {
            return;
        };
        let (mut nl, mut pod) = (host.netlink(), cont.netlink());
        // Up, lo's 127.0.0.1 is local (a fresh netns has it down).
        let lo = nl.link_by_name("lo").expect("read").expect("lo");
        nl.set_up(lo.index).expect("lo up");
        let a = nl.create_veth(veth("rla", "rla0", &cont.ns)).expect("veth");
        let b = nl.create_veth(veth("rlb", "rlb0", &cont.ns)).expect("veth");
        for pair in [&a, &b] {
            nl.set_up(pair.host_index).expect("up");
            pod.set_up(pair.peer_index).expect("up");
        }
        let net = |s: &str| s.parse::<IpNet>().expect("net");
        nl.add_address(a.host_index, net("10.51.0.1/24"))
            .expect("address");
        nl.add_address(b.host_index, net("10.52.0.1/24"))
            .expect("address");
        let mut narrower = Route::new(net("10.51.0.128/25"));
        narrower.oif = Some(b.host_index);
        nl.add_route(&narrower).expect("route");

        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let link_of = |nl: &mut Netlink, s: &str| nl.route_to(ip(s)).expect("lookup")?.oif;
        let cases = [
            ("10.51.0.7", Some(a.host_index)),
            ("10.51.0.200", Some(b.host_index)),
            ("198.51.100.1", None),
            ("127.0.0.1", None),
        ];
        for (addr, want) in cases {
            assert_eq!(link_of(&mut nl, addr), want, "{addr}");
            assert_eq!(dump_choice(&mut nl, ip(addr)), want, "dump for {addr}");
        }

        let mut default = Route::new(net("0.0.0.0/0"));
        default.gateway = Some(ip("10.52.0.254"));
        nl.add_route(&default).expect("default route");
        assert_eq!(link_of(&mut nl, "198.51.100.1"), Some(b.host_index));
        assert_eq!(dump_choice(&mut nl, ip("198.51.100.1")), Some(b.host_index));
        for local in ["127.0.0.1", "10.51.0.1"] {
            assert_eq!(link_of(&mut nl, local), None, "{local}");
        }
    }
}
