//! The firewall plugin's rules inside the host's iptables-nft tables
//! (`ip filter` / `ip6 filter`), where a FORWARD chain with policy drop can
//! only be overridden: an accept in a table of our own ends only our chain,
//! and iptables' chain still drops the packet.
//!
//! The layout is the reference plugin's, so either plugin finds the other's
//! chains and `iptables -S` shows what it always showed:
//!
//! ```text
//! -A FORWARD -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)" -j CNI-ISOLATION-STAGE-1
//! -A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
//! -A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN
//! -A CNI-FORWARD -d 10.88.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment "cnikit net/ctr/eth0" -j ACCEPT
//! -A CNI-FORWARD -s 10.88.0.2/32 -m comment --comment "cnikit net/ctr/eth0" -j ACCEPT
//! -A CNI-ISOLATION-STAGE-1 -i br0 ! -o br0 -m comment --comment "… (ingressPolicy: same-bridge)" -j CNI-ISOLATION-STAGE-2
//! -A CNI-ISOLATION-STAGE-1 -m comment --comment "…" -j RETURN
//! -A CNI-ISOLATION-STAGE-2 -o br0 -m comment --comment "…" -j DROP
//! -A CNI-ISOLATION-STAGE-2 -m comment --comment "…" -j RETURN
//! ```
//!
//! The one addition: each pod's rules carry a comment naming their
//! attachment, so DEL and GC remove exactly them, with no prevResult.

use super::nft::Table;
use super::rules::At;
use super::store::{Nft, Tx};
use super::xt::{Dumped, Iface, Target, XtRule};
use super::Result;
use netlink_packet_netfilter::NetfilterProtoFamily;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

pub(crate) const FORWARD: &str = "FORWARD";
pub(crate) const PRIV_CHAIN: &str = "CNI-FORWARD";
/// The admin chain when `iptablesAdminChainName` names none.
pub const DEFAULT_ADMIN_CHAIN: &str = "CNI-ADMIN";
const STAGE1: &str = "CNI-ISOLATION-STAGE-1";
const STAGE2: &str = "CNI-ISOLATION-STAGE-2";
const JUMP_COMMENT: &str = "CNI firewall plugin rules";
const ADMIN_COMMENT: &str = "CNI firewall plugin admin overrides";
const ISO_COMMENT: &str = "CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)";
/// What the comments of our per-pod rules start with (then the tag).
pub(crate) const OWNER_PREFIX: &str = "cnikit ";

/// `ingressPolicy` `same-bridge` (or `isolated`) for one bridge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    pub bridge: String,
    /// `isolated`: pods on the bridge cannot even reach each other.
    pub isolated: bool,
}

/// The host's iptables filter table of a family.
pub(crate) fn filter(v6: bool) -> Table {
    Table {
        family: if v6 {
            NetfilterProtoFamily::IPv6
        } else {
            NetfilterProtoFamily::IPv4
        },
        name: "filter",
    }
}

/// Whether the host's iptables has a FORWARD chain for the family: then a
/// drop policy there can only be overridden there.
pub(crate) fn present(nft: &mut Nft, v6: bool) -> Result<bool> {
    nft.chain_exists(filter(v6), FORWARD)
}

/// The two rules of one pod address: replies to it, and all it sends.
fn pod_rules(ip: IpAddr, owner: &str) -> [XtRule; 2] {
    let comment = format!("{OWNER_PREFIX}{owner}");
    [
        XtRule {
            dst: Some(ip),
            established: true,
            ..XtRule::to(Target::Accept).comment(&comment)
        },
        XtRule {
            src: Some(ip),
            ..XtRule::to(Target::Accept).comment(&comment)
        },
    ]
}

fn jump(chain: &str, comment: &str) -> XtRule {
    XtRule::to(Target::Jump(chain.into())).comment(comment)
}

fn find<'a>(rules: &'a [Dumped], want: &XtRule) -> Option<&'a Dumped> {
    rules.iter().find(|d| d.rule == *want)
}

/// ADD in family `v6`'s filter table: chains and jumps as needed, then
/// exactly `addrs`' rules for `owner` (others of its are removed).
pub(crate) fn add(
    nft: &mut Nft,
    tx: &mut Tx,
    v6: bool,
    admin: &str,
    owner: &str,
    addrs: &[IpAddr],
    iso: Option<&Isolation>,
) -> Result<()> {
    let t = filter(v6);
    ensure_chains(nft, tx, t, &[PRIV_CHAIN, admin])?;
    let forward = nft.rules(t, FORWARD)?;
    let to_stage1 = jump(STAGE1, ISO_COMMENT);
    if missing(tx, (t, FORWARD, &forward), &jump(PRIV_CHAIN, JUMP_COMMENT)) {
        // Behind the isolation jump, whose drops must come first.
        let at = find(&forward, &to_stage1).map_or(At::Top, |d| At::After(d.handle));
        tx.add_xt_rule(t, FORWARD, &jump(PRIV_CHAIN, JUMP_COMMENT), at);
    }
    if let Some(iso) = iso {
        ensure_chains(nft, tx, t, &[STAGE1, STAGE2])?;
        if missing(tx, (t, FORWARD, &forward), &to_stage1) {
            tx.add_xt_rule(t, FORWARD, &to_stage1, At::Top);
        }
        isolate(nft, tx, t, iso)?;
    }
    let private = nft.rules(t, PRIV_CHAIN)?;
    let admin_jump = jump(admin, ADMIN_COMMENT);
    if missing(tx, (t, PRIV_CHAIN, &private), &admin_jump) {
        tx.add_xt_rule(t, PRIV_CHAIN, &admin_jump, At::Top);
    }
    let want: Vec<XtRule> = addrs
        .iter()
        .filter(|ip| ip.is_ipv6() == v6)
        .flat_map(|ip| pod_rules(*ip, owner))
        .collect();
    for have in private.iter().filter(|d| owned_by(d, owner)) {
        if !want.contains(&have.rule) {
            tx.delete_rule(t, PRIV_CHAIN, have.handle);
        }
    }
    for rule in want.iter().filter(|w| find(&private, w).is_none()) {
        tx.add_xt_rule(t, PRIV_CHAIN, rule, At::End);
    }
    Ok(())
}

fn ensure_chains(nft: &mut Nft, tx: &mut Tx, t: Table, chains: &[&str]) -> Result<()> {
    for chain in chains {
        if !tx.creates_chain(t, chain) && !nft.chain_exists(t, chain)? {
            tx.new_chain(t, chain, None);
        }
    }
    Ok(())
}

/// The reference's isolation rules for one bridge, each added if missing.
fn isolate(nft: &mut Nft, tx: &mut Tx, t: Table, iso: &Isolation) -> Result<()> {
    let policy = if iso.isolated {
        "isolated"
    } else {
        "same-bridge"
    };
    let policy_comment = format!("CNI firewall plugin rules (ingressPolicy: {policy})");
    let iface = |negated| {
        Some(Iface {
            name: iso.bridge.clone(),
            negated,
        })
    };
    let stage1 = nft.rules(t, STAGE1)?;
    // Both go to the top; the drop (added second) ends up first, as in the reference.
    let leave = XtRule {
        iif: iface(false),
        oif: iface(true),
        ..jump(STAGE2, &policy_comment)
    };
    let stay = XtRule {
        iif: iface(false),
        oif: iface(false),
        ..XtRule::to(Target::Drop).comment(&policy_comment)
    };
    let mut top = vec![leave];
    if iso.isolated {
        top.push(stay);
    }
    for rule in top
        .iter()
        .filter(|r| missing(tx, (t, STAGE1, &stage1), r))
        .collect::<Vec<_>>()
    {
        tx.add_xt_rule(t, STAGE1, rule, At::Top);
    }
    let back = XtRule::to(Target::Return).comment(ISO_COMMENT);
    if missing(tx, (t, STAGE1, &stage1), &back) {
        tx.add_xt_rule(t, STAGE1, &back, At::End);
    }
    let stage2 = nft.rules(t, STAGE2)?;
    let drop = XtRule {
        oif: iface(false),
        ..XtRule::to(Target::Drop).comment(ISO_COMMENT)
    };
    if missing(tx, (t, STAGE2, &stage2), &drop) {
        tx.add_xt_rule(t, STAGE2, &drop, At::Top);
    }
    if missing(tx, (t, STAGE2, &stage2), &back) {
        tx.add_xt_rule(t, STAGE2, &back, At::End);
    }
    Ok(())
}

/// Neither in the chain (its rules as read) nor added by `tx` already (a
/// repair plans many attachments' rules into one batch).
fn missing(tx: &Tx, (t, chain, rules): (Table, &str, &[Dumped]), rule: &XtRule) -> bool {
    find(rules, rule).is_none() && !tx.adds_xt_rule(t, chain, rule)
}

fn owned_by(d: &Dumped, owner: &str) -> bool {
    owner_of(d).is_some_and(|o| o == owner)
}

/// The attachment tag in a per-pod rule's comment.
fn owner_of(d: &Dumped) -> Option<&str> {
    d.rule.comment.as_deref()?.strip_prefix(OWNER_PREFIX)
}

/// DEL / GC: the per-pod rules (both families) whose owner `doomed` picks,
/// and the reference's untagged rules of `addrs` (DEL with a prevResult:
/// a pod the reference plugin added before the node switched to cnikit).
pub(crate) fn release(
    nft: &mut Nft,
    tx: &mut Tx,
    doomed: &dyn Fn(&str) -> bool,
    addrs: &[IpAddr],
) -> Result<()> {
    for v6 in [false, true] {
        let t = filter(v6);
        let untagged: Vec<XtRule> = addrs
            .iter()
            .filter(|ip| ip.is_ipv6() == v6)
            .flat_map(|ip| pod_rules(*ip, ""))
            .map(|r| XtRule { comment: None, ..r })
            .collect();
        for d in nft.rules(t, PRIV_CHAIN)? {
            if owner_of(&d).is_some_and(doomed) || untagged.contains(&d.rule) {
                tx.delete_rule(t, PRIV_CHAIN, d.handle);
            }
        }
    }
    Ok(())
}

/// GC: the isolation rules of bridges `gone` says no longer exist.
pub(crate) fn forget_bridges(
    nft: &mut Nft,
    tx: &mut Tx,
    gone: &mut dyn FnMut(&str) -> bool,
) -> Result<()> {
    for v6 in [false, true] {
        let t = filter(v6);
        for chain in [STAGE1, STAGE2] {
            for d in nft.rules(t, chain)? {
                let names = [&d.rule.iif, &d.rule.oif];
                let bridge = names
                    .iter()
                    .find_map(|i| i.as_ref().map(|i| i.name.clone()));
                let ours = d
                    .rule
                    .comment
                    .as_deref()
                    .is_some_and(|c| c.starts_with(JUMP_COMMENT));
                if ours && bridge.is_some_and(|b| gone(&b)) {
                    tx.delete_rule(t, chain, d.handle);
                }
            }
        }
    }
    Ok(())
}

/// CHECK in family `v6`'s filter table: what ADD made is all there.
pub(crate) fn check(
    nft: &mut Nft,
    v6: bool,
    admin: &str,
    owner: &str,
    addrs: &[IpAddr],
    iso: Option<&Isolation>,
) -> std::result::Result<(), String> {
    let t = filter(v6);
    let read = |nft: &mut Nft, chain: &str| nft.rules(t, chain).map_err(|e| e.message);
    let family = if v6 { "ip6" } else { "ip" };
    let missing = |chain: &str, what: &str| format!("{family} filter {chain} lacks {what}");
    let forward = read(nft, FORWARD)?;
    if find(&forward, &jump(PRIV_CHAIN, JUMP_COMMENT)).is_none() {
        return Err(missing(FORWARD, &format!("the jump to {PRIV_CHAIN}")));
    }
    if iso.is_some() && find(&forward, &jump(STAGE1, ISO_COMMENT)).is_none() {
        return Err(missing(FORWARD, &format!("the jump to {STAGE1}")));
    }
    let private = read(nft, PRIV_CHAIN)?;
    if find(&private, &jump(admin, ADMIN_COMMENT)).is_none() {
        return Err(missing(PRIV_CHAIN, &format!("the jump to {admin}")));
    }
    for ip in addrs.iter().filter(|ip| ip.is_ipv6() == v6) {
        if pod_rules(*ip, owner)
            .iter()
            .any(|r| find(&private, r).is_none())
        {
            return Err(missing(PRIV_CHAIN, &format!("the rules of {ip}")));
        }
    }
    if let Some(iso) = iso {
        let stage2 = read(nft, STAGE2)?;
        let bridge_drop = stage2.iter().any(|d| {
            d.rule.target == Some(Target::Drop)
                && d.rule
                    .oif
                    .as_ref()
                    .is_some_and(|o| o.name == iso.bridge && !o.negated)
        });
        if !bridge_drop {
            return Err(missing(STAGE2, &format!("the drop towards {}", iso.bridge)));
        }
    }
    Ok(())
}
