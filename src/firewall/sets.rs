//! The shape of cnikit's nftables sets and maps: the fields a key or value
//! is made of, a set's definition, and how values are laid out in the bytes
//! of a key. What the sets are for is in `schema.rs`; reading and changing
//! them in `store.rs`.

use super::nft::SetSpec;
use std::borrow::Cow;
use std::net::IpAddr;
/// One field of a set key or map value, as nft types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    V4,
    V6,
    Proto,
    Port,
    Ifname,
    Ether,
}

impl Field {
    /// nft's datatype numbers (TYPE_IPADDR, …), so `nft list` can print us.
    fn nft_type(self) -> u32 {
        match self {
            Field::V4 => 7,
            Field::V6 => 8,
            Field::Proto => 12,
            Field::Port => 13,
            Field::Ifname => 41,
            Field::Ether => 9,
        }
    }

    fn len(self) -> u32 {
        match self {
            Field::V4 => 4,
            Field::V6 | Field::Ifname => 16,
            Field::Proto => 1,
            Field::Port => 2,
            Field::Ether => 6,
        }
    }

    /// Stored in host byte order (a name), not as a number in network order.
    fn host_order(self) -> bool {
        matches!(self, Field::Ifname)
    }

    /// Fields of a concatenation each occupy whole 32-bit registers.
    fn reg_len(self) -> u32 {
        (self.len() + 3) & !3
    }
}

/// A named set or map of ours: most are fixed, a network's own sets are
/// named at run time (see `dispatch.rs`).
#[derive(Debug, Clone)]
pub(crate) struct SetDef {
    pub name: Cow<'static, str>,
    pub key: &'static [Field],
    /// Map values; empty for plain sets.
    pub data: &'static [Field],
    /// Interval concatenation (ranges per field).
    pub interval: bool,
    /// A verdict map: each key goes to a chain.
    pub verdict: bool,
}

impl SetDef {
    pub(crate) fn spec(&self, id: u32) -> SetSpec<'_> {
        SetSpec {
            name: &self.name,
            key_type: concat_type(self.key),
            key_len: concat_len(self.key),
            // nft reads a lone key's bytes in network order unless told: an
            // interface name would print as "" (concatenations are typed per field).
            key_host_order: matches!(self.key, [f] if f.host_order()),
            data: if self.verdict {
                // The kernel sizes verdict data itself.
                Some((NFT_DATA_VERDICT, 0))
            } else {
                (!self.data.is_empty()).then(|| (concat_type(self.data), concat_len(self.data)))
            },
            interval_fields: self
                .interval
                .then(|| self.key.iter().map(|f| f.len()).collect()),
            id,
        }
    }
}

/// The data type of a verdict map's values.
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

/// nft encodes a concatenation's type as 6 bits per member.
pub(crate) fn concat_type(fields: &[Field]) -> u32 {
    fields.iter().fold(0, |acc, f| (acc << 6) | f.nft_type())
}

pub(crate) fn concat_len(fields: &[Field]) -> u32 {
    fields.iter().map(|f| f.reg_len()).sum()
}

/// A value of one field, encoded as the kernel stores it in a register.
#[derive(Debug, Clone)]
pub(crate) enum Value<'a> {
    Ip(IpAddr),
    Proto(u8),
    Port(u16),
    Ifname(&'a str),
    Ether([u8; 6]),
}

/// The bytes of a concatenation: each value padded to whole 32-bit words.
pub(crate) fn key(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match v {
            Value::Ip(IpAddr::V4(a)) => out.extend(a.octets()),
            Value::Ip(IpAddr::V6(a)) => out.extend(a.octets()),
            Value::Proto(p) => out.push(*p),
            Value::Port(p) => out.extend(p.to_be_bytes()),
            Value::Ifname(name) => {
                let mut b = name.as_bytes().to_vec();
                b.resize(16, 0);
                out.extend(b);
            }
            Value::Ether(mac) => out.extend(mac),
        }
        out.resize((out.len() + 3) & !3, 0);
    }
    out
}

/// The values of a concatenation of `fields` in `bytes`, as [`key`] lays
/// them out; None when a field is not an address, protocol or port (the
/// only ones read back) or the length does not fit.
pub(crate) fn decode(fields: &[Field], bytes: &[u8]) -> Option<Vec<Value<'static>>> {
    let mut out = Vec::with_capacity(fields.len());
    let mut at = 0;
    for f in fields {
        let b = bytes.get(at..at + f.len() as usize)?;
        out.push(match f {
            Field::V4 => Value::Ip(IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
            Field::V6 => Value::Ip(IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
            Field::Proto => Value::Proto(b[0]),
            Field::Port => Value::Port(u16::from_be_bytes(b.try_into().ok()?)),
            Field::Ifname | Field::Ether => return None,
        });
        at += f.reg_len() as usize;
    }
    (at == bytes.len()).then_some(out)
}

pub(crate) const fn map(
    name: &'static str,
    key: &'static [Field],
    data: &'static [Field],
) -> SetDef {
    SetDef {
        name: Cow::Borrowed(name),
        key,
        data,
        interval: false,
        verdict: false,
    }
}

/// A verdict map keyed by `key` (`key : goto chain`).
pub(crate) const fn vmap(name: &'static str, key: &'static [Field]) -> SetDef {
    SetDef {
        name: Cow::Borrowed(name),
        key,
        data: &[],
        interval: false,
        verdict: true,
    }
}

pub(crate) const fn set(name: &'static str, key: &'static [Field], interval: bool) -> SetDef {
    SetDef {
        name: Cow::Borrowed(name),
        key,
        data: &[],
        interval,
        verdict: false,
    }
}

/// A plain set of addresses of one family, named at run time.
pub(crate) fn address_set(name: String, v4: bool) -> SetDef {
    SetDef {
        name: Cow::Owned(name),
        key: if v4 { &[Field::V4] } else { &[Field::V6] },
        data: &[],
        interval: false,
        verdict: false,
    }
}
