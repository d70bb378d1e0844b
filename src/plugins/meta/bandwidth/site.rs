//! Where a pod's traffic is shaped, and the steps both layouts share. A site
//! is one link seen through the socket of its network namespace: a root TBF
//! shapes what *leaves* through it, and what *arrives* on it is redirected
//! (ingress qdisc, u32 match-all, mirred) to an ifb beside it whose root TBF
//! shapes it; tc cannot queue on arrival. The two layouts are the same steps
//! on different links, with the pod's directions swapped:
//!
//! - the host end of the pod's veth (the reference's layout): the pod's
//!   ingress leaves the host through it, its egress arrives on it; the ifb
//!   is on the host, named as the reference names it;
//! - the pod's own interface, in its netns (every other kind: macvlan,
//!   ipvlan, vlan, host-device, tap, dummy, which have no host end): the
//!   pod's egress leaves through it, its ingress arrives on it; the ifb is
//!   in the pod's netns (mirred and ifb hand a frame back by ifindex within
//!   one netns), named after the attachment.

use super::conf::Shaping;
use crate::cni::{Attachment, Code, Error, Interface, Request};
use crate::netlink::{Ifb, Link, Netlink, Qdisc, Tbf, INGRESS_HANDLE};
use crate::plugins::link_owner;
use sha2::{Digest, Sha512};

/// The plugin's name in the aliases of the ifbs it owns.
pub(super) const PLUGIN: &str = "bandwidth";

/// The root TBF handle (`1:`), as the reference installs it.
const TBF_MAJOR: u16 = 1;

/// Which link a site shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// The host end of the pod's veth.
    HostVeth,
    /// The pod's interface, inside the pod's netns.
    InPod,
}

/// A link to shape and the socket of its netns.
pub(super) struct Site {
    pub nl: Netlink,
    pub dev: Link,
    pub layout: Layout,
    /// The ifb's name (made only when something arrives to be shaped).
    pub ifb: String,
    /// The netns path the ifb is reported in (empty: the host).
    pub sandbox: String,
}

/// The site's two token buckets: for what leaves through its link and for
/// what arrives on it.
struct Buckets {
    leaving: Option<Tbf>,
    arriving: Option<Tbf>,
}

/// One thing ADD made, to remove again if a later step fails.
enum Made {
    Ifb(u32),
    Qdisc(u32, Qdisc),
}

impl Site {
    /// Where the shaping of the pod's traffic goes for `layout`: `dev`
    /// through `nl`, with the layout's ifb.
    pub(super) fn new(req: &Request, nl: Netlink, dev: Link, layout: Layout) -> Site {
        let att = req.attachment();
        let (ifb, sandbox) = match layout {
            Layout::HostVeth => (host_ifb_name(&att), String::new()),
            Layout::InPod => (pod_ifb_name(&att), req.netns().to_string()),
        };
        Site {
            nl,
            dev,
            layout,
            ifb,
            sandbox,
        }
    }

    /// The pod's directions in this site's terms.
    fn buckets(&self, shaping: Shaping) -> Buckets {
        match self.layout {
            Layout::HostVeth => Buckets {
                leaving: shaping.ingress,
                arriving: shaping.egress,
            },
            Layout::InPod => Buckets {
                leaving: shaping.egress,
                arriving: shaping.ingress,
            },
        }
    }

    /// ADD: shapes both directions, or, when a step fails, removes what the
    /// earlier ones made. The ifb for the result when one was made.
    pub(super) fn shape(
        &mut self,
        req: &Request,
        shaping: Shaping,
    ) -> Result<Option<Interface>, Error> {
        let mut undo = Vec::new();
        match self.shape_steps(&req.attachment(), self.buckets(shaping), &mut undo) {
            Ok(ifb) => Ok(ifb.map(|l| Interface {
                name: l.name,
                mac: l.mac.unwrap_or_default(),
                sandbox: self.sandbox.clone(),
                ..Default::default()
            })),
            Err(e) => Err(self.rollback(undo, e)),
        }
    }

    /// The arriving side first (ifb, its TBF, then the redirect: traffic only
    /// moves to the ifb once it is ready), then the leaving side.
    fn shape_steps(
        &mut self,
        att: &Attachment,
        buckets: Buckets,
        undo: &mut Vec<Made>,
    ) -> Result<Option<Link>, Error> {
        let mut made_ifb = None;
        if let Some(tbf) = buckets.arriving {
            self.remove_leftover_ifb(att)?;
            let alias = link_owner::alias(PLUGIN, att);
            let ifb = self.nl.create_ifb(&self.ifb, self.dev.mtu, &alias)?;
            undo.push(Made::Ifb(ifb.index));
            self.nl.add_root_tbf(ifb.index, TBF_MAJOR, tbf)?;
            self.nl.add_ingress_qdisc(self.dev.index)?;
            undo.push(Made::Qdisc(self.dev.index, ingress_qdisc()));
            self.nl
                .add_redirect_filter(self.dev.index, INGRESS_HANDLE, ifb.index)?;
            made_ifb = Some(ifb);
        }
        if let Some(tbf) = buckets.leaving {
            self.nl.add_root_tbf(self.dev.index, TBF_MAJOR, tbf)?;
            undo.push(Made::Qdisc(self.dev.index, root_tbf()));
        }
        Ok(made_ifb)
    }

    /// An ifb of this name left by an earlier ADD of the same attachment
    /// (whose DEL never came) goes; anyone else's refuses the ADD.
    fn remove_leftover_ifb(&mut self, att: &Attachment) -> Result<(), Error> {
        let name = self.ifb.clone();
        match ifb_of(&mut self.nl, &name, att)? {
            Some((old, true)) if old.alias.is_some() => delete_link(&mut self.nl, &old.link),
            Some((old, _)) => Err(Error::new(
                Code::Kernel,
                format!(
                    "ifb {} already exists for {}; {}",
                    self.label(&name),
                    old.alias.as_deref().unwrap_or("another plugin"),
                    match self.layout {
                        Layout::HostVeth =>
                            "it is one per container and network, named as the \
                             reference names it: shape one interface of a container per \
                             network, or DEL that attachment first",
                        Layout::InPod => "remove it or DEL that attachment first",
                    }
                ),
            )),
            None => Ok(()),
        }
    }

    /// Link `name` of this site as messages name it: "NAME in netns PATH" in
    /// the pod, the bare name on the host.
    fn label(&self, name: &str) -> String {
        match self.layout {
            Layout::HostVeth => name.to_string(),
            Layout::InPod => format!("{name} in netns {}", self.sandbox),
        }
    }

    /// Undoes `undo` (newest first) and returns `e`, noting what could not be undone.
    fn rollback(&mut self, undo: Vec<Made>, mut e: Error) -> Error {
        for made in undo.into_iter().rev() {
            let undone = match made {
                Made::Ifb(index) => self.nl.delete_link(index),
                Made::Qdisc(index, q) => self.nl.delete_qdisc(index, &q),
            };
            if let Err(u) = undone.filter_not_found() {
                e.msg = format!("{}; undoing it: {}", e.msg, u.message);
            }
        }
        e
    }

    /// CHECK: the TBFs have the configuration's parameters and the arriving
    /// side is redirected to the ifb (code 100 naming what differs).
    pub(super) fn expect(&mut self, shaping: Shaping) -> Result<(), Error> {
        let buckets = self.buckets(shaping);
        if let Some(want) = buckets.leaving {
            let (index, label) = (self.dev.index, self.label(&self.dev.name));
            expect_tbf(&mut self.nl, index, &label, want)?;
        }
        if let Some(want) = buckets.arriving {
            let name = self.ifb.clone();
            let ifb = self
                .nl
                .link_by_name(&name)?
                .filter(|l| l.is_kind("ifb"))
                .ok_or_else(|| {
                    Error::check_failed(format_args!("ifb {} is missing", self.label(&name)))
                })?;
            let label = self.label(&name);
            expect_tbf(&mut self.nl, ifb.index, &label, want)?;
            let targets = self.nl.redirect_targets(self.dev.index, INGRESS_HANDLE)?;
            if !targets.contains(&ifb.index) {
                return Err(Error::check_failed(format_args!(
                    "no ingress filter on {} redirects to {name}",
                    self.label(&self.dev.name)
                )));
            }
        }
        Ok(())
    }

    /// DEL: the ifb of this site (by name) and the qdiscs on its link.
    pub(super) fn unshape(&mut self, att: &Attachment, shaping: Shaping) -> Result<(), Error> {
        let name = self.ifb.clone();
        let ifb = release_ifb(&mut self.nl, &name, att);
        let qdiscs = self.remove_qdiscs(shaping);
        Error::all([ifb, qdiscs])
    }

    /// The root TBF and the ingress qdisc this plugin puts on the site's link.
    fn remove_qdiscs(&mut self, shaping: Shaping) -> Result<(), Error> {
        let buckets = self.buckets(shaping);
        let index = self.dev.index;
        let mut steps = Vec::new();
        for q in self.nl.qdiscs(index)? {
            let our_tbf = q.is_root() && q.kind == "tbf" && q.handle == root_tbf().handle;
            let ours = (buckets.leaving.is_some() && our_tbf)
                || (buckets.arriving.is_some() && q.is_ingress());
            if ours {
                steps.push(
                    self.nl
                        .delete_qdisc(index, &q)
                        .filter_not_found()
                        .map_err(Error::from),
                );
            }
        }
        Error::all(steps)
    }
}

/// The host ifb of `att`: "bwp" + the first 12 hex digits of
/// SHA-512(network + container ID), the reference's name (so either
/// plugin's DEL finds the other's).
pub(super) fn host_ifb_name(att: &Attachment) -> String {
    hashed_name("bwp", &format!("{}{}", att.network, att.container_id))
}

/// The ifb in the pod's netns: "bwi" + 12 hex digits of SHA-512(network /
/// container ID / ifname), so each shaped interface of a pod has its own.
pub(super) fn pod_ifb_name(att: &Attachment) -> String {
    let tag = format!("{}/{}/{}", att.network, att.container_id, att.ifname);
    hashed_name("bwi", &tag)
}

fn hashed_name(prefix: &str, of: &str) -> String {
    let digest = Sha512::digest(of.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

pub(super) trait NotFoundIsDone {
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

/// The ifb called `name` and whether `att` may remove it: cnikit's of this
/// attachment, or one without our alias (the reference's). Another
/// attachment's — another interface of the same container, whose host ifb
/// has the same name — is not this one's to remove. Links of other kinds are
/// never listed, so never removed. One get by name: ADD and DEL do not read
/// every link of the host, whose number grows with the node's pods.
pub(super) fn ifb_of(
    nl: &mut Netlink,
    name: &str,
    att: &Attachment,
) -> Result<Option<(Ifb, bool)>, Error> {
    let ours = link_owner::alias(PLUGIN, att);
    Ok(nl
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
pub(super) fn release_ifb(nl: &mut Netlink, name: &str, att: &Attachment) -> Result<(), Error> {
    match ifb_of(nl, name, att)? {
        Some((ifb, true)) => delete_link(nl, &ifb.link),
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

pub(super) fn delete_link(nl: &mut Netlink, link: &Link) -> Result<(), Error> {
    nl.delete_link(link.index)
        .filter_not_found()
        .map_err(Error::from)
}

/// CHECK: the root qdisc of link `index` (`label` in messages) is a TBF
/// with `want`'s parameters.
fn expect_tbf(nl: &mut Netlink, index: u32, label: &str, want: Tbf) -> Result<(), Error> {
    let root = nl.qdiscs(index)?.into_iter().find(Qdisc::is_root);
    match root.as_ref().and_then(|q| q.tbf) {
        Some(have) if have == want => Ok(()),
        Some(have) => Err(Error::check_failed(format_args!(
            "the TBF on {} has rate {} B/s, limit {} B, buffer {} ticks; the configuration \
             wants {} B/s, {} B, {} ticks",
            label, have.rate, have.limit, have.buffer, want.rate, want.limit, want.buffer
        ))),
        None => Err(Error::check_failed(format_args!(
            "{label} has no TBF root qdisc (it has {})",
            root.map_or("none".into(), |q| q.kind)
        ))),
    }
}
