//! macvlan: a MAC-VLAN child of a host (or in-container) master, moved into
//! the container. IPAM is optional: without it the link is L2 only.

use super::common::{
    address_single_iface, check_single_iface, config_ifname, create_child, del_single_iface,
    ensure_ifname_free, ipam_if_configured, ipam_rollback_on_error, open_netns, requested_mac,
};
use crate::cni::delegate;
use crate::cni::{CniResult, Code, Command, Error, Interface, Plugin, Request};
use crate::netlink::{MacvlanMode, MacvlanSpec, Netlink};
use serde::Deserialize;

pub struct Macvlan;

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
    mac: Option<String>,
    #[serde(default)]
    link_in_container: bool,
    #[serde(default)]
    bcqueuelen: Option<u32>,
}

impl Conf {
    fn load(req: &Request) -> Result<(Conf, MacvlanMode), Error> {
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
        let ns = open_netns(req.netns())?;
        let mut cont = Netlink::open_in(&ns)?;
        ensure_ifname_free(&mut cont, req.ifname(), req.netns())?;

        let index = create_child(
            req,
            &ns,
            &mut cont,
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
        )?;

        let outcome = address_or_l2(req, &ns, &mut cont, index);
        outcome.inspect_err(|_| {
            if let Err(e) = cont.delete_link(index) {
                eprintln!("cleanup after failed ADD: {e}");
            }
        })
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let (_, mode) = Conf::load(req)?;
        let (link, _) = check_single_iface(req, "macvlan")?;
        if link.macvlan_mode.is_some_and(|m| m != mode) {
            return Err(Error::new(
                Code::Kernel,
                format!(
                    "CHECK: {} has macvlan mode {:?}, config says {mode:?}",
                    link.name, link.macvlan_mode
                ),
            ));
        }
        Ok(())
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

/// With IPAM, address the link (releasing the lease if that fails); without,
/// just bring it up.
fn address_or_l2(
    req: &Request,
    ns: &crate::netlink::NetNs,
    cont: &mut Netlink,
    index: u32,
) -> Result<CniResult, Error> {
    if req.conf.ipam_type.is_none() {
        return l2_only(cont, req, index);
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
            let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "macvlan",
                "master": bad, "ipam": {"type": "ipamd"}});
            let req = crate::cni::runner::test_request(crate::cni::Command::Add, conf, fw.clone());
            assert_eq!(Conf::load(&req).unwrap_err().code, 7, "{bad:?}");
        }
    }
}
