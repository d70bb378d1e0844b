//! host-device: an existing host network device (an SR-IOV VF, an RDMA NIC, any link)
//! moved into the pod as CNI_IFNAME, addressed from IPAM when there is one; DEL moves
//! it back to the host under its original name.
//!
//! The original name travels with the device as its alias (IFLA_IFALIAS), as in the
//! reference, so DEL needs neither prevResult nor any state of ours, and the two
//! implementations can DEL each other's attachments. ADD moves, renames and sets the
//! alias in one RTM_SETLINK (see `netlink::move_link`); DEL moves the device back under
//! its alias. Where the reference fails DEL when that name was taken on the host
//! meanwhile, the device comes back as `<name>_<n>` (the first free
//! one), keeping the alias, and DEL succeeds. When the pod's netns is gone the kernel has
//! already returned a physical device to the initial netns (under its pod name, or
//! `dev<n>`); DEL renames it back from its alias there (see [`restore`]).

mod conf;
mod restore;
#[cfg(test)]
mod tests;

use crate::cni::{CniResult, Command, Error, Interface, Plugin, Request};
use crate::netlink::{ErrorKind, Link, NetNs, Netlink};
use crate::plugins::conf_keys::with_configured_dns;
use crate::plugins::ipam_delegation::{ipam_add, ipam_if_configured, ipam_rollback_on_error};
use crate::plugins::pod_interface::{
    address_iface, ensure_ifname_free, expect_mac, find_container_link, route_iface, Ipv6Setup,
};
use crate::plugins::pod_netns::{is_own_netns, netns_for_del, open_netns};
use conf::{find_host_link, load, Selector};
use restore::{restore_refunded, return_to_host};

pub struct HostDevice;

impl Plugin for HostDevice {
    // The reference never calls types.LoadArgs: `reads_cni_args` stays false.

    // ---------------------------------------------------------------- ADD
    /// Find the device on the host, move it into the pod as CNI_IFNAME (its name in
    /// its alias), then IPAM and addresses. Any failure after the move brings it back
    /// under its own name, up again if it was up, and IPAM's lease is released.
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let sel = load(req)?;
        let ns = open_netns(req.netns())?;
        let iface = Interface {
            name: req.ifname().to_string(),
            sandbox: req.netns().to_string(),
            ..Default::default()
        };
        if let Selector::Dpdk(_) = sel {
            // No kernel device to move: the result names the interface, IPAM leases.
            return with_ipam(req, iface, |_| Ok(()));
        }
        let mut host = Netlink::open()?;
        let dev = find_host_link(&mut host, &sel)?;
        let mut cont = Netlink::open_in(&ns)?;
        ensure_ifname_free(&mut cont, req.ifname(), req.netns())?;
        let host_ns = NetNs::current()?;
        let moved = host
            .move_link_to(dev.index, &ns, req.ifname(), &dev.name)
            .map_err(Error::from)
            .and_then(|()| {
                cont.link_by_name(req.ifname())?.ok_or_else(|| {
                    Error::check_failed(format_args!(
                        "{} moved into {} but is not there as {}",
                        dev.name,
                        req.netns(),
                        req.ifname()
                    ))
                })
            });
        let outcome = moved.and_then(|link| attach(req, &ns, &mut cont, &link, iface));
        outcome.inspect_err(|_| undo_move(&mut host, &mut cont, &host_ns, req.ifname(), &dev))
    }

    // ---------------------------------------------------------------- CHECK
    /// IPAM's CHECK, then prevResult's interface in the pod: there as CNI_IFNAME with
    /// its MAC, addresses and routes (nothing to look at in DPDK mode).
    fn check(&self, req: &Request) -> Result<(), Error> {
        let sel = load(req)?;
        open_netns(req.netns())?;
        ipam_if_configured(req, Command::Check)?;
        let Some(prev) = &req.conf.prev_result else {
            return Err(Error::invalid_config("Required prevResult missing"));
        };
        if let Selector::Dpdk(_) = sel {
            return Ok(());
        }
        let mut found = find_container_link(req, prev)?;
        expect_mac(&found.link, &prev.interfaces[found.pos].mac)?;
        found.check_iface_state(prev)
    }

    // ---------------------------------------------------------------- DEL
    /// IPAM's DEL always (also with no netns), then the device back to the host; both
    /// run even if one fails. A configuration DEL cannot use selects nothing: the
    /// device's alias is enough to return it.
    fn del(&self, req: &Request) -> Result<(), Error> {
        let sel = req.conf_or_del_fallback(|r| load(r).map(Some), |_| None)?;
        let ipam = ipam_if_configured(req, Command::Del);
        let link = match sel {
            Some(Selector::Dpdk(_)) => Ok(()),
            sel => del_link(req, sel.as_ref()),
        };
        Error::all([ipam, link])
    }

    // ---------------------------------------------------------------- STATUS
    /// IPAM's STATUS after the keys decode (the reference looks at no device either).
    fn status(&self, req: &Request) -> Result<(), Error> {
        req.conf.typed::<conf::Conf>()?;
        ipam_if_configured(req, Command::Status)
    }

    // ---------------------------------------------------------------- GC
    /// IPAM's GC (the reference has no GC): the devices go back with their DELs.
    fn gc(&self, req: &Request) -> Result<(), Error> {
        req.conf.typed::<conf::Conf>()?;
        ipam_if_configured(req, Command::Gc)
    }
}

/// After the move: up without IPAM; with it, its addresses and routes (which bring
/// the link up), the lease released if that fails.
fn attach(
    req: &Request,
    ns: &NetNs,
    cont: &mut Netlink,
    link: &Link,
    mut iface: Interface,
) -> Result<CniResult, Error> {
    iface.mac = link.mac.clone().unwrap_or_default();
    if req.conf.ipam_type.is_none() {
        cont.set_up(link.index)?;
        return Ok(CniResult {
            interfaces: vec![iface],
            ..Default::default()
        });
    }
    with_ipam(req, iface, |r| {
        address_iface(ns, cont, link.index, req.ifname(), r, Ipv6Setup::default())?;
        route_iface(cont, link.index, r)
    })
}

/// IPAM's ADD, its addresses all on interface 0, `apply`'d; no IPAM: the interface.
fn with_ipam(
    req: &Request,
    iface: Interface,
    apply: impl FnOnce(&CniResult) -> Result<(), Error>,
) -> Result<CniResult, Error> {
    if req.conf.ipam_type.is_none() {
        return Ok(CniResult {
            interfaces: vec![iface],
            ..Default::default()
        });
    }
    let mut r = ipam_add(req)?;
    ipam_rollback_on_error(req, || {
        if r.ips.is_empty() {
            return Err(Error::invalid_config(
                "IPAM plugin returned missing IP config",
            ));
        }
        for ip in &mut r.ips {
            ip.interface = Some(0);
        }
        r.interfaces = vec![iface];
        apply(&r)?;
        Ok(with_configured_dns(req, r))
    })
}

/// A failed ADD: the device back on the host under its own name (wherever the failed
/// step left it), and up again if it was.
fn undo_move(host: &mut Netlink, cont: &mut Netlink, host_ns: &NetNs, ifname: &str, dev: &Link) {
    let still_home = matches!(host.link_by_index(dev.index), Ok(Some(l)) if l.name == dev.name);
    if !still_home {
        // In the pod as CNI_IFNAME, or (a rename that failed after the move) as its name.
        let in_pod = [ifname, dev.name.as_str()].into_iter().find_map(|n| {
            cont.link_by_name(n)
                .ok()
                .flatten()
                .filter(|l| l.mac == dev.mac)
        });
        if let Some(link) = in_pod {
            if let Err(e) = return_to_host(cont, &link, &dev.name, host_ns) {
                eprintln!("cleanup after failed ADD: {e}");
            }
        }
    }
    if dev.up {
        match host.link_by_name(&dev.name) {
            Ok(Some(l)) => {
                if let Err(e) = host.set_up(l.index) {
                    eprintln!("cleanup after failed ADD: {e}");
                }
            }
            _ => eprintln!(
                "cleanup after failed ADD: {} is not back on the host",
                dev.name
            ),
        }
    }
}

/// DEL of the device: from the pod back to the host under the name in its alias. No
/// netns: a device the kernel returned is renamed back. A link named CNI_IFNAME without
/// an alias is not one host-device moved (the reference fails DEL here; the runtime
/// would repeat it forever): it stays, reported on stderr.
fn del_link(req: &Request, sel: Option<&Selector>) -> Result<(), Error> {
    let Some(ns) = netns_for_del(req.netns())? else {
        if let Some(sel) = sel {
            restore_refunded(sel, req.ifname());
        }
        return Ok(());
    };
    if is_own_netns(&ns)? {
        eprintln!(
            "DEL: CNI_NETNS {} is this plugin's own network namespace; leaving {} there alone",
            req.netns(),
            req.ifname()
        );
        return Ok(());
    }
    let mut cont = Netlink::open_in(&ns)?;
    let Some(link) = cont.link_by_name(req.ifname())? else {
        return Ok(());
    };
    let configured = match sel {
        Some(Selector::Name(n)) => Some(n.clone()),
        _ => None,
    };
    let original = restore::original_name(&link).or(configured);
    let Some(original) = original else {
        eprintln!(
            "DEL: {} in {} has no alias naming its host device; leaving it alone",
            req.ifname(),
            req.netns()
        );
        return Ok(());
    };
    let host_ns = NetNs::current()?;
    match return_to_host(&mut cont, &link, &original, &host_ns) {
        Ok(name) if name != original => {
            eprintln!("DEL: {original} is taken on the host: the device came back as {name}");
            Ok(())
        }
        other => other.map(drop),
    }
}

/// Whether `e` is the kernel's "that name is taken" (EEXIST).
pub(super) fn is_name_taken(e: &crate::netlink::Error) -> bool {
    e.kind == ErrorKind::AlreadyExists
}
