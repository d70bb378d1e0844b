//! Builders for nftables messages (tables, chains, rules, sets and their
//! elements) and readers of the kernel's answers; the rules' expressions
//! are in `expr.rs`.

use super::expr::Expr;
use crate::netlink::nla;
use netlink_packet_core::{DefaultNla, NlaBuffer, NlasIterator};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, GenMessage, Hook, HookNumber, InetHookNumber,
    ListAttribute, NfTablesMessage, RuleAttribute, RuleMessage, SetAttribute, SetDescription,
    SetElementAttribute, SetElementList, SetElementMessage, SetFlags, SetMessage, TableAttribute,
    TableMessage, Verdict, VerdictAttribute,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

const NLA_F_NESTED: u16 = 0x8000;

/// A table of ours: family and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Table {
    pub family: NetfilterProtoFamily,
    pub name: &'static str,
}

/// Where a base chain hooks in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BaseHook {
    pub kind: &'static str,
    pub hook: InetHookNumber,
    pub priority: i32,
}

pub(crate) fn message(family: NetfilterProtoFamily, inner: NfTablesMessage) -> NetfilterMessage {
    NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), inner)
}

// ------------------------------------------------------------------ objects

pub(crate) fn new_table(t: Table) -> NetfilterMessage {
    let attrs = vec![TableAttribute::Name(t.name.into())];
    message(
        t.family,
        NfTablesMessage::NewTable(TableMessage { attributes: attrs }),
    )
}

/// The attributes naming chain `name` of `t`.
fn chain_id(t: Table, name: &str) -> Vec<ChainAttribute> {
    vec![
        ChainAttribute::Table(t.name.into()),
        ChainAttribute::Name(name.into()),
    ]
}

/// The attributes naming the rules of chain `chain` of `t`.
fn rules_of(t: Table, chain: &str) -> Vec<RuleAttribute> {
    vec![
        RuleAttribute::Table(t.name.into()),
        RuleAttribute::Chain(chain.into()),
    ]
}

/// The attributes naming the elements of set `set` of `t`.
fn elements_in(t: Table, set: &str) -> Vec<SetElementList> {
    vec![
        SetElementList::Table(t.name.into()),
        SetElementList::Set(set.into()),
    ]
}

pub(crate) fn new_chain(t: Table, name: &str, hook: Option<BaseHook>) -> NetfilterMessage {
    let mut attrs = chain_id(t, name);
    if let Some(h) = hook {
        attrs.push(ChainAttribute::Hook(vec![
            Hook::Number(HookNumber::Inet(h.hook)),
            Hook::Priority(h.priority as u32),
        ]));
        attrs.push(ChainAttribute::Type(h.kind.into()));
    }
    message(
        t.family,
        NfTablesMessage::NewChain(ChainMessage { attributes: attrs }),
    )
}

pub(crate) fn get_chain(t: Table, name: &str) -> NetfilterMessage {
    let attributes = chain_id(t, name);
    message(
        t.family,
        NfTablesMessage::GetChain(ChainMessage { attributes }),
    )
}

/// DELCHAIN (the chain must have no rules and no references left).
pub(crate) fn delete_chain(t: Table, name: &str) -> NetfilterMessage {
    let attributes = chain_id(t, name);
    message(
        t.family,
        NfTablesMessage::DeleteChain(ChainMessage { attributes }),
    )
}

pub(crate) fn get_set(t: Table, name: &str) -> NetfilterMessage {
    let attributes = vec![
        SetAttribute::Table(t.name.into()),
        SetAttribute::Name(name.into()),
    ];
    message(t.family, NfTablesMessage::GetSet(SetMessage { attributes }))
}

/// DELSET, elements and all (no rule may still refer to it).
pub(crate) fn delete_set(t: Table, name: &str) -> NetfilterMessage {
    let attributes = vec![
        SetAttribute::Table(t.name.into()),
        SetAttribute::Name(name.into()),
    ];
    message(
        t.family,
        NfTablesMessage::DeleteSet(SetMessage { attributes }),
    )
}

/// DELRULE naming only the chain: removes every rule in it.
pub(crate) fn flush_chain(t: Table, chain: &str) -> NetfilterMessage {
    let attributes = rules_of(t, chain);
    message(
        t.family,
        NfTablesMessage::DeleteRule(RuleMessage { attributes }),
    )
}

pub(crate) fn new_rule(t: Table, chain: &str, exprs: Vec<Expr>) -> NetfilterMessage {
    let mut attributes = rules_of(t, chain);
    attributes.push(RuleAttribute::Expressions(exprs));
    message(
        t.family,
        NfTablesMessage::NewRule(RuleMessage { attributes }),
    )
}

/// A named set: key (and map data) types as nft numbers them, so `nft list`
/// prints them; interval sets of concatenations also describe their fields.
pub(crate) struct SetSpec<'a> {
    pub name: &'a str,
    pub key_type: u32,
    pub key_len: u32,
    /// The key is a host-order value (an interface name), not a number in
    /// network order: recorded in the set's user data, where nft looks.
    pub key_host_order: bool,
    pub data: Option<(u32, u32)>,
    pub interval_fields: Option<Vec<u32>>,
    pub id: u32,
}

pub(crate) fn new_set(t: Table, s: &SetSpec) -> NetfilterMessage {
    let mut flags = SetFlags::empty();
    let mut attrs = vec![
        SetAttribute::Table(t.name.into()),
        SetAttribute::Name(s.name.into()),
        SetAttribute::KeyType(s.key_type),
        SetAttribute::KeyLen(s.key_len),
        SetAttribute::Id(s.id),
    ];
    if let Some((data_type, data_len)) = s.data {
        flags |= SetFlags::Map;
        attrs.push(SetAttribute::DataType(data_type));
        attrs.push(SetAttribute::DataLen(data_len));
    }
    if s.key_host_order {
        attrs.push(SetAttribute::UserData(KEY_IN_HOST_ORDER.to_vec()));
    }
    if let Some(fields) = &s.interval_fields {
        flags |= SetFlags::Interval | SetFlags::Concat;
        attrs.push(SetAttribute::Description(vec![concat_desc(fields)]));
    }
    attrs.push(SetAttribute::Flags(flags));
    message(
        t.family,
        NfTablesMessage::NewSet(SetMessage { attributes: attrs }),
    )
}

/// libnftnl's user data TLV { NFTNL_UDATA_SET_KEYBYTEORDER (0), length 4,
/// BYTEORDER_HOST_ENDIAN (1) as a native u32 }, as nft writes it for such a set.
const KEY_IN_HOST_ORDER: [u8; 6] = {
    let order = 1u32.to_ne_bytes();
    [0, 4, order[0], order[1], order[2], order[3]]
};

/// NFTA_SET_DESC_CONCAT: one NFTA_LIST_ELEM { NFTA_SET_FIELD_LEN } per field.
fn concat_desc(fields: &[u32]) -> SetDescription {
    const NFTA_SET_DESC_CONCAT: u16 = 2;
    const NFTA_LIST_ELEM: u16 = 1;
    const NFTA_SET_FIELD_LEN: u16 = 1;
    let mut list = Vec::new();
    for len in fields {
        let field = nla(NFTA_SET_FIELD_LEN, &len.to_be_bytes());
        list.extend(nla(NFTA_LIST_ELEM | NLA_F_NESTED, &field));
    }
    SetDescription::Other(DefaultNla::new(NFTA_SET_DESC_CONCAT | NLA_F_NESTED, list))
}

/// One set element as we write and read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Element {
    pub key: Vec<u8>,
    /// Interval sets: the inclusive end of each field's range.
    pub key_end: Option<Vec<u8>>,
    /// Maps: the value.
    pub data: Option<Vec<u8>>,
    /// Verdict maps: the chain the element's key goes to (`goto chain`).
    pub goto: Option<String>,
    pub userdata: Vec<u8>,
}

impl Element {
    fn attributes(&self, with_body: bool) -> Vec<SetElementAttribute> {
        let mut attrs = vec![SetElementAttribute::Key(DataAttribute::Value(
            self.key.clone(),
        ))];
        if let Some(end) = &self.key_end {
            attrs.push(SetElementAttribute::KeyEnd(vec![value_nla(end)]));
        }
        if with_body {
            if let Some(data) = &self.data {
                attrs.push(SetElementAttribute::Data(DataAttribute::Value(
                    data.clone(),
                )));
            }
            if let Some(chain) = &self.goto {
                attrs.push(SetElementAttribute::Data(DataAttribute::Verdict(vec![
                    VerdictAttribute::Code(Verdict::Goto),
                    VerdictAttribute::Chain(chain.clone()),
                ])));
            }
            if !self.userdata.is_empty() {
                attrs.push(SetElementAttribute::UserData(self.userdata.clone()));
            }
        }
        attrs
    }
}

/// NEWSETELEM (`add`) or DELSETELEM for `elems` of one set.
pub(crate) fn set_elems(t: Table, set: &str, elems: &[Element], add: bool) -> NetfilterMessage {
    let list = elems
        .iter()
        .map(|e| ListAttribute::Element(e.attributes(add)))
        .collect();
    let mut attributes = elements_in(t, set);
    attributes.push(SetElementList::Elements(list));
    let msg = SetElementMessage { attributes };
    let inner = if add {
        NfTablesMessage::NewSetElement(msg)
    } else {
        NfTablesMessage::DeleteSetElement(msg)
    };
    message(t.family, inner)
}

/// GETSETELEM: with `key` one element (exact match on hash sets), without it
/// (as a dump) the whole set.
pub(crate) fn get_elems(t: Table, set: &str, key: Option<&[u8]>) -> NetfilterMessage {
    let mut attributes = elements_in(t, set);
    if let Some(k) = key {
        attributes.push(SetElementList::Elements(vec![ListAttribute::Element(
            vec![SetElementAttribute::Key(DataAttribute::Value(k.to_vec()))],
        )]));
    }
    let msg = SetElementMessage { attributes };
    message(t.family, NfTablesMessage::GetSetElement(msg))
}

/// The elements of one NEWSETELEM answer (payload after nlmsghdr). Parsed
/// here rather than with the crate: its parser formats the whole remaining
/// buffer into the error context of every attribute, eagerly, which makes a
/// dump of a few hundred elements take hundreds of milliseconds.
pub(crate) fn elements_of(payload: &[u8]) -> Vec<Element> {
    const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
    let mut out = Vec::new();
    for list in nlas(payload.get(NFGENMSG_LEN..).unwrap_or_default()) {
        if list.kind() == NFTA_SET_ELEM_LIST_ELEMENTS {
            out.extend(nlas(list.value()).filter_map(|e| parse_element(e.value())));
        }
    }
    out
}

fn parse_element(attrs: &[u8]) -> Option<Element> {
    const KEY: u16 = 1;
    const DATA: u16 = 2;
    const USERDATA: u16 = 6;
    const KEY_END: u16 = 10;
    let mut e = Element {
        key: Vec::new(),
        key_end: None,
        data: None,
        goto: None,
        userdata: Vec::new(),
    };
    for a in nlas(attrs) {
        match a.kind() {
            KEY => e.key = data_value(a.value())?,
            KEY_END => e.key_end = data_value(a.value()),
            DATA => {
                e.data = data_value(a.value());
                e.goto = verdict_chain(a.value());
            }
            USERDATA => e.userdata = a.value().to_vec(),
            _ => {}
        }
    }
    (!e.key.is_empty()).then_some(e)
}

/// The NFTA_DATA_VALUE inside an nft_data nest.
fn data_value(nest: &[u8]) -> Option<Vec<u8>> {
    const NFTA_DATA_VALUE: u16 = 1;
    nlas(nest)
        .find(|n| n.kind() == NFTA_DATA_VALUE)
        .map(|n| n.value().to_vec())
}

/// The chain of the NFTA_DATA_VERDICT inside an nft_data nest (a verdict
/// map's value).
fn verdict_chain(nest: &[u8]) -> Option<String> {
    const NFTA_DATA_VERDICT: u16 = 2;
    const NFTA_VERDICT_CHAIN: u16 = 2;
    let verdict = nlas(nest).find(|n| n.kind() == NFTA_DATA_VERDICT)?;
    let chain = nlas(verdict.value()).find(|n| n.kind() == NFTA_VERDICT_CHAIN)?;
    Some(c_string(chain.value()))
}

/// What the rule in one NEWRULE answer (payload after nlmsghdr) refers to
/// by name: the sets its `lookup` expressions name and the chains its
/// verdicts (`immediate`: jump, goto) send to; and its handle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RuleRefs {
    pub handle: Option<u64>,
    pub sets: Vec<String>,
    pub chains: Vec<String>,
}

pub(crate) fn rule_refs(payload: &[u8]) -> RuleRefs {
    const NFTA_RULE_HANDLE: u16 = 3;
    const NFTA_RULE_EXPRESSIONS: u16 = 4;
    let mut refs = RuleRefs::default();
    for a in nlas(payload.get(NFGENMSG_LEN..).unwrap_or_default()) {
        match a.kind() {
            NFTA_RULE_HANDLE => {
                refs.handle = a
                    .value()
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes);
            }
            NFTA_RULE_EXPRESSIONS => {
                nlas(a.value()).for_each(|e| expression_refs(e.value(), &mut refs))
            }
            _ => {}
        }
    }
    refs
}

/// The set a `lookup` expression names, or the chain an `immediate` verdict
/// sends to, into `refs`.
fn expression_refs(expr: &[u8], refs: &mut RuleRefs) {
    const NFTA_EXPR_NAME: u16 = 1;
    const NFTA_EXPR_DATA: u16 = 2;
    const NFTA_LOOKUP_SET: u16 = 1;
    const NFTA_IMMEDIATE_DATA: u16 = 2;
    let attrs: Vec<_> = nlas(expr).collect();
    let named = |kind| attrs.iter().find(|n| n.kind() == kind);
    let data =
        |kind| named(NFTA_EXPR_DATA).and_then(|d| nlas(d.value()).find(|n| n.kind() == kind));
    match named(NFTA_EXPR_NAME)
        .map(|n| c_string(n.value()))
        .as_deref()
    {
        Some("lookup") => refs
            .sets
            .extend(data(NFTA_LOOKUP_SET).map(|n| c_string(n.value()))),
        Some("immediate") => refs
            .chains
            .extend(data(NFTA_IMMEDIATE_DATA).and_then(|d| verdict_chain(d.value()))),
        _ => {}
    }
}

/// The attributes of a message (its payload after the nfgenmsg header):
/// kind and value.
pub(crate) fn attributes(payload: &[u8]) -> Vec<(u16, Vec<u8>)> {
    nlas(payload.get(NFGENMSG_LEN..).unwrap_or_default())
        .map(|n| (n.kind(), n.value().to_vec()))
        .collect()
}

/// A NUL-terminated string attribute's text.
pub(crate) fn c_string(value: &[u8]) -> String {
    let text = value.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(text).into_owned()
}

/// NFTA_GEN_ID of a GETGEN answer (payload after nlmsghdr).
pub(crate) fn gen_id(payload: &[u8]) -> Option<u32> {
    const NFTA_GEN_ID: u16 = 1;
    nlas(payload.get(NFGENMSG_LEN..)?)
        .find(|n| n.kind() == NFTA_GEN_ID)
        .and_then(|n| n.value().get(..4)?.try_into().ok())
        .map(u32::from_be_bytes)
}

const NFGENMSG_LEN: usize = 4;

/// The well-formed attributes of `buf` (kinds without flag bits).
fn nlas(buf: &[u8]) -> impl Iterator<Item = NlaBuffer<&[u8]>> {
    NlasIterator::new(buf).filter_map(|n| n.ok())
}

pub(crate) fn get_gen() -> NetfilterMessage {
    message(
        NetfilterProtoFamily::Unspec,
        NfTablesMessage::GetGen(GenMessage { attributes: vec![] }),
    )
}

/// NFTA_DATA_VALUE holding `bytes`.
fn value_nla(bytes: &[u8]) -> DefaultNla {
    DefaultNla::new(1, bytes.to_vec())
}
