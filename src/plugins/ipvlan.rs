//! ipvlan: an IP-VLAN child of a master (shares the master's MAC). Needs
//! addresses, from IPAM or, when chained, from prevResult.

use super::common::{
    address_single_iface, check_single_iface, config_ifname, create_child, del_single_iface,
    ensure_ifname_free, ipam_if_configured, ipam_rollback_on_error, open_netns,
};
use crate::cni::delegate;
use crate::cni::{CniResult, Code, Command, Error, Plugin, Request};
use crate::netlink::{IpvlanMode, IpvlanSpec, NetNs, Netlink};
use serde::Deserialize;

pub struct Ipvlan;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
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
    fn load(req: &Request) -> Result<(Conf, IpvlanMode), Error> {
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
        let ns = open_netns(req.netns())?;
        let mut cont = Netlink::open_in(&ns)?;
        ensure_ifname_free(&mut cont, req.ifname(), req.netns())?;

        let index = create_child(
            req,
            &ns,
            &mut cont,
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
        )?;

        address(req, &ns, &mut cont, index).inspect_err(|_| {
            if let Err(e) = cont.delete_link(index) {
                eprintln!("cleanup after failed ADD: {e}");
            }
        })
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let (_, mode) = Conf::load(req)?;
        let (link, _) = check_single_iface(req, "ipvlan")?;
        if link.ipvlan_mode.is_some_and(|m| m != mode) {
            return Err(Error::new(
                Code::Kernel,
                format!(
                    "CHECK: {} has ipvlan mode {:?}, config says {mode:?}",
                    link.name, link.ipvlan_mode
                ),
            ));
        }
        Ok(())
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

/// Addresses from IPAM (released again if addressing fails) or from prevResult.
fn address(req: &Request, ns: &NetNs, cont: &mut Netlink, index: u32) -> Result<CniResult, Error> {
    if req.conf.ipam_type.is_none() {
        let prev = req.conf.prev_result.clone().unwrap_or_default();
        if prev.ips.is_empty() {
            return Err(Error::invalid_config(
                "prevResult has no IP addresses for ipvlan",
            ));
        }
        return address_single_iface(ns, cont, req, index, prev);
    }
    let ipam = delegate::ipam(req, Command::Add)?.unwrap_or_default();
    ipam_rollback_on_error(req, || {
        if ipam.ips.is_empty() {
            return Err(Error::new(
                Code::Delegate,
                "IPAM plugin returned no IP addresses",
            ));
        }
        address_single_iface(ns, cont, req, index, ipam)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::gojson::{assert_known, struct_fields};

    #[test]
    fn config_keys_get_go_matching() {
        assert_known(&[struct_fields::<Conf>()]);
    }

    #[test]
    fn master_names_follow_the_kernels_rules() {
        let fw = std::sync::Arc::new(crate::firewall::Recording::default());
        for bad in ["eth%d", "a\u{0}b", "a/b", "eth 0", "0123456789abcdef"] {
            let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "ipvlan",
                "master": bad, "ipam": {"type": "ipamd"}});
            let req = crate::cni::runner::test_request(crate::cni::Command::Add, conf, fw.clone());
            assert_eq!(Conf::load(&req).unwrap_err().code, 7, "{bad:?}");
        }
    }
}
