//! Port mappings: host port → container DNAT elements, plus the masquerade
//! elements hairpin and localhost connections need so replies come back
//! through the host.

use super::cleanup::{release_recorded, release_stale, Del, Gc};
use super::dispatch::{self, Dispatch};
use super::index;
use super::legacy::upgrade_portmap;
use super::schema::{self, key, Value, INET, PM4_ANY, PM4_IP, PM6_ANY, PM6_IP, PM_CHAINS};
use super::store::{claim_anchor, claim_exclusive, owned, owner_of, read, transact, Nft, Tx};
use super::tag::{self, Attachment};
use super::unmapped;
use super::{Error, ErrorKind, Result, Sockets};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Sctp => 132,
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        })
    }
}

/// One `runtimeConfig.portMappings` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    /// None: every local address of the container's families.
    pub host_ip: Option<IpAddr>,
    pub host_port: u16,
    pub proto: Proto,
    pub container_port: u16,
}

/// Which DNATed connections to a container get masqueraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Masquerade {
    /// Hairpin (from the container's own subnet) and localhost connections.
    pub snat: bool,
    /// All of them.
    pub masq_all: bool,
}

/// One attachment's port mappings to its container addresses, as ADD sets
/// them up and CHECK verifies them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    #[serde(with = "tag::snake")]
    pub att: Attachment,
    pub container: Vec<IpNet>,
    pub mappings: Vec<Mapping>,
    pub masq: Masquerade,
}

/// The operations on port mappings. Each is idempotent: an ADD of our own
/// mapping again is fine, DEL and GC delete by tag, CHECK only reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum Op {
    /// ADD: map `mappings` to the container's addresses (at most one per
    /// family, with their prefix). A host port another attachment holds is
    /// an error and nothing is changed; our own mapping again is fine.
    #[serde(rename = "portmap-add")]
    Add(Spec),
    /// CHECK: the chains exist and every mapping (and masquerade anchor) is
    /// present, ours, and points at the container.
    #[serde(rename = "portmap-check")]
    Check(Spec),
    /// DEL: every entry tagged with this attachment, whatever it mapped.
    #[serde(rename = "portmap-del")]
    Del(Del),
    /// DEL of what an ADD of this spec made (the runtime passed the mappings
    /// and prevResult again), looked up by key instead of reading the sets.
    #[serde(rename = "portmap-del-keys")]
    DelKeys(Spec),
    #[serde(rename = "portmap-gc")]
    Gc(Gc),
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Add(_) => "portmap-add",
            Op::Check(_) => "portmap-check",
            Op::Del(_) => "portmap-del",
            Op::DelKeys(_) => "portmap-del-keys",
            Op::Gc(_) => "portmap-gc",
        }
    }

    /// The operation, in this process.
    pub fn run(&self, sockets: &Sockets) -> Result<()> {
        upgrade_portmap(sockets)?;
        match self {
            Op::Add(spec) => add_here(sockets, spec, self),
            Op::Check(spec) => check_here(sockets, spec),
            Op::Del(del) => unmapped::releasing(sockets, &[(del.att.tag(), Vec::new())], || {
                del.run(sockets, &schema::PORTMAP)
            }),
            Op::DelKeys(spec) => {
                let owner = spec.att.tag();
                let known = keys_of(spec, &owner);
                unmapped::releasing(sockets, &[(owner, known)], || del_keys_here(sockets, spec))
            }
            Op::Gc(gc) => unmapped::releasing(sockets, &unmapped::gc_owners(gc), || {
                gc.run(sockets, &schema::PORTMAP)
            }),
        }
    }
}

fn add_here(sockets: &Sockets, spec: &Spec, op: &Op) -> Result<()> {
    let owner = spec.att.tag();
    let plan = Planned::of(spec, &owner);
    index::recording(&schema::PORTMAP, &owner, (&plan.keys, op), |earlier| {
        transact(sockets, |nft, tx| plan.apply(nft, tx, earlier, &owner))
    })
}

/// ADD's changes for `spec` into `tx`, as a repair replays them: nothing
/// earlier to release.
pub(super) fn replay(nft: &mut Nft, tx: &mut Tx, spec: &Spec) -> Result<()> {
    let owner = spec.att.tag();
    Planned::of(spec, &owner).apply(nft, tx, &Vec::new(), &owner)
}

/// What an ADD makes: its DNAT elements and masquerade elements, and their
/// keys, exactly (its DEL looks up nothing else).
struct Planned {
    dnats: Vec<Dnat>,
    masqs: Vec<(Dispatch, super::nft::Element)>,
    keys: index::Keys,
}

impl Planned {
    fn of(spec: &Spec, owner: &str) -> Planned {
        let dnats = dnat_elements(&spec.container, &spec.mappings, owner);
        let masqs: Vec<_> = spec
            .container
            .iter()
            .filter_map(|addr| masq_element(*addr, spec.masq, owner))
            .collect();
        let keys = dnats
            .iter()
            .map(|d| (d.set.clone(), d.elem.key.clone()))
            .chain(masqs.iter().map(|(d, e)| (d.set.clone(), e.key.clone())))
            .collect();
        Planned { dnats, masqs, keys }
    }

    /// Into `tx`; `earlier`: the keys an earlier ADD of `owner` recorded.
    fn apply(&self, nft: &mut Nft, tx: &mut Tx, earlier: &index::Keys, owner: &str) -> Result<()> {
        schema::ensure(nft, tx, &schema::PORTMAP)?;
        release_stale(nft, tx, INET, (earlier, &self.keys), owner)?;
        for d in &self.dnats {
            claim_exclusive(nft, tx, INET, d.set, d.elem.clone(), &d.what)?;
        }
        for (d, elem) in &self.masqs {
            dispatch::ensure(nft, tx, d)?;
            claim_anchor(nft, tx, INET, (&d.set, elem.clone()))?;
        }
        Ok(())
    }
}

/// The network structures an ADD of `spec` uses.
pub(super) fn dispatches(spec: &Spec) -> Vec<Dispatch> {
    let owner = spec.att.tag();
    spec.container
        .iter()
        .filter_map(|addr| masq_element(*addr, spec.masq, &owner))
        .map(|(d, _)| d)
        .collect()
}

fn del_keys_here(sockets: &Sockets, spec: &Spec) -> Result<()> {
    let owner = spec.att.tag();
    release_recorded(sockets, &schema::PORTMAP, &owner, keys_of(spec, &owner))
}

/// For DEL with the mappings and prevResult again: the keys of what an ADD
/// of `spec` made, its DNAT elements, and the container addresses'
/// masquerade elements whichever masquerade the ADD had (the configuration
/// may have changed since: both sets the address could be in).
fn keys_of(spec: &Spec, owner: &str) -> index::Keys {
    let mut keys: Vec<_> = dnat_elements(&spec.container, &spec.mappings, owner)
        .into_iter()
        .map(|d| (d.set.clone(), d.elem.key))
        .collect();
    for net in &spec.container {
        let addr = net.addr();
        for d in [
            dispatch::pm_masq_all(addr.is_ipv4()),
            dispatch::pm_hairpin(*net),
        ] {
            let elem = d.element(addr, owner);
            keys.push((d.set, elem.key));
        }
    }
    keys
}

fn check_here(sockets: &Sockets, spec: &Spec) -> Result<()> {
    let owner = spec.att.tag();
    read(sockets, |nft| {
        for chain in PM_CHAINS {
            if !nft.chain_exists(INET, chain)? {
                return Err(mismatch(format!(
                    "chain {chain} of table inet cnikit is missing"
                )));
            }
        }
        for d in dnat_elements(&spec.container, &spec.mappings, &owner) {
            let have = nft.get(INET, d.set, &d.elem.key)?;
            expect_ours(have.as_ref(), &owner, &d.what)?;
            if have.and_then(|h| h.data) != d.elem.data {
                return Err(mismatch(format!(
                    "{} does not point to {}",
                    d.what, d.target
                )));
            }
        }
        for addr in &spec.container {
            if let Some((d, want)) = masq_element(*addr, spec.masq, &owner) {
                // The set is the configured masquerade's: an element in
                // another one is missing from this one.
                let what = format!("masquerade entry for {} (set {})", addr.addr(), d.set.name);
                let have = nft.get(INET, &d.set, &want.key)?;
                expect_ours(have.as_ref(), &owner, &what)?;
            }
        }
        Ok(())
    })
}

struct Dnat {
    set: &'static schema::SetDef,
    elem: super::nft::Element,
    what: String,
    target: String,
}

/// One map element per mapping and container family it applies to: a
/// mapping with a hostIP only applies to that address's family.
fn dnat_elements(container: &[IpNet], mappings: &[Mapping], owner: &str) -> Vec<Dnat> {
    let mut out = Vec::new();
    for m in mappings {
        for net in container {
            let addr = net.addr();
            let host_ip = m.host_ip.filter(|ip| !ip.is_unspecified());
            if m.host_ip.is_some_and(|ip| ip.is_ipv4() != addr.is_ipv4()) {
                continue;
            }
            let set = match (addr.is_ipv4(), host_ip.is_some()) {
                (true, false) => &PM4_ANY,
                (true, true) => &PM4_IP,
                (false, false) => &PM6_ANY,
                (false, true) => &PM6_IP,
            };
            let mut k: Vec<Value> = host_ip.map(Value::Ip).into_iter().collect();
            k.extend([Value::Proto(m.proto.number()), Value::Port(m.host_port)]);
            let data = key(&[Value::Ip(addr), Value::Port(m.container_port)]);
            out.push(Dnat {
                set,
                elem: owned(key(&k), Some(data), owner),
                what: describe(m, host_ip, addr),
                target: target(addr, m.container_port),
            });
        }
    }
    out
}

fn describe(m: &Mapping, host_ip: Option<IpAddr>, addr: IpAddr) -> String {
    let on = match host_ip {
        Some(ip) => format!(" on {ip}"),
        None if addr.is_ipv4() => " (all IPv4 host addresses)".to_string(),
        None => " (all IPv6 host addresses)".to_string(),
    };
    format!("host port {}/{}{on}", m.proto, m.host_port)
}

fn target(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// The container address's element in the set of pods whose DNATed
/// connections are masqueraded: every one with masqAll, else (snat) its
/// subnet's hairpin set (connections from the subnet and from localhost).
fn masq_element(net: IpNet, m: Masquerade, owner: &str) -> Option<(Dispatch, super::nft::Element)> {
    let d = if m.masq_all {
        dispatch::pm_masq_all(net.addr().is_ipv4())
    } else if m.snat {
        dispatch::pm_hairpin(net)
    } else {
        return None;
    };
    let elem = d.element(net.addr(), owner);
    Some((d, elem))
}

/// CHECK: present and ours.
fn expect_ours(have: Option<&super::nft::Element>, owner: &str, what: &str) -> Result<()> {
    match have.map(owner_of) {
        None => Err(mismatch(format!("{what} is missing"))),
        Some(Some(o)) if o == owner => Ok(()),
        Some(o) => Err(mismatch(format!(
            "{what} belongs to {}",
            o.map_or("an entry cnikit did not tag".into(), |o| tag::describe(&o))
        ))),
    }
}

fn mismatch(msg: String) -> Error {
    Error::new(ErrorKind::Mismatch, format!("CHECK: {msg}"))
}
