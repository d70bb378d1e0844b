//! Policy routing rules (RTM_NEWRULE / RTM_DELRULE / RTM_GETRULE), IPv4 and IPv6:
//! the `from <address> lookup <table>` rules of source-based routing.
use super::{Netlink, Result};
use ipnet::IpNet;
use netlink_packet_core::{NlasIterator, Parseable, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleHeader, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::fmt;
use std::net::IpAddr;

/// sizeof(struct fib_rule_hdr)
const RULE_HEADER_LEN: usize = 12;
const RTM_NEWRULE: u16 = 32;
/// RT_TABLE_UNSPEC: the header's table when the id needs FRA_TABLE's 32 bits.
const TABLE_UNSPEC: u8 = 0;

/// An IPv4 or IPv6 rule as the kernel lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The source selector (`from`); None for "from all".
    pub src: Option<IpNet>,
    /// The table a `lookup` rule sends to (FRA_TABLE, else the header's); 0 for other actions.
    pub table: u32,
    /// FRA_PRIORITY: the kernel gives each rule one.
    pub priority: Option<u32>,
    /// The whole message: a delete sends it back, naming exactly this rule.
    msg: RuleMessage,
}

impl Rule {
    /// One RTM_NEWRULE of a dump; None for the other families (IPMR's, …).
    fn decode(payload: &[u8]) -> Option<Rule> {
        let header = RuleHeader::parse(payload).ok()?;
        if !matches!(header.family, AddressFamily::Inet | AddressFamily::Inet6) {
            return None;
        }
        let attributes: Vec<RuleAttribute> = NlasIterator::new(payload.get(RULE_HEADER_LEN..)?)
            .filter_map(|nla| nla.ok())
            .filter_map(|nla| RuleAttribute::parse(&nla).ok())
            .collect();
        let mut rule = Rule {
            src: None,
            table: u32::from(header.table),
            priority: None,
            msg: RuleMessage::default(),
        };
        for attr in &attributes {
            match attr {
                RuleAttribute::Source(ip) => rule.src = IpNet::new(*ip, header.src_len).ok(),
                RuleAttribute::Table(t) => rule.table = *t,
                RuleAttribute::Priority(p) => rule.priority = Some(*p),
                _ => {}
            }
        }
        rule.msg.header = header;
        rule.msg.attributes = attributes;
        Some(rule)
    }
}

impl fmt::Display for Rule {
    /// `ip rule` style, for messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.priority {
            write!(f, "{p}: ")?;
        }
        match self.src {
            Some(src) => write!(f, "from {src}")?,
            None => write!(f, "from all")?,
        }
        write!(f, " lookup {}", self.table)
    }
}

/// The message of the rule `from <src> lookup <table>`, without a priority.
fn source_rule(src: IpAddr, table: u32) -> RuleMessage {
    let mut msg = RuleMessage::default();
    msg.header.family = match src {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    msg.header.src_len = if src.is_ipv4() { 32 } else { 128 };
    msg.header.table = u8::try_from(table).unwrap_or(TABLE_UNSPEC);
    msg.header.action = RuleAction::ToTable;
    msg.attributes = vec![RuleAttribute::Source(src), RuleAttribute::Table(table)];
    msg
}

impl Netlink {
    /// Every IPv4 and IPv6 rule of this socket's netns.
    pub fn rules(&mut self) -> Result<Vec<Rule>> {
        let msg = RouteNetlinkMessage::GetRule(RuleMessage::default());
        let replies = self
            .request(msg, NLM_F_DUMP)
            .map_err(|f| f.context("list rules"))?;
        Ok(replies
            .iter()
            .filter(|r| r.kind == RTM_NEWRULE)
            .filter_map(|r| Rule::decode(&r.payload))
            .collect())
    }

    /// Adds `from <src>/32 (or /128) lookup <table>`. No priority is given, so the
    /// kernel places it just ahead of the rules already there (as `ip rule add` does).
    pub fn add_source_rule(&mut self, src: IpAddr, table: u32) -> Result<()> {
        let msg = source_rule(src, table);
        self.request(RouteNetlinkMessage::NewRule(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map(drop)
            .map_err(|f| f.context(&format!("add rule from {src} lookup {table}")))
    }

    /// Deletes the first rule `from <src>/32 (or /128) lookup <table>`, whatever its
    /// priority. Missing is `ErrorKind::NotFound`.
    pub fn del_source_rule(&mut self, src: IpAddr, table: u32) -> Result<()> {
        let msg = source_rule(src, table);
        self.request(RouteNetlinkMessage::DelRule(msg), 0)
            .map(drop)
            .map_err(|f| f.context(&format!("delete rule from {src} lookup {table}")))
    }

    /// Deletes `rule` exactly as listed. Missing is `ErrorKind::NotFound`.
    pub fn del_rule(&mut self, rule: &Rule) -> Result<()> {
        self.request(RouteNetlinkMessage::DelRule(rule.msg.clone()), 0)
            .map(drop)
            .map_err(|f| f.context(&format!("delete rule {rule}")))
    }
}
