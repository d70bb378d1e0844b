//! How a pod's packets reach its network's masquerade chain: per network a
//! plain set of its pods' addresses, and one rule in the base chain that
//! sends the set's members to the network's chain (`ip saddr @masq4-<id>
//! goto masq-<id>`). A pod is one element of its network's set.
//!
//! Why not one verdict map keyed by every pod's address (the layout before):
//! adding an element that jumps to a chain makes the kernel validate the
//! whole table at commit, walking every element of every verdict map
//! (`nft_lookup_validate` → `nft_setelem_validate`), so each ADD cost time
//! in proportion to the pods on the node. An element of a plain set needs no
//! validation. The base chain holds one rule per network (per set of
//! subnets, per family): a packet makes as many hash lookups as there are
//! networks with masquerade, which are few.
//!
//! The sets, chains and rules are made by a network's first pod, in the
//! batch that adds it, and go when its last pod goes ([`retire_if_unused`]):
//! networks come and go (Podman makes one per `podman network create`), and
//! a rule left for each would stay in every packet's path until reboot.

use super::expr::{
    and_mask, cmp, ct_status, lookup, masq, payload, reg_at, verdict, Expr, Jump, IPS_DST_NAT,
    NETWORK_HEADER, NFPROTO_IPV4, NFPROTO_IPV6,
};
use super::matches::{addr_layout, family_of, is_family, prefix_match, Side};
use super::nft::Element;
use super::schema::{ensure_chain, key, Chain, Value, INET, MASQ_BASE, PM_MASQ_ALL, PM_MASQ_BASE};
use super::sets::{address_set, vmap, Field, SetDef};
use super::store::{owned, Nft, Tx};
use super::Result;
use ipamd::attachment::fnv1a;
use ipnet::IpNet;
use netlink_packet_netfilter::nftables::Operator;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One network's set of pod addresses, the chain its members go to, and the
/// base-chain rule that sends them there.
pub(crate) struct Dispatch {
    pub set: SetDef,
    pub chain: Chain,
    base: &'static str,
    rule: Vec<Expr>,
}

impl Dispatch {
    /// A pod's element: its address, tagged with its owner.
    pub(crate) fn element(&self, addr: IpAddr, owner: &str) -> Element {
        owned(key(&[Value::Ip(addr)]), None, owner)
    }
}

/// Adds the set, its chain and its rule to `tx` unless the set exists. They
/// are made in one batch, so finding the set means the rest is there.
pub(crate) fn ensure(nft: &mut Nft, tx: &mut Tx, d: &Dispatch) -> Result<()> {
    if tx.creates_set(&d.set.name) || nft.set_exists(INET, &d.set.name)? {
        return Ok(());
    }
    tx.new_set(INET, &d.set);
    ensure_chain(nft, tx, INET, &d.chain)?;
    tx.new_rule(INET, d.base, d.rule.clone());
    Ok(())
}

/// What of `d` the ruleset lacks, against what [`ensure`] makes: CHECK names
/// the first gap ([`missing`]), a repair fills each ([`ensure_whole`]).
/// Someone's `nft flush ruleset` or a deleted table takes them all; a
/// flushed chain keeps its name but no longer masquerades, hence the count of
/// its rules.
struct Gaps {
    set: bool,
    chain: bool,
    /// The chain's number of rules, when it is not the number it is made with.
    chain_rules: Option<usize>,
    base: bool,
    /// No rule of the base chain sends the set's members to the chain.
    rule: bool,
}

fn gaps(nft: &mut Nft, d: &Dispatch) -> Result<Gaps> {
    let (set, chain) = (&d.set.name, &d.chain.name);
    let chain_gone = !nft.chain_exists(INET, chain)?;
    let chain_rules = if chain_gone {
        None
    } else {
        Some(nft.rule_count(INET, chain)?).filter(|n| *n != d.chain.rules.len())
    };
    let base = !nft.chain_exists(INET, d.base)?;
    let sends = !base
        && nft
            .rule_refs(INET, d.base)?
            .iter()
            .any(|r| r.sets.iter().any(|s| s == set) && r.chains.iter().any(|c| c == chain));
    Ok(Gaps {
        set: !nft.set_exists(INET, set)?,
        chain: chain_gone,
        chain_rules,
        base,
        rule: !sends,
    })
}

/// A repair's [`ensure`]: the set, the chain with all its rules, and the
/// base-chain rule are each looked for and made when missing (someone may
/// have removed one and not the others). Called once per network, after the
/// skeleton (and so the base chain) was made whole.
pub(crate) fn ensure_whole(nft: &mut Nft, tx: &mut Tx, d: &Dispatch) -> Result<()> {
    if tx.creates_set(&d.set.name) {
        return Ok(());
    }
    let g = gaps(nft, d)?;
    if g.set {
        tx.new_set(INET, &d.set);
    }
    let chain = &d.chain;
    if !tx.creates_chain(INET, &chain.name) && (g.chain || g.chain_rules.is_some()) {
        if g.chain {
            tx.new_chain(INET, &chain.name, None);
        } else {
            tx.flush_chain(INET, &chain.name);
        }
        for rule in &chain.rules {
            tx.new_rule(INET, &chain.name, rule.clone());
        }
    }
    if g.rule {
        tx.new_rule(INET, d.base, d.rule.clone());
    }
    Ok(())
}

/// CHECK: what of `d` is not in the ruleset as [`ensure`] makes it (its
/// set, its chain with its rules, the base-chain rule that sends the set's
/// members to the chain), None when all is there.
pub(crate) fn missing(nft: &mut Nft, d: &Dispatch) -> Result<Option<String>> {
    let (set, chain) = (&d.set.name, &d.chain.name);
    let g = gaps(nft, d)?;
    let want = d.chain.rules.len();
    Ok(if g.set {
        Some(format!("set {set} of table inet cnikit is missing"))
    } else if g.chain {
        Some(format!("chain {chain} of table inet cnikit is missing"))
    } else if let Some(rules) = g.chain_rules {
        Some(format!(
            "chain {chain} has {rules} rules, not the {want} it is made with"
        ))
    } else if g.base {
        Some(format!("chain {} of table inet cnikit is missing", d.base))
    } else if g.rule {
        Some(format!(
            "the rule in {} that sends set {set} to chain {chain} is missing",
            d.base
        ))
    } else {
        None
    })
}

// ---- bridge ipMasq: masquerade container sources leaving their subnets

/// Masquerade for pods of a network with these `subnets`, of one family:
/// `ip saddr @masq4-<id> goto masq-<id>`.
pub(crate) fn ip_masq(v4: bool, subnets: &[IpNet]) -> Dispatch {
    let chain = masq_chain(v4, subnets);
    let set = address_set(chain.name.replacen("masq-", family("masq", v4), 1), v4);
    let rule = member_goes_to(v4, Side::Source, &set, &chain);
    Dispatch {
        set,
        chain,
        base: MASQ_BASE,
        rule,
    }
}

/// The chain of one family's `subnets` of a network: traffic to them (and
/// to multicast) stays unmasqueraded, the rest is masqueraded. Networks with
/// the same subnets share it.
pub(crate) fn masq_chain(v4: bool, subnets: &[IpNet]) -> Chain {
    let nfproto = nfproto(v4);
    let mut nets: Vec<IpNet> = subnets
        .iter()
        .filter(|n| n.addr().is_ipv4() == v4)
        .map(IpNet::trunc)
        .collect();
    nets.sort();
    nets.dedup();
    let mut rules: Vec<Vec<Expr>> = nets
        .iter()
        .map(|net| {
            let mut r = prefix_match(nfproto, Side::Destination, *net);
            r.push(verdict(Jump::Return));
            r
        })
        .collect();
    rules.push(multicast_return(nfproto));
    rules.push(vec![masq()]);
    let family = if v4 { "4" } else { "6" };
    let names: Vec<String> = nets.iter().map(IpNet::to_string).collect();
    let id = fnv1a(format!("{family} {}", names.join(" ")).as_bytes());
    chain(format!("masq-{id:016x}"), rules)
}

/// `ip daddr 224.0.0.0/4 return` / `ip6 daddr ff00::/8 return`.
fn multicast_return(nfproto: u8) -> Vec<Expr> {
    let multicast = if nfproto == NFPROTO_IPV4 {
        IpNet::new_assert(IpAddr::V4(Ipv4Addr::new(224, 0, 0, 0)), 4)
    } else {
        IpNet::new_assert(IpAddr::V6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0)), 8)
    };
    let mut r = prefix_match(nfproto, Side::Destination, multicast);
    r.push(verdict(Jump::Return));
    r
}

// ---- portmap: which DNATed connections to a pod are masqueraded

/// Every DNATed connection to these pods (masqAll): `ct status dnat ip daddr
/// @pm4-masq-all goto pm-masq-all`.
pub(crate) fn pm_masq_all(v4: bool) -> Dispatch {
    let set = address_set(format!("{}masq-all", family("pm", v4)), v4);
    let chain = chain(PM_MASQ_ALL.to_string(), vec![vec![masq()]]);
    pm_dispatch(v4, set, chain)
}

/// Hairpin and localhost connections to pods of `subnet`: `ct status dnat
/// ip daddr @pm4-hairpin-<id> goto pm-hairpin-<id>`.
pub(crate) fn pm_hairpin(subnet: IpNet) -> Dispatch {
    let v4 = subnet.addr().is_ipv4();
    let chain = hairpin_chain(subnet);
    let set = address_set(chain.name.replacen("pm-", family("pm", v4), 1), v4);
    pm_dispatch(v4, set, chain)
}

fn pm_dispatch(v4: bool, set: SetDef, chain: Chain) -> Dispatch {
    let mut rule = vec![
        ct_status(),
        and_mask(&IPS_DST_NAT.to_ne_bytes()),
        cmp(Operator::NotEqual, &[0; 4]),
    ];
    rule.extend(member_goes_to(v4, Side::Destination, &set, &chain));
    Dispatch {
        set,
        chain,
        base: PM_MASQ_BASE,
        rule,
    }
}

/// The chain masquerading DNATed connections to a container of `subnet` that
/// come from that subnet (hairpin) or, for IPv4, from localhost: without it
/// the reply would not come back through the host's NAT.
pub(crate) fn hairpin_chain(subnet: IpNet) -> Chain {
    let subnet = subnet.trunc();
    let nfproto = family_of(&subnet);
    let mut sources = vec![subnet];
    if subnet.addr().is_ipv4() {
        sources.push(LOOPBACK4);
    }
    let rules = sources
        .into_iter()
        .map(|src| {
            let mut r = prefix_match(nfproto, Side::Source, src);
            r.push(masq());
            r
        })
        .collect();
    chain(
        format!("pm-hairpin-{:016x}", fnv1a(subnet.to_string().as_bytes())),
        rules,
    )
}

/// Localhost sources (IPv6 has no counterpart: the kernel never routes ::1
/// off the loopback device, so [::1]:hostPort cannot reach a container).
const LOOPBACK4: IpNet = IpNet::new_assert(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8);

// ---- a network's last pod

/// Adds to `tx` the removal of `set` with its chain and its base-chain rule
/// when the set is one network's (not `pm4-masq-all`, which all share) and
/// holds no pod. Reading the set whole is for when the caller found the
/// network's last record gone, so it does not happen per pod. A pod added
/// meanwhile changes the ruleset's generation, and the plan is made again.
pub(crate) fn retire_if_unused(nft: &mut Nft, tx: &mut Tx, set: &SetDef) -> Result<()> {
    let Some((base, chain)) = retirable(&set.name) else {
        return Ok(());
    };
    if !nft.set_exists(INET, &set.name)? || !nft.dump(INET, set)?.is_empty() {
        return Ok(());
    }
    if let Some(handle) = nft.rule_looking_up(INET, base, &set.name)? {
        tx.delete_rule(INET, base, handle);
    }
    if nft.chain_exists(INET, &chain)? {
        tx.flush_chain(INET, &chain);
        tx.delete_chain(INET, &chain);
    }
    tx.delete_set(INET, &set.name);
    Ok(())
}

/// Whether `set` belongs to one network (its subnets'), by its name.
pub(crate) fn is_one_networks(set: &str) -> bool {
    retirable(set).is_some()
}

/// The base chain and the chain of a set that belongs to one network (its
/// subnets'), by the set's name; None for the others.
fn retirable(set: &str) -> Option<(&'static str, String)> {
    let (feature, rest) = set.split_once('-')?;
    let id = |id: &str| is_id(id).then(|| id.to_string());
    match feature {
        "masq4" | "masq6" => Some((MASQ_BASE, format!("masq-{}", id(rest)?))),
        "pm4" | "pm6" => {
            let id = id(rest.strip_prefix("hairpin-")?)?;
            Some((PM_MASQ_BASE, format!("pm-hairpin-{id}")))
        }
        _ => None,
    }
}

fn is_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

// ---- names in records

/// The verdict maps of the layout before (development builds of 0.2.0, never
/// a release): their elements are removed by key when their records name
/// them, and nothing is added to them any more.
static RETIRED: [SetDef; 4] = [
    vmap("masq4-via", &[Field::V4]),
    vmap("masq6-via", &[Field::V6]),
    vmap("pm4-masq-via", &[Field::V4]),
    vmap("pm6-masq-via", &[Field::V6]),
];

/// The set a record names, when it is one of the sets made here at run time
/// (or a retired one); None for any other name.
pub(crate) fn set_named(name: &str) -> Option<SetDef> {
    if let Some(set) = RETIRED.iter().find(|s| s.name == name) {
        return Some(set.clone());
    }
    let (v4, rest) = match name.split_once('-') {
        Some(("masq4" | "pm4", rest)) => (true, rest),
        Some(("masq6" | "pm6", rest)) => (false, rest),
        _ => return None,
    };
    let ours = if name.starts_with("masq") {
        is_id(rest)
    } else {
        rest == "masq-all" || rest.strip_prefix("hairpin-").is_some_and(is_id)
    };
    ours.then(|| address_set(name.to_string(), v4))
}

// ---- helpers

/// `meta nfproto ipv4 ip saddr|daddr @set goto chain` (`ip6` alike).
fn member_goes_to(v4: bool, side: Side, set: &SetDef, chain: &Chain) -> Vec<Expr> {
    let nfproto = nfproto(v4);
    let (alen, saddr, daddr) = addr_layout(nfproto);
    let at = match side {
        Side::Source => saddr,
        Side::Destination => daddr,
    };
    let mut rule = is_family(nfproto);
    rule.extend([
        payload(NETWORK_HEADER, at, alen, reg_at(0)),
        lookup(&set.name, false),
        verdict(Jump::Goto(&chain.name)),
    ]);
    rule
}

fn nfproto(v4: bool) -> u8 {
    if v4 {
        NFPROTO_IPV4
    } else {
        NFPROTO_IPV6
    }
}

/// `masq4-` / `pm6-`: a set name's feature and family.
fn family(feature: &str, v4: bool) -> &'static str {
    match (feature, v4) {
        ("masq", true) => "masq4-",
        ("masq", false) => "masq6-",
        (_, true) => "pm4-",
        (_, false) => "pm6-",
    }
}

fn chain(name: String, rules: Vec<Vec<Expr>>) -> Chain {
    Chain {
        name,
        hook: None,
        rules,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_names_follow_their_chains() {
        let net: IpNet = "10.1.0.0/16".parse().unwrap();
        let m = ip_masq(true, &[net]);
        assert_eq!(m.set.name, m.chain.name.replacen("masq-", "masq4-", 1));
        let h = pm_hairpin("fd00::/64".parse().unwrap());
        assert_eq!(h.set.name, h.chain.name.replacen("pm-", "pm6-", 1));
        assert_eq!(pm_masq_all(true).set.name, "pm4-masq-all");
        assert_eq!(pm_masq_all(false).chain.name, PM_MASQ_ALL);
    }

    #[test]
    fn a_networks_set_names_its_chain() {
        let m = ip_masq(false, &["fd00::/64".parse().unwrap()]);
        assert_eq!(retirable(&m.set.name), Some((MASQ_BASE, m.chain.name)));
        let h = pm_hairpin("10.0.0.0/8".parse().unwrap());
        assert_eq!(retirable(&h.set.name), Some((PM_MASQ_BASE, h.chain.name)));
        assert_eq!(retirable(&pm_masq_all(true).set.name), None);
    }

    #[test]
    fn records_name_only_sets_made_here() {
        for d in [
            ip_masq(false, &["fd00::/64".parse().unwrap()]),
            pm_hairpin("10.0.0.0/8".parse().unwrap()),
            pm_masq_all(false),
        ] {
            let set = set_named(&d.set.name).expect("resolved");
            assert_eq!(set.key, d.set.key);
            assert!(!set.verdict);
        }
        assert!(set_named("masq4-via").is_some_and(|s| s.verdict));
        assert!(retirable("masq4-via").is_none());
        for other in [
            "pm4-any",
            "masq4-xyz",
            "pm4-hairpin-",
            "masq-pods",
            "fw4-pods",
        ] {
            assert!(set_named(other).is_none(), "{other}");
        }
    }
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod kernel_tests;
