//! bandwidth: rate limits on a pod's traffic, chained after an interface
//! plugin. Where the pod's interface is a veth whose host end the prevResult
//! lists (bridge, ptp), the host end is shaped as the reference shapes it;
//! every other interface (macvlan, ipvlan, vlan, host-device, tap, dummy)
//! has no host end, and is shaped from inside the pod's netns. Both are the
//! same steps on a different link (`site.rs`); the tc side is in
//! `netlink::tc`.

mod conf;
mod site;

use crate::cni::{CniResult, Error, Plugin, Request};
use crate::netlink::{IpvlanMode, Link, NetNs, Netlink};
use crate::plugins::link_owner;
use crate::plugins::pod_netns::{is_own_netns, netns_for_del, open_netns};
use conf::Shaping;
use site::{delete_link, host_ifb_name, pod_ifb_name, release_ifb, Layout, Site, PLUGIN};

pub struct Bandwidth;

impl Plugin for Bandwidth {
    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let shaping = Shaping::load(req)?;
        let prev = req.conf.prev_result.clone();
        if shaping.is_empty() {
            return Ok(prev.unwrap_or_default());
        }
        let mut result = prev.ok_or_else(|| {
            Error::invalid_config(
                "bandwidth must be chained after an interface plugin: no prevResult",
            )
        })?;
        let ns = open_netns(req.netns())?;
        let mut site = existing_site(&ns, req, &result)?;
        refuse_unshapeable_ingress(&site, shaping)?;
        if let Some(ifb) = site.shape(req, shaping)? {
            result.interfaces.push(ifb);
        }
        Ok(result)
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let shaping = Shaping::load(req)?;
        let prev = req
            .conf
            .prev_result
            .as_ref()
            .ok_or_else(|| Error::invalid_config("CHECK needs prevResult"))?;
        let ns = open_netns(req.netns())?;
        existing_site(&ns, req, prev)?.expect(shaping)
    }

    // ---------------------------------------------------------------- DEL
    /// The site's ifb and qdiscs while the pod's interface exists. Unless
    /// that site was the host veth, also the host ifb of the reference's
    /// name, found by name alone: with the netns gone it is all a veth
    /// layout leaves (and it also removes one the reference made), while a
    /// pod shaped inside its netns needs nothing then: it went with the netns.
    fn del(&self, req: &Request) -> Result<(), Error> {
        let shaping = req.conf_or_del_fallback(Shaping::load, Shaping::everything)?;
        let att = req.attachment();
        let mut steps = Vec::new();
        let host_ifb_done = match site_for_del(req) {
            Ok(Some(mut site)) => {
                steps.push(site.unshape(&att, shaping));
                site.layout == Layout::HostVeth
            }
            Ok(None) => false,
            Err(e) => {
                steps.push(Err(e));
                false
            }
        };
        if !host_ifb_done {
            let released = Netlink::open()
                .map_err(Error::from)
                .and_then(|mut host| release_ifb(&mut host, &host_ifb_name(&att), &att));
            steps.push(released);
        }
        Error::all(steps)
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        Shaping::load(req).map(drop)
    }

    // ---------------------------------------------------------------- GC
    /// ifbs of this network (by alias) whose container is not in the valid
    /// list. Only the host's: what is shaped inside a pod's netns goes with it.
    fn gc(&self, req: &Request) -> Result<(), Error> {
        Shaping::load(req)?;
        let Some(valid) = req.conf.valid_attachments()? else {
            return Ok(());
        };
        let keep: Vec<String> = valid.iter().map(host_ifb_name).collect();
        let prefix = link_owner::network_alias_prefix(PLUGIN, &req.conf.name);
        let mut host = Netlink::open()?;
        let doomed = host.ifbs()?.into_iter().filter(|i| {
            i.alias.as_deref().is_some_and(|a| a.starts_with(&prefix))
                && !keep.contains(&i.link.name)
        });
        let steps: Vec<_> = doomed.map(|i| delete_link(&mut host, &i.link)).collect();
        Error::all(steps)
    }
}

/// An ipvlan in mode l3s hands what arrives for the pod to its interface at
/// the IP layer (the master's rx handler passes it up, and an l3mdev hook
/// moves it to the pod's interface), past tc's ingress hook on that
/// interface: an ingress limit there would never shape anything, so it is
/// refused rather than accepted and ignored.
fn refuse_unshapeable_ingress(site: &Site, shaping: Shaping) -> Result<(), Error> {
    if site.layout == Layout::InPod
        && site.dev.ipvlan_mode == Some(IpvlanMode::L3s)
        && shaping.ingress.is_some()
    {
        return Err(Error::invalid_config(format!(
            "ingressRate: {} in netns {} is an ipvlan in mode l3s, whose received packets \
             bypass tc's ingress hook, so traffic to the pod cannot be shaped there; use mode \
             l2 or l3, or limit only egressRate",
            site.dev.name, site.sandbox
        )));
    }
    Ok(())
}

/// ADD's and CHECK's site: the pod's `CNI_IFNAME` must exist.
fn existing_site(ns: &NetNs, req: &Request, prev: &CniResult) -> Result<Site, Error> {
    site(ns, req, Some(prev))?.ok_or_else(|| {
        Error::invalid_config(format!(
            "there is no {} in netns {}",
            req.ifname(),
            req.netns()
        ))
    })
}

/// DEL's site, when the netns and the pod's interface still exist (never in
/// the plugin's own netns).
fn site_for_del(req: &Request) -> Result<Option<Site>, Error> {
    let Some(ns) = netns_for_del(req.netns())? else {
        return Ok(None);
    };
    if is_own_netns(&ns)? {
        return Ok(None);
    }
    site(&ns, req, req.conf.prev_result.as_ref())
}

/// Where the pod's `CNI_IFNAME` in `ns` is shaped: the host end of its veth
/// when `prev` lists that among its host interfaces (the reference's
/// layout), else the interface itself, in the pod. Without `prev` (a DEL)
/// a host end counts as listed unless the pod holds this attachment's ifb.
/// None when there is no such interface.
fn site(ns: &NetNs, req: &Request, prev: Option<&CniResult>) -> Result<Option<Site>, Error> {
    let mut pod = Netlink::open_in(ns)?;
    let Some(iface) = pod.link_by_name(req.ifname())? else {
        return Ok(None);
    };
    if let Some((host, veth)) = host_end(&iface)? {
        let listed = match prev {
            Some(prev) => prev
                .interfaces
                .iter()
                .any(|i| i.sandbox.is_empty() && i.name == veth.name),
            None => pod
                .link_by_name(&pod_ifb_name(&req.attachment()))?
                .is_none(),
        };
        if listed {
            return Ok(Some(Site::new(req, host, veth, Layout::HostVeth)));
        }
    }
    Ok(Some(Site::new(req, pod, iface, Layout::InPod)))
}

/// The host end of `inside` with a socket of the host, when `inside` is a
/// veth with its peer here. The peer's index only means something here if
/// the peer is here: the host link must be a veth pointing back at it.
fn host_end(inside: &Link) -> Result<Option<(Netlink, Link)>, Error> {
    let Some(peer) = inside.link.filter(|_| inside.is_kind("veth")) else {
        return Ok(None);
    };
    let mut host = Netlink::open()?;
    let veth = host
        .link_by_index(peer)?
        .filter(|l| l.is_kind("veth") && l.link == Some(inside.index));
    Ok(veth.map(|v| (host, v)))
}

#[cfg(test)]
mod tests;
