//! bandwidth: rate limits on the pod's host-side veth, chained after an
//! interface plugin. Traffic *to* the pod (ingress, in the pod's words) is
//! shaped by a token bucket filter at the root of the host veth; traffic
//! *from* it (egress) enters the host through that veth, where tc cannot
//! queue, so an ingress qdisc redirects it to an ifb link whose own root TBF
//! shapes it — the reference's layout, down to the ifb's name. The tc side
//! is in `netlink::tc`.

mod conf;

use crate::cni::{Attachment, CniResult, Code, Error, Interface, Plugin, Request};
use crate::netlink::{Ifb, Link, NetNs, Netlink, Qdisc, Tbf, INGRESS_HANDLE};
use crate::plugins::link_owner;
use crate::plugins::pod_netns::{is_own_netns, netns_for_del, open_netns};
use conf::Shaping;
use sha2::{Digest, Sha512};

pub struct Bandwidth;

/// The ifb of `network`'s container `id`: "bwp" + the first 12 hex digits of
/// SHA-512(network + id), the reference's name (so either plugin's DEL finds
/// the other's).
fn ifb_name(network: &str, container_id: &str) -> String {
    let digest = Sha512::digest(format!("{network}{container_id}").as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("bwp{hex}")
}

/// The ifb's alias: who owns it, for GC (the name alone cannot say).
fn ifb_alias(att: &Attachment) -> String {
    link_owner::alias(PLUGIN, att)
}

/// The plugin's name in the aliases of the ifbs it owns.
const PLUGIN: &str = "bandwidth";

/// The root TBF handle (`1:`), as the reference installs it.
const TBF_MAJOR: u16 = 1;

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
        let mut host = Netlink::open()?;
        let veth = host_veth(&ns, &mut host, req, &result)?;
        let mut undo = Vec::new();
        let shaped = shape(req, &mut host, &veth, shaping, &mut undo);
        match shaped {
            Ok(ifb) => {
                if let Some(ifb) = ifb {
                    result.interfaces.push(Interface {
                        name: ifb.name,
                        mac: ifb.mac.unwrap_or_default(),
                        ..Default::default()
                    });
                }
                Ok(result)
            }
            Err(e) => Err(rollback(&mut host, undo, e)),
        }
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
        let mut host = Netlink::open()?;
        let veth = host_veth(&ns, &mut host, req, prev)?;
        if let Some(want) = shaping.ingress {
            expect_tbf(&mut host, &veth, want)?;
        }
        if let Some(want) = shaping.egress {
            let name = ifb_name(&req.conf.name, req.container_id());
            let ifb = host
                .link_by_name(&name)?
                .filter(|l| l.is_kind("ifb"))
                .ok_or_else(|| Error::check_failed(format_args!("ifb {name} is missing")))?;
            expect_tbf(&mut host, &ifb, want)?;
            let targets = host.redirect_targets(veth.index, INGRESS_HANDLE)?;
            if !targets.contains(&ifb.index) {
                return Err(Error::check_failed(format_args!(
                    "no ingress filter on {} redirects to {name}",
                    veth.name
                )));
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- DEL
    /// The ifb by its name (no netns or prevResult needed), then, when the
    /// container's veth can still be found, the qdiscs on its host end.
    fn del(&self, req: &Request) -> Result<(), Error> {
        let shaping = req.conf_or_del_fallback(Shaping::load, Shaping::everything)?;
        let mut host = Netlink::open()?;
        let name = ifb_name(&req.conf.name, req.container_id());
        let ifb = release_ifb(&mut host, &name, &req.attachment());
        let qdiscs = match container_veth_for_del(req, &mut host) {
            Ok(Some(veth)) => remove_qdiscs(&mut host, &veth, shaping),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        Error::all([ifb, qdiscs])
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        Shaping::load(req).map(drop)
    }

    // ---------------------------------------------------------------- GC
    /// ifbs of this network (by alias) whose container is not in the valid list.
    fn gc(&self, req: &Request) -> Result<(), Error> {
        Shaping::load(req)?;
        let Some(valid) = req.conf.valid_attachments()? else {
            return Ok(());
        };
        let keep: Vec<String> = valid
            .iter()
            .map(|a| ifb_name(&a.network, &a.container_id))
            .collect();
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

/// One thing ADD made, to remove again if a later step fails.
enum Made {
    Ifb(u32),
    Qdisc(u32, Qdisc),
}

/// Shapes egress (ifb, its TBF, then the redirect: traffic only moves to the
/// ifb once it is ready) and ingress; the ifb when one was made.
fn shape(
    req: &Request,
    host: &mut Netlink,
    veth: &Link,
    shaping: Shaping,
    undo: &mut Vec<Made>,
) -> Result<Option<Link>, Error> {
    let mut made_ifb = None;
    if let Some(tbf) = shaping.egress {
        let name = ifb_name(&req.conf.name, req.container_id());
        match ifb_of(host, &name, &req.attachment())? {
            // A leftover of an earlier ADD of this attachment (its DEL never came).
            Some((old, true)) if old.alias.is_some() => delete_link(host, &old.link)?,
            Some((old, _)) => {
                return Err(Error::new(
                    Code::Kernel,
                    format!(
                        "ifb {name} (one per container and network, named as the reference                          names it) already exists for {}; shape one interface of a container                          per network, or DEL that attachment first",
                        old.alias.as_deref().unwrap_or("another plugin")
                    ),
                ))
            }
            None => {}
        }
        let ifb = host.create_ifb(&name, veth.mtu, &ifb_alias(&req.attachment()))?;
        undo.push(Made::Ifb(ifb.index));
        host.add_root_tbf(ifb.index, TBF_MAJOR, tbf)?;
        host.add_ingress_qdisc(veth.index)?;
        undo.push(Made::Qdisc(veth.index, ingress_qdisc()));
        host.add_redirect_filter(veth.index, INGRESS_HANDLE, ifb.index)?;
        made_ifb = Some(ifb);
    }
    if let Some(tbf) = shaping.ingress {
        host.add_root_tbf(veth.index, TBF_MAJOR, tbf)?;
        undo.push(Made::Qdisc(veth.index, root_tbf()));
    }
    Ok(made_ifb)
}

/// Undoes `undo` (newest first) and returns `e`, noting what could not be undone.
fn rollback(host: &mut Netlink, undo: Vec<Made>, mut e: Error) -> Error {
    for made in undo.into_iter().rev() {
        let undone = match made {
            Made::Ifb(index) => host.delete_link(index),
            Made::Qdisc(index, q) => host.delete_qdisc(index, &q),
        };
        if let Err(u) = undone.filter_not_found() {
            e.msg = format!("{}; undoing it: {}", e.msg, u.message);
        }
    }
    e
}

trait NotFoundIsDone {
    fn filter_not_found(self) -> Result<(), crate::netlink::Error>;
}

impl NotFoundIsDone for Result<(), crate::netlink::Error> {
    fn filter_not_found(self) -> Result<(), crate::netlink::Error> {
        match self {
            Err(e) if e.is_not_found() || e.errno == Some(libc::EINVAL) => Ok(()),
            other => other,
        }
    }
}

fn ingress_qdisc() -> Qdisc {
    Qdisc {
        kind: "ingress".into(),
        handle: INGRESS_HANDLE,
        parent: 0xffff_fff1,
        tbf: None,
    }
}

fn root_tbf() -> Qdisc {
    Qdisc {
        kind: "tbf".into(),
        handle: u32::from(TBF_MAJOR) << 16,
        parent: 0xffff_ffff,
        tbf: None,
    }
}

/// The host end of the container's `CNI_IFNAME`: its veth peer, which must
/// be one of `prev`'s host-side interfaces (as the reference requires).
fn host_veth(
    ns: &NetNs,
    host: &mut Netlink,
    req: &Request,
    prev: &CniResult,
) -> Result<Link, Error> {
    let ifname = req.ifname();
    let netns = req.netns();
    let inside = Netlink::open_in(ns)?
        .link_by_name(ifname)?
        .ok_or_else(|| Error::invalid_config(format!("there is no {ifname} in netns {netns}")))?;
    let not_veth = || {
        Error::invalid_config(format!(
            "{ifname} in netns {netns} is not a veth with its peer on this host; bandwidth shapes \
             the host end of a veth (chain it after bridge or ptp)"
        ))
    };
    let peer = inside
        .link
        .filter(|_| inside.is_kind("veth"))
        .ok_or_else(not_veth)?;
    // The peer's index is only meaningful here if the peer is here: the
    // host link must be a veth pointing back at the container's end.
    let veth = host
        .link_by_index(peer)?
        .filter(|l| l.is_kind("veth") && l.link == Some(inside.index))
        .ok_or_else(not_veth)?;
    let listed = prev
        .interfaces
        .iter()
        .any(|i| i.sandbox.is_empty() && i.name == veth.name);
    if !listed {
        return Err(Error::invalid_config(format!(
            "prevResult does not list {}, the host end of {ifname}, among its host interfaces",
            veth.name
        )));
    }
    Ok(veth)
}

/// The host veth of the container's interface for DEL, when the netns and
/// the interface still exist (never in the plugin's own netns).
fn container_veth_for_del(req: &Request, host: &mut Netlink) -> Result<Option<Link>, Error> {
    let Some(ns) = netns_for_del(req.netns())? else {
        return Ok(None);
    };
    if is_own_netns(&ns)? {
        return Ok(None);
    }
    let Some(inside) = Netlink::open_in(&ns)?.link_by_name(req.ifname())? else {
        return Ok(None);
    };
    match inside.link.filter(|_| inside.is_kind("veth")) {
        Some(peer) => Ok(host
            .link_by_index(peer)?
            .filter(|l| l.is_kind("veth") && l.link == Some(inside.index))),
        None => Ok(None),
    }
}

/// The root TBF and the ingress qdisc this plugin puts on the host veth.
fn remove_qdiscs(host: &mut Netlink, veth: &Link, shaping: Shaping) -> Result<(), Error> {
    let mut steps = Vec::new();
    for q in host.qdiscs(veth.index)? {
        let our_tbf = q.is_root() && q.kind == "tbf" && q.handle == root_tbf().handle;
        let ours =
            (shaping.ingress.is_some() && our_tbf) || (shaping.egress.is_some() && q.is_ingress());
        if ours {
            steps.push(
                host.delete_qdisc(veth.index, &q)
                    .filter_not_found()
                    .map_err(Error::from),
            );
        }
    }
    Error::all(steps)
}

/// The ifb called `name` and whether `att` may remove it: cnikit's of this
/// attachment, or one without our alias (the reference's). Another
/// attachment's — another interface of the same container, whose ifb has
/// the same name — is not this one's to remove. Links of other kinds are
/// never listed, so never removed. One get by name: ADD and DEL do not read
/// every link of the host, whose number grows with the node's pods.
fn ifb_of(host: &mut Netlink, name: &str, att: &Attachment) -> Result<Option<(Ifb, bool)>, Error> {
    let ours = ifb_alias(att);
    Ok(host
        .link_by_name(name)?
        // The kernel finds a link by an alternative name too.
        .filter(|l| l.name == name && l.is_kind("ifb"))
        .map(|link| Ifb {
            alias: link.alias.clone(),
            link,
        })
        .map(|i| {
            let may = i
                .alias
                .as_deref()
                .is_none_or(|a| a == ours || !a.starts_with(&link_owner::alias_prefix(PLUGIN)));
            (i, may)
        }))
}

/// DEL of this attachment's ifb; a missing one is done.
fn release_ifb(host: &mut Netlink, name: &str, att: &Attachment) -> Result<(), Error> {
    match ifb_of(host, name, att)? {
        Some((ifb, true)) => delete_link(host, &ifb.link),
        Some((ifb, false)) => {
            eprintln!(
                "bandwidth: {name} belongs to {}; leaving it alone",
                ifb.alias.unwrap_or_default()
            );
            Ok(())
        }
        None => Ok(()),
    }
}

fn delete_link(host: &mut Netlink, link: &Link) -> Result<(), Error> {
    host.delete_link(link.index)
        .filter_not_found()
        .map_err(Error::from)
}

/// CHECK: the root qdisc of `link` is a TBF with `want`'s parameters.
fn expect_tbf(host: &mut Netlink, link: &Link, want: Tbf) -> Result<(), Error> {
    let root = host.qdiscs(link.index)?.into_iter().find(Qdisc::is_root);
    match root.as_ref().and_then(|q| q.tbf) {
        Some(have) if have == want => Ok(()),
        Some(have) => Err(Error::check_failed(format_args!(
            "the TBF on {} has rate {} B/s, limit {} B, buffer {} ticks; the configuration \
             wants {} B/s, {} B, {} ticks",
            link.name, have.rate, have.limit, have.buffer, want.rate, want.limit, want.buffer
        ))),
        None => Err(Error::check_failed(format_args!(
            "{} has no TBF root qdisc (it has {})",
            link.name,
            root.map_or("none".into(), |q| q.kind)
        ))),
    }
}

#[cfg(test)]
mod tests;
