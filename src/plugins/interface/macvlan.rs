//! macvlan: a MAC-VLAN child of a host (or in-container) master, moved into
//! the container. IPAM is optional: without it the link is L2 only.

use super::child::{add_child, load, ChildKind, Loaded};
use crate::cni::{CniResult, Error, Interface, Request};
use crate::netlink::{ChildLink, Link, MacvlanMode, MacvlanSpec, Netlink};
use crate::plugins::conf_keys::{requested_mac, validate_mac};
use serde::Deserialize;

pub struct Macvlan;

/// macvlan's keys beside the shared [`ChildConf`](super::child::ChildConf).
#[derive(Debug, Deserialize)]
pub(super) struct Conf {
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    bcqueuelen: Option<u32>,
}

impl ChildKind for Macvlan {
    const KIND: &'static str = "macvlan";
    /// The reference macvlan decodes them (MAC=).
    const READS_CNI_ARGS: bool = true;
    const MODES: &'static [(&'static str, MacvlanMode)] = &[
        ("bridge", MacvlanMode::Bridge),
        ("private", MacvlanMode::Private),
        ("vepa", MacvlanMode::Vepa),
        ("passthru", MacvlanMode::Passthru),
    ];
    type Conf = Conf;
    type Mode = MacvlanMode;

    fn validate(req: &Request) -> Result<(), Error> {
        load::<Self>(req).map(drop)
    }

    fn mode_of(link: &Link) -> Option<MacvlanMode> {
        link.macvlan_mode
    }

    fn add_link(req: &Request, conf: Loaded<Self>) -> Result<CniResult, Error> {
        let Loaded { shared, own, mode } = conf;
        let mac = configured_mac(req, &own)?;
        add_child(
            req,
            shared.link_in_container,
            (shared.master.as_deref(), shared.mtu),
            |nl, link| {
                nl.create_macvlan(MacvlanSpec {
                    // As the reference (macvlan.go:356): when IPAM addresses it.
                    link: ChildLink {
                        arp_notify: req.conf.ipam_type.is_some(),
                        ..link
                    },
                    mode,
                    mac,
                    bc_queue_len: own.bcqueuelen,
                })
            },
            |_, cont, index| l2_only(cont, req, index),
        )
    }
}

/// The reference's order: `runtimeConfig.mac`, `CNI_ARGS MAC=`, then `mac`
/// (and `args.cni.mac` where bridge takes it); an empty one is not set.
pub(super) fn configured_mac(req: &Request, own: &Conf) -> Result<Option<String>, Error> {
    match requested_mac(req)? {
        Some(m) => Ok(Some(m)),
        None => own
            .mac
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| validate_mac(m, "mac"))
            .transpose(),
    }
}

/// No IPAM: the link is up and reported, with no addresses.
fn l2_only(cont: &mut Netlink, req: &Request, index: u32) -> Result<CniResult, Error> {
    cont.set_up(index)?;
    let mac = cont
        .link_by_index(index)?
        .and_then(|l| l.mac)
        .unwrap_or_default();
    Ok(CniResult {
        interfaces: vec![Interface {
            name: req.ifname().to_string(),
            mac,
            sandbox: req.netns().to_string(),
            ..Default::default()
        }],
        ..Default::default()
    })
}
