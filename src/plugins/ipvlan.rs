//! ipvlan: an IP-VLAN child of a master (shares the master's MAC). Needs
//! addresses, from IPAM or, when chained, from prevResult.

use super::common::{
    add_child, address_single_iface, check_child, config_ifname, del_single_iface,
    ipam_if_configured,
};
use crate::cni::{CniResult, Command, Error, Plugin, Request};
use crate::netlink::{IpvlanMode, IpvlanSpec, NetNs, Netlink};
use serde::Deserialize;

pub struct Ipvlan;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Conf {
    #[serde(default)]
    master: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    link_in_container: bool,
}

impl Conf {
    pub(super) fn load(req: &Request) -> Result<(Conf, IpvlanMode), Error> {
        let mut c: Conf = req.conf.typed()?;
        // 0 means "not set" in the reference's Go structs.
        c.mtu = c.mtu.filter(|&m| m != 0);
        let mode = match c.mode.as_deref().unwrap_or("l2") {
            "l2" | "" => IpvlanMode::L2,
            "l3" => IpvlanMode::L3,
            "l3s" => IpvlanMode::L3s,
            other => {
                return Err(Error::invalid_config(format!(
                    "mode {other:?} is not one of l2, l3, l3s"
                )))
            }
        };
        if req.conf.ipam_type.is_none() && req.conf.prev_result.is_none() {
            return Err(Error::invalid_config(
                "ipvlan needs an \"ipam\" section, or a prevResult with addresses when chained",
            ));
        }
        if let Some(m) = &c.master {
            config_ifname("master", m)?;
        }
        Ok((c, mode))
    }

    /// Chained without a master: the single interface of prevResult (reference behaviour).
    fn master_name(&self, req: &Request) -> Result<Option<String>, Error> {
        if self.master.is_some() || req.conf.ipam_type.is_some() {
            return Ok(self.master.clone());
        }
        let Some(prev) = &req.conf.prev_result else {
            return Ok(None);
        };
        match prev.interfaces.as_slice() {
            [only] => {
                config_ifname("prevResult.interfaces[0].name (the master)", &only.name)?;
                Ok(Some(only.name.clone()))
            }
            [] => Ok(None),
            _ => Err(Error::invalid_config(
                "no master given and prevResult has more than one interface to choose from",
            )),
        }
    }
}

impl Plugin for Ipvlan {
    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let (conf, mode) = Conf::load(req)?;
        let master_name = conf.master_name(req)?;
        add_child(
            req,
            conf.link_in_container,
            (master_name.as_deref(), conf.mtu),
            |nl, master, netns| {
                nl.create_ipvlan(IpvlanSpec {
                    name: req.ifname().to_string(),
                    master_index: master.index,
                    mode,
                    mtu: conf.mtu,
                    netns,
                })
            },
            |ns, cont, index| address_from_prev_result(req, ns, cont, index),
        )
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let (_, mode) = Conf::load(req)?;
        check_child(req, "ipvlan", mode, |link| link.ipvlan_mode)
    }

    // ---------------------------------------------------------------- DEL
    /// Needs nothing from the plugin's own keys, so none of them can block it.
    fn del(&self, req: &Request) -> Result<(), Error> {
        del_single_iface(req, "ipvlan")
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        req.conf.typed::<Conf>()?;
        ipam_if_configured(req, Command::Status)
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        req.conf.typed::<Conf>()?;
        ipam_if_configured(req, Command::Gc)
    }
}

/// Chained without IPAM: the addresses prevResult already holds.
fn address_from_prev_result(
    req: &Request,
    ns: &NetNs,
    cont: &mut Netlink,
    index: u32,
) -> Result<CniResult, Error> {
    let prev = req.conf.prev_result.clone().unwrap_or_default();
    if prev.ips.is_empty() {
        return Err(Error::invalid_config(
            "prevResult has no IP addresses for ipvlan",
        ));
    }
    address_single_iface(ns, cont, req, index, prev)
}
