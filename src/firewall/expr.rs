//! Builders for the rule expressions cnikit's chains use. The crate
//! (`netlink-packet-netfilter`) has the common ones; `fib`, `nat`, `masq`
//! and `ct`, which it lacks, are encoded here as raw attributes with the
//! numbers of `linux/netfilter/nf_tables.h`.

use netlink_packet_core::DefaultNla;
use netlink_packet_netfilter::nftables::{
    Bitwise, Cmp, DataAttribute, ExpressionAttribute, Expressions, Immediate, ListAttribute,
    Lookup, Meta, MetaKey, Operator, Payload, Register, Verdict, VerdictAttribute,
};

pub(crate) type Expr = ListAttribute<ExpressionAttribute>;

/// NFT_PAYLOAD_*_HEADER bases.
pub(crate) const LINK_HEADER: u32 = 0;
pub(crate) const NETWORK_HEADER: u32 = 1;
pub(crate) const TRANSPORT_HEADER: u32 = 2;
/// NFPROTO_* values of `meta nfproto`.
pub(crate) const NFPROTO_IPV4: u8 = 2;
pub(crate) const NFPROTO_IPV6: u8 = 10;

/// The register holding byte `offset` of a concatenation, numbered as nft
/// does: the first field in the 16-byte register 1, later fields in 32-bit
/// registers (NFT_REG32_00 = 8 is the first).
pub(crate) fn reg_at(offset: u32) -> Register {
    if offset == 0 {
        Register::Reg1
    } else {
        Register::Other(8 + offset / 4)
    }
}

pub(crate) fn meta_load(key: MetaKey, dreg: Register) -> Expr {
    Expressions::Meta(vec![Meta::Key(key), Meta::DestinationRegister(dreg)]).into()
}

pub(crate) fn payload(base: u32, offset: u32, len: u32, dreg: Register) -> Expr {
    Expressions::Payload(vec![
        Payload::DestinationRegister(dreg),
        Payload::Base(base),
        Payload::Offset(offset),
        Payload::Len(len),
    ])
    .into()
}

pub(crate) fn cmp(op: Operator, data: &[u8]) -> Expr {
    Expressions::Cmp(vec![
        Cmp::SourceRegister(Register::Reg1),
        Cmp::Op(op),
        Cmp::Data(DataAttribute::Value(data.to_vec())),
    ])
    .into()
}

/// reg1 = reg1 & mask (xor 0), over `mask.len()` bytes.
pub(crate) fn and_mask(mask: &[u8]) -> Expr {
    Expressions::Bitwise(vec![
        Bitwise::SourceRegister(Register::Reg1),
        Bitwise::DestinationRegister(Register::Reg1),
        Bitwise::Length(mask.len() as u32),
        Bitwise::Mask(DataAttribute::Value(mask.to_vec())),
        Bitwise::Xor(DataAttribute::Value(vec![0; mask.len()])),
    ])
    .into()
}

/// Set membership of the key starting in reg1; with `map`, the value lands
/// in reg1 onwards.
pub(crate) fn lookup(set: &str, map: bool) -> Expr {
    let mut attrs = vec![
        Lookup::Set(set.into()),
        Lookup::SourceRegister(Register::Reg1),
    ];
    if map {
        attrs.push(Lookup::DestinationRegister(Register::Reg1));
    }
    Expressions::Lookup(attrs).into()
}

/// A verdict: `accept`, `drop`, `return`, `jump chain` or `goto chain`.
pub(crate) enum Jump<'a> {
    Accept,
    Drop,
    Return,
    /// `jump chain`: a call, which comes back on `return`.
    Call(&'a str),
    Goto(&'a str),
}

pub(crate) fn verdict(v: Jump) -> Expr {
    let mut attrs = Vec::new();
    match v {
        Jump::Accept => attrs.push(VerdictAttribute::Code(Verdict::Other(1))), // NF_ACCEPT
        Jump::Drop => attrs.push(VerdictAttribute::Code(Verdict::Other(0))),   // NF_DROP
        Jump::Return => attrs.push(VerdictAttribute::Code(Verdict::Return)),
        Jump::Call(chain) | Jump::Goto(chain) => {
            let code = if matches!(v, Jump::Call(_)) {
                Verdict::Jump
            } else {
                Verdict::Goto
            };
            attrs.push(VerdictAttribute::Code(code));
            attrs.push(VerdictAttribute::Chain(chain.into()));
        }
    }
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(Register::Verdict),
        Immediate::Data(DataAttribute::Verdict(attrs)),
    ])
    .into()
}

/// An expression the crate has no type for: name plus u32 attributes
/// (all nftables attributes are big endian).
fn raw_expr(name: &str, attrs: &[(u16, u32)]) -> Expr {
    let attributes = attrs
        .iter()
        .map(|(kind, v)| DefaultNla::new(*kind, v.to_be_bytes().to_vec()))
        .collect();
    Expressions::Other {
        expression_type: name.into(),
        attributes,
    }
    .into()
}

/// `fib daddr type` into reg1 (NFTA_FIB_DREG, _RESULT = ADDRTYPE, _FLAGS = DADDR).
pub(crate) fn fib_daddr_type() -> Expr {
    raw_expr("fib", &[(1, Register::Reg1.into()), (2, 3), (3, 2)])
}

/// RTN_LOCAL, what `fib … type local` compares with (host byte order).
pub(crate) const RTN_LOCAL: u32 = 2;

/// `ct status` into reg1 (NFTA_CT_DREG, NFTA_CT_KEY = NFT_CT_STATUS).
pub(crate) fn ct_status() -> Expr {
    raw_expr("ct", &[(1, Register::Reg1.into()), (2, 2)])
}

/// `ct state` into reg1 (NFTA_CT_KEY = NFT_CT_STATE).
pub(crate) fn ct_state() -> Expr {
    raw_expr("ct", &[(1, Register::Reg1.into()), (2, 0)])
}

/// ESTABLISHED | RELATED in `ct state`'s bits (NF_CT_STATE_BIT).
pub(crate) const CT_ESTABLISHED_RELATED: u32 = 0b110;

/// IPS_DST_NAT: the connection was destination-NATed.
pub(crate) const IPS_DST_NAT: u32 = 0x20;

/// `dnat` to the address in reg1 and the port in `port_reg`
/// (NFTA_NAT_TYPE = DNAT, _FAMILY, _REG_ADDR_MIN, _REG_PROTO_MIN).
pub(crate) fn dnat(nfproto: u8, port_reg: Register) -> Expr {
    raw_expr(
        "nat",
        &[
            (1, 1),
            (2, u32::from(nfproto)),
            (3, Register::Reg1.into()),
            (5, port_reg.into()),
        ],
    )
}

/// `masquerade` (no attributes: the output interface's address, any port).
pub(crate) fn masq() -> Expr {
    raw_expr("masq", &[])
}
