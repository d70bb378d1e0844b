//! bandwidth: rate limits on the pod's host-side veth, chained after an
//! interface plugin. Traffic *to* the pod (ingress, in the pod's words) is
//! shaped by a token bucket filter at the root of the host veth; traffic
//! *from* it (egress) enters the host through that veth, where tc cannot
//! queue, so an ingress qdisc redirects it to an ifb link whose own root TBF
//! shapes it — the reference's layout, down to the ifb's name. The tc side
//! is in `netlink::tc`.

use super::container::{is_own_netns, open_netns};
use crate::cni::{Attachment, CniResult, Error, Interface, Plugin, Request};
use crate::netlink::{Link, NetNs, Netlink, Qdisc, Tbf, INGRESS_HANDLE};
use serde::Deserialize;
use sha2::{Digest, Sha512};

pub struct Bandwidth;

/// The four keys, at the top of the configuration or in the `bandwidth`
/// capability (`runtimeConfig.bandwidth`): rates in bits per second, bursts
/// in bits; 0 or absent means no limit in that direction.
#[derive(Debug, Default, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(default)]
    ingress_rate: Option<u64>,
    #[serde(default)]
    ingress_burst: Option<u64>,
    #[serde(default)]
    egress_rate: Option<u64>,
    #[serde(default)]
    egress_burst: Option<u64>,
}

impl Entry {
    fn is_set(&self) -> bool {
        [
            self.ingress_rate,
            self.ingress_burst,
            self.egress_rate,
            self.egress_burst,
        ]
        .iter()
        .any(Option::is_some)
    }
}

/// What to shape, validated: a TBF per direction that has a limit.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Shaping {
    ingress: Option<Tbf>,
    egress: Option<Tbf>,
}

impl Shaping {
    /// The configuration's own keys when it has any (as the reference reads
    /// them, they then replace the capability as a whole), else the capability.
    fn load(req: &Request) -> Result<Shaping, Error> {
        let own: Entry = req.conf.typed()?;
        let entry = match req.conf.runtime_config("bandwidth") {
            Some(cap) if !own.is_set() => {
                serde_json::from_value::<Entry>(cap.clone()).map_err(|e| {
                    Error::invalid_config(format!("runtimeConfig.bandwidth {cap}: {e}"))
                })?
            }
            _ => own,
        };
        Ok(Shaping {
            ingress: direction("ingress", entry.ingress_rate, entry.ingress_burst)?,
            egress: direction("egress", entry.egress_rate, entry.egress_burst)?,
        })
    }

    /// DEL with a configuration `load` refuses: remove whatever there may be.
    fn everything(_: &Request) -> Shaping {
        let any = Some(Tbf {
            rate: 0,
            limit: 0,
            buffer: 0,
        });
        Shaping {
            ingress: any,
            egress: any,
        }
    }

    fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }
}

/// Scheduler ticks per microsecond: the kernel's PSCHED_SHIFT is 6, so a
/// tick is 64 ns (what /proc/net/psched has said since 2.6.x, and what the
/// reference reads there).
const TICKS_PER_USEC: f64 = 1000.0 / 64.0;
/// The reference's queueing latency bound: the TBF's limit is the burst
/// plus what the rate sends in this long.
const LATENCY_USEC: f64 = 25_000.0;

/// One direction's TBF from its `<dir>Rate` (bits/s) and `<dir>Burst`
/// (bits), computed as the reference does: bytes are bits / 8, the bucket
/// (buffer) is the time the burst takes at the rate, in ticks, and the limit
/// is the burst plus 25 ms at the rate. Values the kernel's 32-bit fields
/// cannot hold are refused rather than wrapped.
fn direction(dir: &str, rate: Option<u64>, burst: Option<u64>) -> Result<Option<Tbf>, Error> {
    let (rate, burst) = (rate.unwrap_or(0), burst.unwrap_or(0));
    let bad = |why: String| Error::invalid_config(format!("{dir}Rate/{dir}Burst: {why}"));
    match (rate, burst) {
        (0, 0) => return Ok(None),
        (_, 0) => {
            return Err(bad(format!(
                "{dir}Rate {rate} is set, so {dir}Burst must be too"
            )))
        }
        (0, _) => {
            return Err(bad(format!(
                "{dir}Burst {burst} is set, so {dir}Rate must be too"
            )))
        }
        _ => {}
    }
    if rate < 8 {
        return Err(bad(format!(
            "{dir}Rate {rate} must be at least 8 bits per second"
        )));
    }
    let (rate_bytes, burst_bytes) = (rate / 8, burst / 8);
    let Some(burst_bytes) = u32::try_from(burst_bytes).ok().filter(|b| *b < u32::MAX) else {
        return Err(bad(format!("{dir}Burst {burst} is more than 4 GB")));
    };
    let usec = f64::from(burst_bytes) * 1e6 / rate_bytes as f64;
    let buffer = (usec.trunc() * TICKS_PER_USEC).trunc();
    if usec >= f64::from(u32::MAX) || buffer >= f64::from(u32::MAX) {
        return Err(bad(format!(
            "bursting {burst} bits at {rate} bits/s takes too long for the kernel's token bucket"
        )));
    }
    let queued = (rate_bytes as f64 * LATENCY_USEC / 1e6).trunc();
    let limit = u32::try_from(queued as u64)
        .ok()
        .and_then(|q| q.checked_add(burst_bytes))
        .ok_or_else(|| bad(format!("{dir}Rate {rate} queues more than 4 GB in 25 ms")))?;
    Ok(Some(Tbf {
        rate: rate_bytes,
        limit,
        buffer: buffer as u32,
    }))
}

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
    format!("{ALIAS_PREFIX}{}", att.tag())
}

const ALIAS_PREFIX: &str = "cnikit bandwidth ";

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
        let ifb = delete_ifb(&mut host, &ifb_name(&req.conf.name, req.container_id()));
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
        let prefix = format!("{ALIAS_PREFIX}{}", Attachment::tag_prefix(&req.conf.name));
        let mut host = Netlink::open()?;
        let doomed = host.ifbs()?.into_iter().filter(|i| {
            i.alias.as_deref().is_some_and(|a| a.starts_with(&prefix))
                && !keep.contains(&i.link.name)
        });
        let steps: Vec<_> = doomed
            .map(|i| delete_ifb(&mut host, &i.link.name))
            .collect();
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
        // A leftover of an earlier ADD of this container (its DEL never came).
        delete_ifb(host, &name)?;
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
    if req.netns().is_empty() {
        return Ok(None);
    }
    let ns = match NetNs::open(req.netns()) {
        Ok(ns) => ns,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
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

/// Deletes the ifb called `name`; a missing one is done, and a link of that
/// name that is not an ifb is someone else's and stays.
fn delete_ifb(host: &mut Netlink, name: &str) -> Result<(), Error> {
    match host.link_by_name(name)? {
        Some(l) if l.is_kind("ifb") => host
            .delete_link(l.index)
            .filter_not_found()
            .map_err(Error::from),
        Some(l) => {
            eprintln!(
                "bandwidth: {name} is a {}, not an ifb; leaving it alone",
                l.kind.as_deref().unwrap_or("device")
            );
            Ok(())
        }
        None => Ok(()),
    }
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
#[path = "bandwidth_tests.rs"]
mod tests;
