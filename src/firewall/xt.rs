//! Rules that iptables-nft can read, for the tables of the host's iptables
//! (`ip filter`, `ip6 filter`), written over netlink.
//!
//! iptables-nft 1.8.9 lists a table only when it understands every rule in
//! it; one rule it cannot translate back into iptables' terms makes it call
//! the whole table "incompatible" and refuse `iptables -S` (Docker's and the
//! admin's rules included). So these rules are built the way iptables-nft
//! builds them: interface and address compares first, then xtables matches
//! (`comment`, `conntrack` as the kernel's x_tables match, never a native
//! `ct state`), a counter, and the verdict; plus the rule's compat
//! attribute. [`XtRule`] is both what we write and how we read rules back,
//! so "is this rule there" is an equality.

use super::expr::{cmp, meta_load, payload, verdict, Expr, Jump, NETWORK_HEADER};
use netlink_packet_core::{DefaultNla, NlaBuffer, NlasIterator};
use netlink_packet_netfilter::nftables::{Expressions, MetaKey, Operator, Register};
use std::net::IpAddr;

/// NFTA_MATCH_* and the sizes iptables gives its matches' info, padded to
/// XT_ALIGN (8 bytes on 64-bit kernels), as x_tables insists.
const NFTA_MATCH_NAME: u16 = 1;
const NFTA_MATCH_REV: u16 = 2;
const NFTA_MATCH_INFO: u16 = 3;
/// struct xt_comment_info: char comment[256].
const COMMENT_LEN: usize = 256;
/// struct xt_conntrack_mtinfo3 (164 bytes), padded to 168.
const CONNTRACK_LEN: usize = 168;
/// Offsets in xt_conntrack_mtinfo3 of match_flags and state_mask.
const CT_MATCH_FLAGS_AT: usize = 146;
const CT_STATE_MASK_AT: usize = 150;
/// XT_CONNTRACK_STATE; ESTABLISHED (bit 1) | RELATED (bit 2) of the state mask.
const XT_CONNTRACK_STATE: u16 = 1;
const CT_ESTABLISHED_RELATED: u16 = 0b110;

/// What a rule does at its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Accept,
    Drop,
    Return,
    Jump(String),
    /// Anything else (read back only).
    Other,
}

/// An interface compare: name, and whether it is negated (`! -o br0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Iface {
    pub name: String,
    pub negated: bool,
}

/// One iptables rule of the forms the firewall plugin uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct XtRule {
    pub iif: Option<Iface>,
    pub oif: Option<Iface>,
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    /// `-m conntrack --ctstate RELATED,ESTABLISHED`.
    pub established: bool,
    /// `-m comment --comment TEXT`.
    pub comment: Option<String>,
    pub target: Option<Target>,
    /// Read back with something this type does not model: never equal to
    /// a rule we would write.
    pub foreign: bool,
}

impl XtRule {
    pub(crate) fn to(target: Target) -> XtRule {
        XtRule {
            target: Some(target),
            ..XtRule::default()
        }
    }

    pub(crate) fn comment(mut self, text: &str) -> XtRule {
        self.comment = Some(text.to_string());
        self
    }

    /// The expressions, in iptables-nft's order.
    pub(crate) fn exprs(&self) -> Vec<Expr> {
        let mut out = Vec::new();
        for (key, iface) in [(MetaKey::Iifname, &self.iif), (MetaKey::Oifname, &self.oif)] {
            if let Some(i) = iface {
                let mut name = i.name.as_bytes().to_vec();
                name.push(0);
                let op = if i.negated {
                    Operator::NotEqual
                } else {
                    Operator::Equal
                };
                out.push(meta_load(key, Register::Reg1));
                out.push(cmp(op, &name));
            }
        }
        for (addr, is_src) in [(self.src, true), (self.dst, false)] {
            if let Some(ip) = addr {
                let (offset, bytes) = addr_field(ip, is_src);
                out.push(payload(
                    NETWORK_HEADER,
                    offset,
                    bytes.len() as u32,
                    Register::Reg1,
                ));
                out.push(cmp(Operator::Equal, &bytes));
            }
        }
        if self.established {
            out.push(xt_match("conntrack", 3, conntrack_info()));
        }
        if let Some(text) = &self.comment {
            out.push(xt_match("comment", 0, comment_info(text)));
        }
        out.push(counter());
        out.push(match &self.target {
            Some(Target::Accept) | None | Some(Target::Other) => verdict(Jump::Accept),
            Some(Target::Drop) => verdict(Jump::Drop),
            Some(Target::Return) => verdict(Jump::Return),
            Some(Target::Jump(chain)) => verdict(Jump::Call(chain)),
        });
        out
    }
}

/// Where an address sits in its family's header, and its bytes.
fn addr_field(ip: IpAddr, is_src: bool) -> (u32, Vec<u8>) {
    match ip {
        IpAddr::V4(a) => (if is_src { 12 } else { 16 }, a.octets().to_vec()),
        IpAddr::V6(a) => (if is_src { 8 } else { 24 }, a.octets().to_vec()),
    }
}

/// The NFTA_RULE_COMPAT iptables-nft sends with every rule: protocol 0, no
/// inversion.
pub(crate) fn compat() -> Vec<DefaultNla> {
    vec![
        DefaultNla::new(1, 0u32.to_be_bytes().to_vec()),
        DefaultNla::new(2, 0u32.to_be_bytes().to_vec()),
    ]
}

fn xt_match(name: &str, rev: u32, info: Vec<u8>) -> Expr {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    Expressions::Other {
        expression_type: "match".into(),
        attributes: vec![
            DefaultNla::new(NFTA_MATCH_NAME, n),
            DefaultNla::new(NFTA_MATCH_REV, rev.to_be_bytes().to_vec()),
            DefaultNla::new(NFTA_MATCH_INFO, info),
        ],
    }
    .into()
}

/// A counter starting at zero (NFTA_COUNTER_BYTES, _PACKETS).
fn counter() -> Expr {
    Expressions::Other {
        expression_type: "counter".into(),
        attributes: vec![
            DefaultNla::new(1, 0u64.to_be_bytes().to_vec()),
            DefaultNla::new(2, 0u64.to_be_bytes().to_vec()),
        ],
    }
    .into()
}

fn comment_info(text: &str) -> Vec<u8> {
    let mut b = text.as_bytes()[..text.len().min(COMMENT_LEN - 1)].to_vec();
    b.resize(COMMENT_LEN, 0);
    b
}

fn conntrack_info() -> Vec<u8> {
    let mut b = vec![0u8; CONNTRACK_LEN];
    b[CT_MATCH_FLAGS_AT..CT_MATCH_FLAGS_AT + 2].copy_from_slice(&XT_CONNTRACK_STATE.to_ne_bytes());
    b[CT_STATE_MASK_AT..CT_STATE_MASK_AT + 2]
        .copy_from_slice(&CT_ESTABLISHED_RELATED.to_ne_bytes());
    b
}

// ------------------------------------------------------------------ reading

/// A rule of a GETRULE dump: its handle and what it says.
#[derive(Debug, Clone)]
pub(crate) struct Dumped {
    pub handle: u64,
    pub rule: XtRule,
}

/// The rule in a NEWRULE answer (payload after nlmsghdr).
pub(crate) fn parse_rule(payload: &[u8]) -> Option<Dumped> {
    const NFTA_RULE_HANDLE: u16 = 3;
    const NFTA_RULE_EXPRESSIONS: u16 = 4;
    let mut handle = None;
    let mut rule = XtRule::default();
    for a in nlas(payload.get(4..)?) {
        match a.kind() {
            NFTA_RULE_HANDLE => {
                handle = Some(u64::from_be_bytes(a.value().get(..8)?.try_into().ok()?))
            }
            NFTA_RULE_EXPRESSIONS => read_exprs(a.value(), &mut rule),
            _ => {}
        }
    }
    Some(Dumped {
        handle: handle?,
        rule,
    })
}

/// A loaded value waiting for its compare: which field it is.
enum Loaded {
    Iif,
    Oif,
    Addr { offset: u32 },
    Unknown,
}

fn read_exprs(list: &[u8], rule: &mut XtRule) {
    let mut loaded = Loaded::Unknown;
    for elem in nlas(list) {
        let (mut name, mut data) = (String::new(), Vec::new());
        for a in nlas(elem.value()) {
            match a.kind() {
                1 => name = c_string(a.value()),
                2 => data = a.value().to_vec(),
                _ => {}
            }
        }
        let attrs: Vec<(u16, Vec<u8>)> = nlas(&data)
            .map(|a| (a.kind(), a.value().to_vec()))
            .collect();
        let get = |k: u16| {
            attrs
                .iter()
                .find(|(kind, _)| *kind == k)
                .map(|(_, v)| v.as_slice())
        };
        let be32 = |k: u16| {
            get(k)
                .and_then(|v| v.get(..4)?.try_into().ok())
                .map(u32::from_be_bytes)
        };
        match name.as_str() {
            "meta" => {
                // NFTA_META_KEY: IIFNAME 6, OIFNAME 7.
                loaded = match be32(2) {
                    Some(6) => Loaded::Iif,
                    Some(7) => Loaded::Oif,
                    _ => Loaded::Unknown,
                };
                if matches!(loaded, Loaded::Unknown) {
                    rule.foreign = true;
                }
            }
            "payload" if be32(2) == Some(NETWORK_HEADER) => {
                loaded = Loaded::Addr {
                    offset: be32(3).unwrap_or(u32::MAX),
                };
            }
            "cmp" => read_cmp(rule, &loaded, be32(2), get(3)),
            "match" => read_match(rule, get(NFTA_MATCH_NAME), get(NFTA_MATCH_INFO)),
            "counter" => {}
            "immediate" => rule.target = Some(read_verdict(get(2).unwrap_or_default())),
            _ => rule.foreign = true,
        }
    }
}

/// NFTA_CMP_OP (0 eq, 1 neq) and NFTA_CMP_DATA after a load.
fn read_cmp(rule: &mut XtRule, loaded: &Loaded, op: Option<u32>, data: Option<&[u8]>) {
    let value = data.and_then(data_value).unwrap_or_default();
    let negated = match op {
        Some(0) => false,
        Some(1) => true,
        _ => {
            rule.foreign = true;
            return;
        }
    };
    let iface = || Iface {
        name: c_string(&value),
        negated,
    };
    match loaded {
        Loaded::Iif => rule.iif = Some(iface()),
        Loaded::Oif => rule.oif = Some(iface()),
        Loaded::Addr { offset } if !negated => {
            let ip = match (offset, value.len()) {
                (12 | 16, 4) => <[u8; 4]>::try_from(value.as_slice()).ok().map(IpAddr::from),
                (8 | 24, 16) => <[u8; 16]>::try_from(value.as_slice())
                    .ok()
                    .map(IpAddr::from),
                _ => None,
            };
            match (ip, offset) {
                (Some(ip), 12 | 8) => rule.src = Some(ip),
                (Some(ip), _) => rule.dst = Some(ip),
                (None, _) => rule.foreign = true,
            }
        }
        _ => rule.foreign = true,
    }
}

fn read_match(rule: &mut XtRule, name: Option<&[u8]>, info: Option<&[u8]>) {
    let info = info.unwrap_or_default();
    match name.map(c_string).as_deref() {
        Some("comment") => rule.comment = Some(c_string(info)),
        Some("conntrack") if info == conntrack_info().as_slice() => rule.established = true,
        _ => rule.foreign = true,
    }
}

/// NFTA_IMMEDIATE_DATA → NFTA_DATA_VERDICT → code and chain.
fn read_verdict(data: &[u8]) -> Target {
    let Some(v) = nlas(data).find(|a| a.kind() == 2) else {
        return Target::Other;
    };
    let mut code = None;
    let mut chain = None;
    for a in nlas(v.value()) {
        match a.kind() {
            1 => {
                code = a
                    .value()
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map(i32::from_be_bytes)
            }
            2 => chain = Some(c_string(a.value())),
            _ => {}
        }
    }
    // NF_DROP 0, NF_ACCEPT 1, NFT_JUMP -3, NFT_RETURN -5.
    match (code, chain) {
        (Some(1), _) => Target::Accept,
        (Some(0), _) => Target::Drop,
        (Some(-5), _) => Target::Return,
        (Some(-3), Some(c)) => Target::Jump(c),
        _ => Target::Other,
    }
}

/// NFTA_DATA_VALUE inside an nft_data nest.
fn data_value(nest: &[u8]) -> Option<Vec<u8>> {
    nlas(nest)
        .find(|n| n.kind() == 1)
        .map(|n| n.value().to_vec())
}

fn nlas(buf: &[u8]) -> impl Iterator<Item = NlaBuffer<&[u8]>> {
    NlasIterator::new(buf).filter_map(|n| n.ok())
}

fn c_string(v: &[u8]) -> String {
    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

#[cfg(test)]
#[path = "xt_tests.rs"]
mod tests;
