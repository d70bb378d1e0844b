//! `ipMasq` as the interface plugins that route a pod's addresses do it
//! (bridge, ptp): masquerade what the attachment's addresses send outside
//! their own subnets, through the firewall backend. Every entry is tagged
//! with the attachment, so DEL and GC need no netns. Also ADD's check of
//! `ipMasqBackend`.

use crate::cni::{CniResult, Error, Request};
use crate::firewall::{masq, Del, Firewall, Gc};
use crate::plugins::firewall_backend::{FirewallBackend, FirewallConf};
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;

/// The masquerade keys of the plugins that route a pod's addresses (bridge, ptp).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MasqKeys {
    #[serde(default)]
    pub ip_masq: bool,
    /// `iptables` or `nftables` in the reference; cnikit masquerades with nftables.
    #[serde(default)]
    pub ip_masq_backend: Option<String>,
    /// Destinations never masqueraded besides the pod's own subnets (cnikit's; e.g. a
    /// cluster pool's CIDRs, so pod-to-pod traffic between nodes keeps its source).
    #[serde(default)]
    pub ip_masq_exclude: Vec<IpNet>,
}

impl MasqKeys {
    /// For a DEL whose configuration cannot be used: whatever masquerade entries the
    /// attachment may own go (a removal of nothing is harmless).
    pub fn del_fallback() -> MasqKeys {
        MasqKeys {
            ip_masq: true,
            ..MasqKeys::default()
        }
    }

    /// ADD's `ipMasqBackend`: the reference refuses an unknown one when it
    /// masquerades (ipMasq with addresses from IPAM), and only then. cnikit
    /// always masquerades with nftables; "iptables" is noted on stderr.
    pub fn check_backend(&self, plugin: &str, req: &Request) -> Result<(), Error> {
        if !self.ip_masq || req.conf.ipam_type.is_none() {
            return Ok(());
        }
        match self.ip_masq_backend.as_deref() {
            None | Some("nftables") => Ok(()),
            Some("iptables") => {
                eprintln!("{plugin}: ipMasqBackend \"iptables\" requested; cnikit always masquerades with nftables");
                Ok(())
            }
            Some(other) => Err(Error::invalid_config(format!(
                "unknown ipmasq backend {other:?}: ipMasqBackend must be \"iptables\" or \"nftables\""
            ))),
        }
    }
}

/// The addresses of `result`, and the destinations they reach unmasqueraded: the
/// subnets they belong to and the network's `ipMasqExclude` (e.g. a cluster pool's
/// CIDRs, whose other blocks are pods on other nodes).
fn keys(result: &CniResult, exclude: &[IpNet]) -> (Vec<IpAddr>, Vec<IpNet>) {
    let addrs = result.ips.iter().map(|ip| ip.address.addr()).collect();
    let own = result.ips.iter().map(|ip| ip.address.trunc());
    let subnets = own.chain(exclude.iter().map(IpNet::trunc)).collect();
    (addrs, subnets)
}

/// [`keys`] of the addresses of the pod's interface `ifname` only
/// ([`CniResult::ips_on`]): the result a chain hands CHECK may list other
/// plugins' interfaces too, whose addresses this plugin's ADD never saw.
fn pod_keys(prev: &CniResult, ifname: &str, exclude: &[IpNet]) -> (Vec<IpAddr>, Vec<IpNet>) {
    let (addrs, mut subnets): (Vec<IpAddr>, Vec<IpNet>) = prev
        .ips_on(ifname)
        .map(|ip| (ip.address.addr(), ip.address.trunc()))
        .unzip();
    subnets.extend(exclude.iter().map(IpNet::trunc));
    (addrs, subnets)
}

/// ADD: masquerade what `result`'s addresses send anywhere but to their
/// subnets (one atomic batch; nothing to do without addresses).
pub fn add(
    fw: &dyn Firewall,
    req: &Request,
    result: &CniResult,
    exclude: &[IpNet],
) -> Result<(), Error> {
    send(fw, req, keys(result, exclude), |att, addrs, subnets| {
        masq::Op::Add {
            att,
            addrs,
            subnets,
        }
    })
}

/// CHECK: what `add` made from `prev` (the ADD's result) is still there and
/// this attachment's; a mismatch names what is missing (CNI code 100, as
/// portmap's CHECK). Nothing to check without addresses: ADD made nothing.
pub fn check(
    fw: &dyn Firewall,
    req: &Request,
    prev: &CniResult,
    exclude: &[IpNet],
) -> Result<(), Error> {
    send(
        fw,
        req,
        pod_keys(prev, req.ifname(), exclude),
        |att, addrs, subnets| masq::Op::Check {
            att,
            addrs,
            subnets,
        },
    )
}

/// CHECK's last step of bridge and ptp: when the network masquerades (`keys`), what ADD
/// made is there, through the firewall `backend` picks for this call.
pub fn check_if_on(
    backend: &FirewallBackend,
    (req, conf): (&Request, &impl FirewallConf),
    keys: &MasqKeys,
    prev: &CniResult,
) -> Result<(), Error> {
    if !keys.ip_masq {
        return Ok(());
    }
    let fw = backend.for_call(req, conf);
    check(&*fw, req, prev, &keys.ip_masq_exclude)
}

/// The operation `op` makes of the attachment and its addresses and subnets;
/// none without addresses.
fn send(
    fw: &dyn Firewall,
    req: &Request,
    (addrs, subnets): (Vec<IpAddr>, Vec<IpNet>),
    op: impl FnOnce(crate::firewall::Attachment, Vec<IpAddr>, Vec<IpNet>) -> masq::Op,
) -> Result<(), Error> {
    if addrs.is_empty() {
        return Ok(());
    }
    fw.apply(op(req.attachment(), addrs, subnets).into())?;
    Ok(())
}

/// Takes back what `add` put in, when a later step of ADD failed (by tag;
/// a failure here is the caller's to ignore).
pub fn undo(fw: &dyn Firewall, req: &Request) -> Result<(), Error> {
    let att = req.attachment();
    fw.apply(masq::Op::Del(Del { att }).into())?;
    Ok(())
}

/// DEL: with a prevResult that has addresses, by the keys ADD made from
/// them (the cost does not grow with the pods on the node); without one, by
/// tag, which also works when the netns (and the veth with it) is gone.
pub fn del(fw: &dyn Firewall, req: &Request, exclude: &[IpNet]) -> Result<(), Error> {
    let att = req.attachment();
    let prev = req.conf.prev_result.as_ref().filter(|p| !p.ips.is_empty());
    let op = match prev {
        Some(prev) => {
            let (addrs, subnets) = keys(prev, exclude);
            masq::Op::DelKeys {
                att,
                addrs,
                subnets,
            }
        }
        None => masq::Op::Del(Del { att }),
    };
    fw.apply(op.into())?;
    Ok(())
}

/// GC: the entries of the network's attachments not in `gc.valid`, whatever
/// the configuration says now.
pub fn gc(fw: &dyn Firewall, gc: Gc) -> Result<(), Error> {
    fw.apply(masq::Op::Gc(gc).into())?;
    Ok(())
}

/// GC's request for this network, None when the runtime sent no valid list.
pub fn gc_request(req: &Request) -> Result<Option<Gc>, Error> {
    Ok(req.conf.valid_attachments()?.map(|valid| Gc {
        network: req.conf.name.clone(),
        valid,
    }))
}
