//! ipvlan: an IP-VLAN child of a master (shares the master's MAC). Needs
//! addresses, from IPAM or, when chained, from prevResult.

use super::child::{add_child, address_single_iface, ChildConf, ChildKind, Loaded};
use crate::cni::{CniResult, Error, Request};
use crate::netlink::{ChildLink, IpvlanMode, IpvlanSpec, Link, NetNs, Netlink};
use crate::plugins::conf_keys::config_ifname;
use crate::plugins::pod_interface::{Ipv6Setup, LinkLocalOff};
use serde::de::IgnoredAny;

pub struct Ipvlan;

impl ChildKind for Ipvlan {
    const KIND: &'static str = "ipvlan";
    /// The reference ipvlan never reads them.
    const READS_CNI_ARGS: bool = false;
    const MODES: &'static [(&'static str, IpvlanMode)] = &[
        ("l2", IpvlanMode::L2),
        ("l3", IpvlanMode::L3),
        ("l3s", IpvlanMode::L3s),
    ];
    /// No keys beside the shared [`ChildConf`].
    type Conf = IgnoredAny;
    type Mode = IpvlanMode;

    fn require(req: &Request) -> Result<(), Error> {
        if req.conf.ipam_type.is_none() && req.conf.prev_result.is_none() {
            return Err(Error::invalid_config(
                "ipvlan needs an \"ipam\" section, or a prevResult with addresses when chained",
            ));
        }
        Ok(())
    }

    /// Only that the keys parse: STATUS and GC carry no prevResult, which
    /// [`ChildKind::require`] asks of an ipvlan without IPAM.
    fn validate(req: &Request) -> Result<(), Error> {
        req.conf.typed::<ChildConf>().map(drop)
    }

    fn mode_of(link: &Link) -> Option<IpvlanMode> {
        link.ipvlan_mode
    }

    fn add_link(req: &Request, conf: Loaded<Self>) -> Result<CniResult, Error> {
        let Loaded { shared, mode, .. } = conf;
        let master_name = master_name(&shared, req)?;
        add_child(
            req,
            shared.link_in_container,
            (master_name.as_deref(), shared.mtu),
            |nl, link| {
                nl.create_ipvlan(IpvlanSpec {
                    // As the reference (ipvlan.go:297): an ipvlan always gets addresses.
                    link: ChildLink {
                        arp_notify: true,
                        ..link
                    },
                    mode,
                })
            },
            |ns, cont, index| address_from_prev_result(req, ns, cont, index),
        )
    }
}

/// The master: the configured one; chained without one, the single interface
/// of prevResult, with IPAM or without (the reference's rule); otherwise (and
/// when prevResult lists no interface) the default route's.
pub(super) fn master_name(conf: &ChildConf, req: &Request) -> Result<Option<String>, Error> {
    if conf.master.is_some() {
        return Ok(conf.master.clone());
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
    // As the reference (ipvlan.go:298): its IPv6 addresses are announced too; made
    // with arp_notify, it has no link-local address from the kernel (see child_ipv6).
    let v6 = Ipv6Setup {
        ndisc_notify: true,
        link_local_off: LinkLocalOff::Done,
        ..Ipv6Setup::default()
    };
    address_single_iface(ns, cont, req, index, v6, prev)
}
