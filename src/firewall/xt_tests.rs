//! The iptables-nft rule form: what we write is what we read back, the
//! match infos have iptables' sizes and bits, and the expressions come in
//! iptables-nft's order.

use super::*;
use crate::netlink::nla;
use netlink_packet_core::Emitable;
use netlink_packet_netfilter::nftables::{ExpressionAttribute, ListAttribute};

/// A NEWRULE answer as the kernel sends one: nfgenmsg, handle, expressions.
fn answer(handle: u64, rule: &XtRule) -> Vec<u8> {
    let exprs: Vec<ListAttribute<ExpressionAttribute>> = rule.exprs();
    let mut list = vec![0u8; exprs.as_slice().buffer_len()];
    exprs.as_slice().emit(&mut list);
    let mut out = vec![2, 0, 0, 0];
    out.extend(nla(3, &handle.to_be_bytes()));
    out.extend(nla(4 | 0x8000, &list));
    out
}

#[test]
fn rules_read_back_as_written() {
    let rules = [
        XtRule {
            dst: Some("10.1.0.2".parse().unwrap()),
            established: true,
            ..XtRule::to(Target::Accept).comment("cnikit n/c/eth0")
        },
        XtRule {
            src: Some("fd00::2".parse().unwrap()),
            ..XtRule::to(Target::Accept)
        },
        XtRule {
            iif: Some(Iface {
                name: "br0".into(),
                negated: false,
            }),
            oif: Some(Iface {
                name: "br0".into(),
                negated: true,
            }),
            ..XtRule::to(Target::Jump("CNI-ISOLATION-STAGE-2".into())).comment("x")
        },
        XtRule::to(Target::Return),
        XtRule::to(Target::Drop),
    ];
    for (i, rule) in rules.iter().enumerate() {
        let got = parse_rule(&answer(i as u64 + 7, rule)).expect("parse");
        assert_eq!(got.handle, i as u64 + 7);
        assert_eq!(&got.rule, rule);
    }
}

#[test]
fn match_infos_have_iptables_sizes_and_bits() {
    let ct = conntrack_info();
    assert_eq!(ct.len(), 168);
    // match_flags = XT_CONNTRACK_STATE, state_mask = ESTABLISHED|RELATED.
    assert_eq!(&ct[146..148], &1u16.to_ne_bytes());
    assert_eq!(&ct[150..152], &6u16.to_ne_bytes());
    assert_eq!(ct.iter().filter(|b| **b != 0).count(), 2);
    let c = comment_info("hi");
    assert_eq!(c.len(), 256);
    assert_eq!(&c[..3], b"hi\0");
}

#[test]
fn expressions_come_in_iptables_order() {
    let rule = XtRule {
        iif: Some(Iface {
            name: "br0".into(),
            negated: false,
        }),
        dst: Some("10.0.0.1".parse().unwrap()),
        established: true,
        ..XtRule::to(Target::Accept).comment("c")
    };
    let names: Vec<String> = rule
        .exprs()
        .iter()
        .filter_map(|e| match e {
            ListAttribute::Element(attrs) => attrs.iter().find_map(|a| match a {
                ExpressionAttribute::Name(n) => Some(n.clone()),
                _ => None,
            }),
            _ => None,
        })
        .collect();
    assert_eq!(
        names,
        [
            "meta",
            "cmp",
            "payload",
            "cmp",
            "match",
            "match",
            "counter",
            "immediate"
        ]
    );
}

#[test]
fn unknown_expressions_make_a_rule_foreign() {
    let mut bytes = answer(1, &XtRule::to(Target::Accept));
    // A native `ct state` expression (what iptables-nft cannot read) at the end.
    let mut ct = nla(1, b"ct\0");
    ct.extend(nla(2 | 0x8000, &nla(2, &0u32.to_be_bytes())));
    let elem = nla(1 | 0x8000, &ct);
    let list_at = 4 + 12;
    let len = u16::from_ne_bytes([bytes[list_at], bytes[list_at + 1]]) as usize;
    bytes.extend(&elem);
    let new_len = (len + elem.len()) as u16;
    bytes[list_at..list_at + 2].copy_from_slice(&new_len.to_ne_bytes());
    let got = parse_rule(&bytes).unwrap();
    assert!(got.rule.foreign);
    assert_ne!(got.rule, XtRule::to(Target::Accept));
}
