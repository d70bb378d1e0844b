//! The layout cnikit owns: tables, sets/maps and chains with their rules, per
//! feature (port mappings, masquerade, MAC spoof check). See the module docs
//! in `mod.rs` for the picture; this file is the exact definition.
//!
//! "Chains created on first use": an ADD creates its feature's skeleton
//! (table, sets, chains and their few fixed rules) in its own batch when the
//! skeleton's last chain is missing. The check is a read inside the
//! transaction, so two first ADDs cannot both create it (the second one's
//! batch is refused and re-planned). An existing skeleton is not re-asserted:
//! that would delete and re-add the rules every call, and any deletion makes
//! the kernel wait for an RCU grace period (≈10 ms here) when our netlink
//! socket closes.

use super::expr::{
    and_mask, cmp, ct_state, dnat, fib_daddr_type, lookup, masq, meta_load, payload, reg_at,
    verdict, Expr, Jump, CT_ESTABLISHED_RELATED, LINK_HEADER, NETWORK_HEADER, NFPROTO_IPV4,
    NFPROTO_IPV6, RTN_LOCAL, TRANSPORT_HEADER,
};
use super::matches::{addr_layout, is_family};
use super::nft::{BaseHook, Table};
pub(crate) use super::sets::{key, SetDef, Value};
use super::sets::{map, set, Field};
use super::store::{Nft, Tx};
use super::Result;
use netlink_packet_netfilter::nftables::{InetHookNumber, MetaKey, Operator};
use netlink_packet_netfilter::NetfilterProtoFamily;

pub(crate) const INET: Table = Table {
    family: NetfilterProtoFamily::Inet,
    name: "cnikit",
};
/// Bridge-family filtering (MAC spoof check) needs a bridge-family table:
/// inet tables never see bridged frames.
pub(crate) const BRIDGE: Table = Table {
    family: NetfilterProtoFamily::Bridge,
    name: "cnikit",
};

// ------------------------------------------------------------------ features

/// A feature's skeleton: its sets and chains (regular chains first, so base
/// chains can jump to them).
pub(crate) struct Skeleton {
    /// The feature's name, as its attachments' records are named.
    pub name: &'static str,
    pub table: Table,
    pub sets: &'static [&'static SetDef],
    pub chains: fn() -> Vec<Chain>,
}

pub(crate) struct Chain {
    pub name: String,
    pub hook: Option<BaseHook>,
    pub rules: Vec<Vec<Expr>>,
}

/// Adds the skeleton's table, sets and chains (with their fixed rules) to
/// `tx`, unless it exists; true when it did not. Its last chain is created in
/// the same batch as the rest, so finding it means the whole skeleton is there.
pub(crate) fn ensure(nft: &mut Nft, tx: &mut Tx, s: &Skeleton) -> Result<bool> {
    let chains = (s.chains)();
    if let Some(last) = chains.last() {
        if tx.creates_chain(s.table, &last.name) || nft.chain_exists(s.table, &last.name)? {
            return Ok(false);
        }
    }
    tx.new_table(s.table);
    for set in s.sets {
        tx.new_set(s.table, set);
    }
    for c in &chains {
        tx.new_chain(s.table, &c.name, c.hook);
    }
    for c in chains {
        // Only a half-built skeleton (someone deleted our last chain) has
        // rules to remove; a new chain has none.
        tx.flush_chain(s.table, &c.name);
        for rule in c.rules {
            tx.new_rule(s.table, &c.name, rule);
        }
    }
    Ok(true)
}

/// A repair's [`ensure`]: every set and chain of the skeleton is looked
/// for, not only its last chain, and a chain whose fixed rules someone
/// flushed or changed in number is filled again (a chain whose rules come
/// with networks, `dispatch.rs`, is only made when missing). It reads one
/// dump per chain, so it is for repairs, not for every ADD.
pub(crate) fn ensure_whole(nft: &mut Nft, tx: &mut Tx, s: &Skeleton) -> Result<()> {
    if ensure(nft, tx, s)? {
        return Ok(());
    }
    for set in s.sets {
        if !tx.creates_set(&set.name) && !nft.set_exists(s.table, &set.name)? {
            tx.new_set(s.table, set);
        }
    }
    for c in (s.chains)() {
        if tx.creates_chain(s.table, &c.name) {
            continue;
        }
        if !nft.chain_exists(s.table, &c.name)? {
            tx.new_chain(s.table, &c.name, c.hook);
        } else if c.rules.is_empty() || nft.rule_count(s.table, &c.name)? == c.rules.len() {
            continue;
        } else {
            tx.flush_chain(s.table, &c.name);
        }
        for rule in c.rules {
            tx.new_rule(s.table, &c.name, rule);
        }
    }
    Ok(())
}

/// Adds a regular chain with its rules to `tx` unless it exists (the chains a
/// verdict map's elements go to, one per subnet or set of subnets). They stay
/// when their last element goes: they are few, and a later pod of the same
/// network needs them again.
pub(crate) fn ensure_chain(nft: &mut Nft, tx: &mut Tx, t: Table, c: &Chain) -> Result<()> {
    if tx.creates_chain(t, &c.name) || nft.chain_exists(t, &c.name)? {
        return Ok(());
    }
    tx.new_chain(t, &c.name, None);
    for rule in &c.rules {
        tx.new_rule(t, &c.name, rule.clone());
    }
    Ok(())
}

const fn nat_hook(hook: InetHookNumber, priority: i32) -> Option<BaseHook> {
    Some(BaseHook {
        kind: "nat",
        hook,
        priority,
    })
}

/// NF_IP_PRI_NAT_DST / NF_IP_PRI_NAT_SRC, nft's `dstnat` / `srcnat`.
const DSTNAT: i32 = -100;
const SRCNAT: i32 = 100;

// ---- port mappings: DNAT maps keyed by (hostIP?, proto, hostPort)

/// Keys: a mapping on every host address is found by (proto . hostPort), one
/// on a single host address by (hostIP . proto . hostPort).
const ANY_HOST_KEY: &[Field] = &[Field::Proto, Field::Port];
const V4_HOST_KEY: &[Field] = &[Field::V4, Field::Proto, Field::Port];
const V6_HOST_KEY: &[Field] = &[Field::V6, Field::Proto, Field::Port];
/// Values: the DNAT target (container address . port).
const V4_TARGET: &[Field] = &[Field::V4, Field::Port];
const V6_TARGET: &[Field] = &[Field::V6, Field::Port];
pub(crate) static PM4_ANY: SetDef = map("pm4-any", ANY_HOST_KEY, V4_TARGET);
pub(crate) static PM4_IP: SetDef = map("pm4-ip", V4_HOST_KEY, V4_TARGET);
pub(crate) static PM6_ANY: SetDef = map("pm6-any", ANY_HOST_KEY, V6_TARGET);
pub(crate) static PM6_IP: SetDef = map("pm6-ip", V6_HOST_KEY, V6_TARGET);

pub(crate) static PORTMAP: Skeleton = Skeleton {
    name: "portmap",
    table: INET,
    sets: &[&PM4_ANY, &PM4_IP, &PM6_ANY, &PM6_IP],
    chains: portmap_chains,
};

pub(crate) const PM_CHAINS: [&str; 5] = [
    "pm-hostports",
    "pm-prerouting",
    "pm-output",
    PM_MASQ_ALL,
    PM_MASQ_BASE,
];

/// Masquerade every DNATed connection (masqAll).
pub(crate) const PM_MASQ_ALL: &str = "pm-masq-all";
/// The base chains of portmap's masquerade and of bridge `ipMasq`, where
/// each network's rule goes (`dispatch.rs`).
pub(crate) const PM_MASQ_BASE: &str = "pm-masquerade";
pub(crate) const MASQ_BASE: &str = "masq-pods";

fn portmap_chains() -> Vec<Chain> {
    let to_local = || {
        vec![
            fib_daddr_type(),
            cmp(Operator::Equal, &RTN_LOCAL.to_ne_bytes()),
            verdict(Jump::Goto("pm-hostports")),
        ]
    };
    vec![
        chain(
            "pm-hostports",
            None,
            vec![
                dnat_rule(NFPROTO_IPV4, true),
                dnat_rule(NFPROTO_IPV4, false),
                dnat_rule(NFPROTO_IPV6, true),
                dnat_rule(NFPROTO_IPV6, false),
            ],
        ),
        chain(
            "pm-prerouting",
            nat_hook(InetHookNumber::PreRouting, DSTNAT),
            vec![to_local()],
        ),
        chain(
            "pm-output",
            nat_hook(InetHookNumber::LocalOut, DSTNAT),
            vec![to_local()],
        ),
        chain(PM_MASQ_ALL, None, vec![vec![masq()]]),
        // Its rules, one per set of pods whose DNATed connections are
        // masqueraded, come with their sets (`dispatch.rs`).
        chain(
            PM_MASQ_BASE,
            nat_hook(InetHookNumber::PostRouting, SRCNAT),
            vec![],
        ),
    ]
}

/// `meta nfproto X [ip daddr .] meta l4proto . th dport dnat to map @pmX-…`
fn dnat_rule(nfproto: u8, with_ip: bool) -> Vec<Expr> {
    let (alen, _, daddr) = addr_layout(nfproto);
    let (set, mut at) = match (nfproto == NFPROTO_IPV4, with_ip) {
        (true, true) => (&PM4_IP.name, alen),
        (true, false) => (&PM4_ANY.name, 0),
        (false, true) => (&PM6_IP.name, alen),
        (false, false) => (&PM6_ANY.name, 0),
    };
    let mut rule = is_family(nfproto);
    if with_ip {
        rule.push(payload(NETWORK_HEADER, daddr, alen, reg_at(0)));
    }
    rule.push(meta_load(MetaKey::L4Proto, reg_at(at)));
    at += 4;
    rule.push(payload(TRANSPORT_HEADER, 2, 2, reg_at(at)));
    rule.push(lookup(set, true));
    // The value is address . port: the port sits right after the address.
    rule.push(dnat(nfproto, reg_at(alen)));
    rule
}

// ---- bridge ipMasq: masquerade container sources leaving their subnets

pub(crate) static MASQ: Skeleton = Skeleton {
    name: "masq",
    table: INET,
    // Each network's set of pods comes with its rule (`dispatch.rs`).
    sets: &[],
    chains: || {
        vec![chain(
            MASQ_BASE,
            nat_hook(InetHookNumber::PostRouting, SRCNAT),
            vec![],
        )]
    },
};

// ---- bridge macspoofchk: frames from a container port must carry its MAC

pub(crate) static SPOOF_PORTS: SetDef = set("macspoof-ports", &[Field::Ifname], false);
pub(crate) static SPOOF_ALLOW: SetDef =
    set("macspoof-allow", &[Field::Ifname, Field::Ether], false);

pub(crate) static MACSPOOF: Skeleton = Skeleton {
    name: "macspoof",
    table: BRIDGE,
    sets: &[&SPOOF_PORTS, &SPOOF_ALLOW],
    chains: macspoof_chains,
};

fn macspoof_chains() -> Vec<Chain> {
    let allowed = vec![
        meta_load(MetaKey::Iifname, reg_at(0)),
        payload(LINK_HEADER, 6, 6, reg_at(16)),
        lookup(&SPOOF_ALLOW.name, false),
        verdict(Jump::Return),
    ];
    let guarded = vec![
        meta_load(MetaKey::Iifname, reg_at(0)),
        lookup(&SPOOF_PORTS.name, false),
        verdict(Jump::Drop),
    ];
    vec![chain(
        "macspoof",
        // NF_BR_PRI_NAT_DST_BRIDGED: before anything else sees the frame.
        Some(BaseHook {
            kind: "filter",
            hook: InetHookNumber::PreRouting,
            priority: -300,
        }),
        vec![allowed, guarded],
    )]
}

// ---- firewall plugin, where the host has no iptables FORWARD chain

/// Pod addresses whose forwarded traffic is accepted (as the reference's
/// CNI-FORWARD rules do).
pub(crate) static FW4_PODS: SetDef = set("fw4-pods", &[Field::V4], false);
pub(crate) static FW6_PODS: SetDef = set("fw6-pods", &[Field::V6], false);
/// Bridges under `same-bridge` (or `isolated`) ingress policy; the pairs
/// (bridge . bridge) say "staying on this bridge is fine", the self pairs
/// (policy `isolated`) "not even that".
pub(crate) static FW_ISO: SetDef = set("fw-iso", &[Field::Ifname], false);
pub(crate) static FW_ISO_PAIR: SetDef = set("fw-iso-pair", &[Field::Ifname, Field::Ifname], false);
pub(crate) static FW_ISO_SELF: SetDef = set("fw-iso-self", &[Field::Ifname, Field::Ifname], false);

pub(crate) static FORWARD: Skeleton = Skeleton {
    name: "forward",
    table: INET,
    sets: &[&FW4_PODS, &FW6_PODS, &FW_ISO, &FW_ISO_PAIR, &FW_ISO_SELF],
    chains: forward_chains,
};

/// `fw-forward` filters forwarded traffic: isolation first (a drop in any
/// base chain is final), then the accepts.
fn forward_chains() -> Vec<Chain> {
    let pair = |set: &'static SetDef, end: Jump<'static>| {
        vec![
            meta_load(MetaKey::Iifname, reg_at(0)),
            meta_load(MetaKey::Oifname, reg_at(16)),
            lookup(&set.name, false),
            verdict(end),
        ]
    };
    let isolation = vec![
        pair(&FW_ISO_SELF, Jump::Drop),
        pair(&FW_ISO_PAIR, Jump::Return),
        vec![
            meta_load(MetaKey::Oifname, reg_at(0)),
            lookup(&FW_ISO.name, false),
            verdict(Jump::Drop),
        ],
    ];
    let mut forward = vec![vec![
        meta_load(MetaKey::Iifname, reg_at(0)),
        lookup(&FW_ISO.name, false),
        verdict(Jump::Call("fw-isolation")),
    ]];
    for (nfproto, set) in [(NFPROTO_IPV4, &FW4_PODS), (NFPROTO_IPV6, &FW6_PODS)] {
        let (alen, saddr, daddr) = addr_layout(nfproto);
        let mut replies = is_family(nfproto);
        replies.extend([
            payload(NETWORK_HEADER, daddr, alen, reg_at(0)),
            lookup(&set.name, false),
            ct_state(),
            and_mask(&CT_ESTABLISHED_RELATED.to_ne_bytes()),
            cmp(Operator::NotEqual, &[0; 4]),
            verdict(Jump::Accept),
        ]);
        let mut from_pod = is_family(nfproto);
        from_pod.extend([
            payload(NETWORK_HEADER, saddr, alen, reg_at(0)),
            lookup(&set.name, false),
            verdict(Jump::Accept),
        ]);
        forward.extend([replies, from_pod]);
    }
    vec![
        chain("fw-isolation", None, isolation),
        chain(
            "fw-forward",
            Some(BaseHook {
                kind: "filter",
                hook: InetHookNumber::Forward,
                priority: 0,
            }),
            forward,
        ),
    ]
}

// ------------------------------------------------------------------ helpers

fn chain(name: &str, hook: Option<BaseHook>, rules: Vec<Vec<Expr>>) -> Chain {
    Chain {
        name: name.to_string(),
        hook,
        rules,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall::sets::{concat_len, concat_type};

    #[test]
    fn concat_types_match_nft() {
        // Values read back from `nft --debug=mnl` for the same declarations.
        assert_eq!(concat_type(PM4_IP.key), 0x730d);
        assert_eq!(concat_type(PM4_IP.data), 0x1cd);
        assert_eq!(concat_len(PM4_IP.key), 12);
    }

    #[test]
    fn keys_are_register_padded() {
        let k = key(&[
            Value::Ip("10.0.0.2".parse().unwrap()),
            Value::Proto(6),
            Value::Port(80),
        ]);
        assert_eq!(k, vec![10, 0, 0, 2, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(key(&[Value::Ifname("veth1")]).len(), 16);
        assert_eq!(key(&[Value::Ether([1; 6])]).len(), 8);
    }
}
