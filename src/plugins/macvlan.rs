//! macvlan: a MAC-VLAN child of a host (or in-container) master, moved into
//! the container. IPAM is optional: without it the link is L2 only.

use super::common::{
    add_child, check_child, config_ifname, del_single_iface, ipam_if_configured, requested_mac,
};
use crate::cni::{CniResult, Command, Error, Interface, Plugin, Request};
use crate::netlink::{MacvlanMode, MacvlanSpec, Netlink};
use serde::Deserialize;

pub struct Macvlan;

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
    mac: Option<String>,
    #[serde(default)]
    link_in_container: bool,
    #[serde(default)]
    bcqueuelen: Option<u32>,
}

impl Conf {
    pub(super) fn load(req: &Request) -> Result<(Conf, MacvlanMode), Error> {
        let mut c: Conf = req.conf.typed()?;
        // 0 means "not set" in the reference's Go structs.
        c.mtu = c.mtu.filter(|&m| m != 0);
        let mode = match c.mode.as_deref().unwrap_or("bridge") {
            "bridge" | "" => MacvlanMode::Bridge,
            "private" => MacvlanMode::Private,
            "vepa" => MacvlanMode::Vepa,
            "passthru" => MacvlanMode::Passthru,
            other => {
                return Err(Error::invalid_config(format!(
                    "mode {other:?} is not one of bridge, private, vepa, passthru"
                )))
            }
        };
        if let Some(m) = &c.master {
            config_ifname("master", m)?;
        }
        Ok((c, mode))
    }
}

impl Plugin for Macvlan {
    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let (conf, mode) = Conf::load(req)?;
        let mac = match requested_mac(req)? {
            Some(m) => Some(m),
            None => conf
                .mac
                .as_deref()
                .map(|m| super::common::validate_mac(m, "mac"))
                .transpose()?,
        };
        add_child(
            req,
            conf.link_in_container,
            (conf.master.as_deref(), conf.mtu),
            |nl, master, netns| {
                nl.create_macvlan(MacvlanSpec {
                    name: req.ifname().to_string(),
                    master_index: master.index,
                    mode,
                    mtu: conf.mtu,
                    mac,
                    bc_queue_len: conf.bcqueuelen,
                    netns,
                })
            },
            |_, cont, index| l2_only(cont, req, index),
        )
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let (_, mode) = Conf::load(req)?;
        check_child(req, "macvlan", mode, |link| link.macvlan_mode)
    }

    // ---------------------------------------------------------------- DEL
    /// Needs nothing from the plugin's own keys, so none of them can block it.
    fn del(&self, req: &Request) -> Result<(), Error> {
        del_single_iface(req, "macvlan")
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        Conf::load(req)?;
        ipam_if_configured(req, Command::Status)
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        Conf::load(req)?;
        ipam_if_configured(req, Command::Gc)
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
