//! Routes of every table, kept whole as the kernel dumps them so they can move between
//! tables (source-based routing): listed, re-added in another table, deleted.
pub use super::route::MAIN_TABLE;
use super::route::{unspecified, Route, ROUTE_HEADER_LEN};
use super::{Netlink, Result};
use ipnet::IpNet;
use netlink_packet_core::{
    DefaultNla, NlasIterator, Parseable, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE,
};
use netlink_packet_route::route::{RouteAttribute, RouteFlags, RouteHeader, RouteMessage};
use netlink_packet_route::RouteNetlinkMessage;
use std::fmt;
use std::net::IpAddr;

const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTA_CACHEINFO: u16 = 12;
const RTA_TABLE: u16 = 15;
const RTA_MFC_STATS: u16 = 17;
const RTA_EXPIRES: u16 = 23;
const RTA_PAD: u16 = 24;

/// A route as a dump lists it. Its attributes are kept verbatim (protocol, scope,
/// metrics, preference, …), so a copy in another table is the same route there.
#[derive(Debug, Clone)]
pub struct TableRoute {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    /// RTA_PREFSRC (`src` in `ip route`).
    pub prefsrc: Option<IpAddr>,
    /// The output link (None for multipath and link-less routes).
    pub oif: Option<u32>,
    pub table: u32,
    header: RouteHeader,
    /// Every attribute but the table and what only a dump carries (cache info, expiry).
    attrs: Vec<DefaultNla>,
}

impl TableRoute {
    /// One RTM_NEWROUTE of a dump; None for IPv4/IPv6 cache clones and other families.
    fn decode(payload: &[u8]) -> Option<TableRoute> {
        let header = RouteHeader::parse(payload).ok()?;
        let dst = unspecified(header.address_family, header.destination_prefix_length)?;
        if header.flags.contains(RouteFlags::Cloned) {
            return None;
        }
        let mut route = TableRoute {
            dst,
            gateway: None,
            prefsrc: None,
            oif: None,
            table: u32::from(header.table),
            header,
            attrs: Vec::new(),
        };
        let nlas = NlasIterator::new(payload.get(ROUTE_HEADER_LEN..)?).filter_map(|n| n.ok());
        for nla in nlas {
            let value = nla.value();
            match nla.kind() {
                RTA_DST => route.dst = IpNet::new(ip(value)?, route.dst.prefix_len()).ok()?,
                RTA_GATEWAY => route.gateway = ip(value),
                RTA_PREFSRC => route.prefsrc = ip(value),
                RTA_OIF => route.oif = u32_of(value),
                RTA_TABLE => route.table = u32_of(value)?,
                _ => {}
            }
            if !matches!(
                nla.kind(),
                RTA_TABLE | RTA_CACHEINFO | RTA_MFC_STATS | RTA_EXPIRES | RTA_PAD
            ) {
                route.attrs.push(DefaultNla::parse(&nla).ok()?);
            }
        }
        Some(route)
    }

    /// The same route in `table`.
    pub fn in_table(&self, table: u32) -> TableRoute {
        TableRoute {
            table,
            ..self.clone()
        }
    }

    /// The message naming this route: its header (without the dump's flags, which a
    /// request may not carry) and attributes, in its table.
    fn message(&self) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header = self.header.clone();
        msg.header.flags = RouteFlags::empty();
        msg.header.table = u8::try_from(self.table).unwrap_or(0);
        msg.attributes = self
            .attrs
            .iter()
            .cloned()
            .map(RouteAttribute::Other)
            .collect();
        msg.attributes.push(RouteAttribute::Table(self.table));
        msg
    }
}

impl fmt::Display for TableRoute {
    /// As a [`Route`] of the same fields shows, its table always named.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut route = Route::new(self.dst);
        route.gateway = self.gateway;
        route.oif = self.oif;
        route.prefsrc = self.prefsrc;
        route.table = Some(self.table);
        route.fmt(f)
    }
}

fn ip(value: &[u8]) -> Option<IpAddr> {
    match value.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(value).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(value).ok()?)),
        _ => None,
    }
}

fn u32_of(value: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(value.try_into().ok()?))
}

impl Netlink {
    /// Every IPv4 and IPv6 route of every table (local and main included), but cache
    /// clones.
    pub fn all_routes(&mut self) -> Result<Vec<TableRoute>> {
        self.dump_routes("list routes of every table", TableRoute::decode)
    }

    /// Adds `route`, replacing a route of the same key in its table.
    pub fn replace_route(&mut self, route: &TableRoute) -> Result<()> {
        let msg = RouteNetlinkMessage::NewRoute(route.message());
        self.request(msg, NLM_F_CREATE | NLM_F_REPLACE)
            .map(drop)
            .map_err(|f| f.context(&format!("add route {route}")))
    }

    /// Adds `route` back where it was; one already there is Ok.
    pub fn restore_route(&mut self, route: &TableRoute) -> Result<()> {
        let msg = RouteNetlinkMessage::NewRoute(route.message());
        match self.request(msg, NLM_F_CREATE | NLM_F_EXCL) {
            Err(f) if f.errno() == Some(libc::EEXIST) => Ok(()),
            other => other
                .map(drop)
                .map_err(|f| f.context(&format!("restore route {route}"))),
        }
    }

    /// Deletes `route` from its table. Missing is `ErrorKind::NotFound`.
    pub fn delete_table_route(&mut self, route: &TableRoute) -> Result<()> {
        let msg = RouteNetlinkMessage::DelRoute(route.message());
        self.request(msg, 0)
            .map(drop)
            .map_err(|f| f.context(&format!("delete route {route}")))
    }
}
