//! vlan: an 802.1Q VLAN link on a master (on the host, or with `linkInContainer` in the
//! pod), created straight into the pod as macvlan is (see `child.rs`) and addressed from
//! IPAM, which is required. Not a [`ChildKind`](super::child::ChildKind): it has no
//! `mode`, its `master` is required, and CHECK reads the VLAN id back.

use super::child::{add_child, del_single_iface, status_if_supported};
use crate::cni::{CniResult, Command, Error, Plugin, Request};
use crate::netlink::{Link, NetNs, Netlink, VlanSpec};
use crate::plugins::conf_keys::{config_ifname, configured_mtu, with_configured_dns};
use crate::plugins::ipam_delegation::{ipam_if_configured, require_ipam};
use crate::plugins::pod_interface::{expect_kind, expect_mac, find_container_link};
use crate::plugins::pod_netns::open_netns;
use serde::Deserialize;

pub struct Vlan;

/// `IFLA_INFO_KIND`, and the only kind of link DEL removes.
const KIND: &str = "vlan";
/// The highest VLAN id the reference takes (4095 is reserved).
const MAX_VLAN_ID: i64 = 4094;

/// The plugin's keys as the reference decodes them (Go ints: a missing `vlanId` is 0).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Conf {
    #[serde(default)]
    master: Option<String>,
    #[serde(default)]
    vlan_id: Option<i64>,
    #[serde(default)]
    mtu: Option<i64>,
    #[serde(default)]
    link_in_container: bool,
}

/// The configuration for ADD, validated.
#[derive(Debug, PartialEq)]
pub(super) struct Loaded {
    pub master: String,
    pub id: u16,
    pub mtu: Option<u32>,
    pub link_in_container: bool,
}

impl Conf {
    /// The reference's rules: `master` required, `vlanId` 0–4094, `mtu` 0 (unset) or a
    /// valid MTU (checked against the master's when the link is made).
    pub(super) fn load(req: &Request) -> Result<Loaded, Error> {
        let conf: Conf = req.conf.typed()?;
        let master = conf.master.filter(|m| !m.is_empty()).ok_or_else(|| {
            Error::invalid_config(
                "\"master\" field is required. It specifies the host interface name to create the VLAN for",
            )
        })?;
        config_ifname("master", &master)?;
        let id = conf.vlan_id.unwrap_or(0);
        if !(0..=MAX_VLAN_ID).contains(&id) {
            return Err(Error::invalid_config(format!(
                "invalid VLAN ID {id} (must be between 0 and {MAX_VLAN_ID} inclusive)"
            )));
        }
        let mtu = match conf.mtu {
            None => None,
            Some(m) => configured_mtu(Some(u32::try_from(m).map_err(|_| {
                Error::invalid_config(format!("invalid MTU {m}, must be 0 or a valid MTU"))
            })?))?,
        };
        Ok(Loaded {
            master,
            id: u16::try_from(id).unwrap_or_default(),
            mtu,
            link_in_container: conf.link_in_container,
        })
    }
}

impl Plugin for Vlan {
    // The reference vlan never decodes CNI_ARGS: `reads_cni_args` false.

    // ---------------------------------------------------------------- ADD
    /// The link, then IPAM, as the reference; a failure after the create removes the
    /// link, and one after IPAM's ADD releases its lease.
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        require_ipam(req, "vlan")?;
        let conf = Conf::load(req)?;
        let made = add_child(
            req,
            conf.link_in_container,
            (Some(conf.master.as_str()), conf.mtu),
            // The reference vlan plugin leaves arp_notify alone.
            |nl, link| nl.create_vlan(VlanSpec { link, id: conf.id }),
            |_, _, _| Err(Error::invalid_config("vlan needs IPAM")),
        )?;
        Ok(with_configured_dns(req, made))
    }

    // ---------------------------------------------------------------- CHECK
    /// IPAM's CHECK, then as the reference: the master exists, the interface of
    /// prevResult is a VLAN with prevResult's MAC, the configured id and (when set) MTU,
    /// and has prevResult's addresses and routes.
    fn check(&self, req: &Request) -> Result<(), Error> {
        require_ipam(req, "vlan")?;
        let conf = Conf::load(req)?;
        let Some(prev) = &req.conf.prev_result else {
            return Err(Error::invalid_config("vlan: Required prevResult missing"));
        };
        ipam_if_configured(req, Command::Check)?;
        let mut found = find_container_link(req, prev)?;
        check_master(req, &conf)?;
        let id = found.nl.vlan_id(found.link.index)?;
        expect_vlan(&found.link, id, &conf, &prev.interfaces[found.pos].mac)?;
        found.check_iface_state(prev)
    }

    // ---------------------------------------------------------------- DEL
    /// IPAM's DEL, then the VLAN link; both run even if one fails. Reads none of the
    /// plugin's keys (the reference looks the master up first and fails once it is
    /// gone), so no configuration and no missing master can block it; a netns or link
    /// already gone is done, and a CNI_IFNAME that is not a VLAN stays.
    fn del(&self, req: &Request) -> Result<(), Error> {
        del_single_iface(req, KIND)
    }

    // ---------------------------------------------------------------- STATUS
    /// The keys decode, the kernel makes VLAN links (else 50), then IPAM's STATUS.
    fn status(&self, req: &Request) -> Result<(), Error> {
        require_ipam(req, "vlan")?;
        req.conf.typed::<Conf>()?;
        let supported = Netlink::open()?.child_kind_supported(KIND)?;
        status_if_supported(
            req,
            supported,
            "this kernel has no 802.1Q VLAN support (CONFIG_VLAN_8021Q), so ADD cannot create vlan links",
        )
    }

    // ---------------------------------------------------------------- GC
    /// IPAM's GC: the links go with their pods' netns.
    fn gc(&self, req: &Request) -> Result<(), Error> {
        ipam_if_configured(req, Command::Gc)
    }
}

/// CHECK: the master is there, on the host or (`linkInContainer`) in the pod.
fn check_master(req: &Request, conf: &Loaded) -> Result<(), Error> {
    let (mut nl, where_) = if conf.link_in_container {
        let ns: NetNs = open_netns(req.netns())?;
        (Netlink::open_in(&ns)?, format!("netns {}", req.netns()))
    } else {
        (Netlink::open()?, "the host".to_string())
    };
    match nl.link_by_name(&conf.master)? {
        Some(_) => Ok(()),
        None => Err(Error::check_failed(format_args!(
            "master {} is missing in {where_}",
            conf.master
        ))),
    }
}

/// CHECK: the link is a VLAN of the configured id, with prevResult's MAC (when it gives
/// one) and the configured MTU (when set).
pub(super) fn expect_vlan(
    link: &Link,
    id: Option<u16>,
    conf: &Loaded,
    mac: &str,
) -> Result<(), Error> {
    expect_kind(link, KIND)?;
    expect_mac(link, mac)?;
    if id != Some(conf.id) {
        return Err(Error::check_failed(format_args!(
            "{} has VLAN id {}, configured {}",
            link.name,
            id.map_or("none".to_string(), |i| i.to_string()),
            conf.id
        )));
    }
    if let Some(mtu) = conf.mtu.filter(|m| *m != link.mtu) {
        return Err(Error::check_failed(format_args!(
            "{} has MTU {}, configured {mtu}",
            link.name, link.mtu
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "vlan_tests.rs"]
mod tests;
