//! Steps shared by the interface plugins: container interface setup from an
//! IPAM result, CHECK read-back, MAC arguments, rollback on a failed ADD.

use crate::cni::delegate;
use crate::cni::{CniResult, Code, Command, Error, Request};
use crate::netlink::{sysctl, Link, NetNs, Netlink, Route as KernelRoute};
use ipnet::IpNet;
use serde_json::Value;
use std::net::IpAddr;

pub use super::container::{delete_container_link, open_netns, OwnLink};

/// The kernel's "main" routing table; routes with no table land there.
const MAIN_TABLE: u32 = 254;

/// `veth` + 8 random hex digits, like the reference (fits IFNAMSIZ).
pub fn random_veth_name() -> String {
    let mut bytes = [0u8; 4];
    // SAFETY: getrandom writes at most `len` bytes into the buffer we own.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Fall back to something unique enough per process and call.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        bytes = (nanos ^ std::process::id().rotate_left(16)).to_be_bytes();
    }
    format!("veth{:08x}", u32::from_be_bytes(bytes))
}

/// The container MAC requested by the runtime, in the order of precedence the
/// reference uses: `runtimeConfig.mac` (capability), `args.cni.mac`, `CNI_ARGS MAC=`.
pub fn requested_mac(req: &Request) -> Result<Option<String>, Error> {
    let from_conf = |v: &Value, key: &str| -> Result<String, Error> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| Error::invalid_config(format!("{key} must be a string, got {v}")))
    };
    let mac = if let Some(v) = req.conf.runtime_config("mac") {
        Some((from_conf(v, "runtimeConfig.mac")?, "runtimeConfig.mac"))
    } else if let Some(v) = req.conf.args_cni("mac") {
        Some((from_conf(v, "args.cni.mac")?, "args.cni.mac"))
    } else {
        req.args.get("MAC").map(|m| (m.to_string(), "CNI_ARGS MAC"))
    };
    mac.map(|(m, key)| validate_mac(&m, key)).transpose()
}

/// Accept `aa:bb:cc:dd:ee:ff` (any case), return it lower-cased.
pub fn validate_mac(mac: &str, key: &str) -> Result<String, Error> {
    let parts: Vec<&str> = mac.split(':').collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()));
    if !ok {
        return Err(Error::invalid_config(format!(
            "{key} {mac:?} is not a MAC address like 0a:58:0a:00:00:05"
        )));
    }
    Ok(mac.to_ascii_lowercase())
}

/// Run `step`; if it fails, release what IPAM gave out for this attachment so
/// a failed ADD leaves no reservation behind (nothing to do without IPAM).
pub fn ipam_rollback_on_error<T>(
    req: &Request,
    step: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    step().inspect_err(|_| {
        if req.conf.ipam_type.is_none() {
            return;
        }
        if let Err(e) = delegate::ipam(req, Command::Del) {
            eprintln!("cleanup after failed ADD: {e}");
        }
    })
}

/// Fill in gateway-less default routes and address the container interface:
/// addresses, link up, then routes (gateway-less routes use the family's gateway).
pub fn configure_iface(
    ns: &NetNs,
    nl: &mut Netlink,
    index: u32,
    ifname: &str,
    result: &CniResult,
    enable_dad: bool,
) -> Result<(), Error> {
    let has_v6 = result.ips.iter().any(|ip| ip.address.addr().is_ipv6());
    if has_v6 {
        ns.run(|| prepare_ipv6(ifname, enable_dad))??;
    }
    for ip in &result.ips {
        nl.add_address(index, ip.address)?;
    }
    nl.set_up(index)?;
    for route in &result.routes {
        let gw = route
            .gw
            .or_else(|| family_gateway(result, route.dst.addr()));
        nl.add_route(&kernel_route(route, gw, index))?;
    }
    Ok(())
}

fn prepare_ipv6(ifname: &str, enable_dad: bool) -> Result<(), Error> {
    // DAD delays a fresh address by a second or more; IPAM already made it unique.
    let dad = if enable_dad { "1" } else { "0" };
    sysctl::set(&format!("net/ipv6/conf/{ifname}/accept_dad"), dad)?;
    sysctl::set(&format!("net/ipv6/conf/{ifname}/disable_ipv6"), "0")?;
    Ok(())
}

fn family_gateway(result: &CniResult, like: IpAddr) -> Option<IpAddr> {
    result
        .ips
        .iter()
        .filter_map(|ip| ip.gateway)
        .find(|gw| gw.is_ipv4() == like.is_ipv4())
}

fn kernel_route(route: &crate::cni::Route, gw: Option<IpAddr>, oif: u32) -> KernelRoute {
    KernelRoute {
        dst: route.dst.trunc(),
        gateway: gw,
        oif: Some(oif),
        mtu: route.mtu,
        advmss: route.advmss,
        priority: route.priority,
        table: route.table,
        scope: route.scope,
    }
}

/// CHECK: every address of `result` that belongs to interface `iface_pos` is
/// on the link, and every route is in the table.
pub fn check_iface_state(
    nl: &mut Netlink,
    index: u32,
    ifname: &str,
    iface_pos: usize,
    result: &CniResult,
) -> Result<(), Error> {
    let present = nl.addresses(index)?;
    for ip in result
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == iface_pos))
    {
        if !present.contains(&ip.address) {
            return Err(Error::new(
                Code::Kernel,
                format!(
                    "CHECK: {ifname} lacks address {} (has {})",
                    ip.address,
                    list(&present)
                ),
            ));
        }
    }
    let routes = nl.routes()?;
    // `routes()` dumps the main table; routes for other tables are not verified.
    for want in result
        .routes
        .iter()
        .filter(|r| r.table.is_none_or(|t| t == MAIN_TABLE))
    {
        let gw = want.gw.or_else(|| family_gateway(result, want.dst.addr()));
        let found = routes
            .iter()
            .any(|r| r.dst == want.dst.trunc() && r.gateway == gw);
        if !found {
            return Err(Error::new(
                Code::Kernel,
                format!(
                    "CHECK: route to {}{} is missing in the container",
                    want.dst,
                    gw.map(|g| format!(" via {g}")).unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

fn list(nets: &[IpNet]) -> String {
    if nets.is_empty() {
        return "none".into();
    }
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first interface of `result` named `ifname` inside `netns`.
pub fn container_iface_pos(result: &CniResult, ifname: &str, netns: &str) -> Option<usize> {
    result
        .interfaces
        .iter()
        .position(|i| i.name == ifname && i.sandbox == netns)
}

/// Refuse ADD when the interface name is taken (spec), with a message naming both.
pub fn ensure_ifname_free(nl: &mut Netlink, ifname: &str, netns: &str) -> Result<(), Error> {
    if nl.link_by_name(ifname)?.is_some() {
        return Err(Error::new(
            Code::InterfaceExists,
            format!("interface {ifname} already exists in netns {netns}"),
        ));
    }
    Ok(())
}

/// An interface name from the configuration (`master`, `bridge`, names made
/// from them) by the kernel's rules, before it reaches any kernel call: a
/// `%d` would make the kernel pick a fresh name, a NUL would cut it short,
/// and either would make DEL miss what ADD made (code 7, naming `key`).
pub fn config_ifname(key: &str, name: &str) -> Result<(), Error> {
    crate::cni::env::validate_ifname(name)
        .map_err(|why| Error::invalid_config(format!("{key} {name:?} {why}")))
}

/// The master link for macvlan/ipvlan: the configured name, or the link of
/// the default route. With `linkInContainer` the lookup happens in the netns.
fn resolve_master(nl: &mut Netlink, master: Option<&str>, where_: &str) -> Result<Link, Error> {
    let link = match master {
        Some(name) => nl.link_by_name(name)?.ok_or_else(|| {
            Error::invalid_config(format!(
                "master interface {name} does not exist in {where_}"
            ))
        })?,
        None => nl.default_route_link()?.ok_or_else(|| {
            Error::invalid_config(format!(
                "no master given and {where_} has no default route to pick one from"
            ))
        })?,
    };
    Ok(link)
}

/// Create a macvlan/ipvlan child for the container and return its index in
/// the container's netns. The master lives on the host (the child is moved
/// into the pod by the create request itself), or, with `linkInContainer`,
/// inside the pod already.
pub fn create_child(
    req: &Request,
    ns: &NetNs,
    cont: &mut Netlink,
    link_in_container: bool,
    (master, mtu): (Option<&str>, Option<u32>),
    create: impl FnOnce(&mut Netlink, &Link, Option<&NetNs>) -> crate::netlink::Result<Link>,
) -> Result<u32, Error> {
    let mut host = if link_in_container {
        None
    } else {
        Some(Netlink::open()?)
    };
    let (nl, where_, target) = match host.as_mut() {
        Some(h) => (h, "the host".to_string(), Some(ns)),
        None => (cont, format!("netns {}", req.netns()), None),
    };
    let master = resolve_master(nl, master, &where_)?;
    check_mtu_against_master(mtu, &master)?;
    Ok(create(nl, &master, target)?.index)
}

/// ADD for macvlan/ipvlan: the child is created for the pod and addressed from
/// IPAM, or by `without_ipam` when the config has none; any failure after the
/// create deletes the link again, so a failed ADD leaves nothing in the pod.
pub fn add_child(
    req: &Request,
    link_in_container: bool,
    master_mtu: (Option<&str>, Option<u32>),
    create: impl FnOnce(&mut Netlink, &Link, Option<&NetNs>) -> crate::netlink::Result<Link>,
    without_ipam: impl FnOnce(&NetNs, &mut Netlink, u32) -> Result<CniResult, Error>,
) -> Result<CniResult, Error> {
    let ns = open_netns(req.netns())?;
    let mut cont = Netlink::open_in(&ns)?;
    ensure_ifname_free(&mut cont, req.ifname(), req.netns())?;
    let index = create_child(req, &ns, &mut cont, link_in_container, master_mtu, create)?;
    let addressed = if req.conf.ipam_type.is_none() {
        without_ipam(&ns, &mut cont, index)
    } else {
        address_from_ipam(req, &ns, &mut cont, index)
    };
    addressed.inspect_err(|_| {
        if let Err(e) = cont.delete_link(index) {
            eprintln!("cleanup after failed ADD: {e}");
        }
    })
}

/// Addresses from IPAM, released again if addressing fails.
fn address_from_ipam(
    req: &Request,
    ns: &NetNs,
    cont: &mut Netlink,
    index: u32,
) -> Result<CniResult, Error> {
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

/// MTU may not exceed the master's (the kernel's error would be EINVAL).
fn check_mtu_against_master(mtu: Option<u32>, master: &Link) -> Result<(), Error> {
    match mtu {
        Some(m) if m > master.mtu => Err(Error::invalid_config(format!(
            "mtu {m} is larger than the master {}'s mtu {}",
            master.name, master.mtu
        ))),
        _ => Ok(()),
    }
}

/// Address a single container interface (macvlan/ipvlan) from `result` and
/// report it as interface 0.
pub fn address_single_iface(
    ns: &NetNs,
    cont: &mut Netlink,
    req: &Request,
    index: u32,
    mut result: CniResult,
) -> Result<CniResult, Error> {
    for ip in &mut result.ips {
        ip.interface = Some(0);
    }
    configure_iface(ns, cont, index, req.ifname(), &result, false)?;
    let link = cont.link_by_index(index)?;
    result.interfaces = vec![crate::cni::Interface {
        name: req.ifname().to_string(),
        mac: link.and_then(|l| l.mac).unwrap_or_default(),
        sandbox: req.netns().to_string(),
        ..Default::default()
    }];
    Ok(result)
}

/// CHECK for macvlan/ipvlan: link of the right kind in the netns, with the
/// prevResult's addresses and routes.
pub fn check_single_iface(req: &Request, kind: &str) -> Result<(Link, CniResult), Error> {
    let Some(prev) = req.conf.prev_result.clone() else {
        return Err(Error::invalid_config("CHECK needs prevResult"));
    };
    ipam_if_configured(req, Command::Check)?;
    let mut found = find_container_link(req, &prev)?;
    if found.link.kind.as_deref() != Some(kind) {
        return Err(Error::new(
            Code::Kernel,
            format!("CHECK: {} is not a {kind}", req.ifname()),
        ));
    }
    check_iface_state(
        &mut found.nl,
        found.link.index,
        req.ifname(),
        found.pos,
        &prev,
    )?;
    Ok((found.link, prev))
}

/// CHECK for macvlan/ipvlan: [`check_single_iface`], then the link's mode
/// (`mode_of` reads it; `None` when the kernel did not report one) against the config's.
pub fn check_child<M: PartialEq + std::fmt::Debug>(
    req: &Request,
    kind: &str,
    mode: M,
    mode_of: impl FnOnce(&Link) -> Option<M>,
) -> Result<(), Error> {
    let (link, _) = check_single_iface(req, kind)?;
    let actual = mode_of(&link);
    if actual.as_ref().is_some_and(|m| *m != mode) {
        return Err(Error::new(
            Code::Kernel,
            format!(
                "CHECK: {} has {kind} mode {actual:?}, config says {mode:?}",
                link.name
            ),
        ));
    }
    Ok(())
}

/// CHECK's view of the container interface: where prevResult lists it, and
/// the link as it is in the netns (with a socket there for further reads).
pub struct ContainerLink {
    pub pos: usize,
    pub nl: Netlink,
    pub link: Link,
}

pub fn find_container_link(req: &Request, prev: &CniResult) -> Result<ContainerLink, Error> {
    let pos = container_iface_pos(prev, req.ifname(), req.netns()).ok_or_else(|| {
        Error::invalid_config(format!(
            "CHECK: prevResult has no interface {} in {}",
            req.ifname(),
            req.netns()
        ))
    })?;
    let ns = open_netns(req.netns())?;
    let mut nl = Netlink::open_in(&ns)?;
    let link = nl.link_by_name(req.ifname())?.ok_or_else(|| {
        Error::new(
            Code::Kernel,
            format!(
                "CHECK: interface {} is missing in {}",
                req.ifname(),
                req.netns()
            ),
        )
    })?;
    Ok(ContainerLink { pos, nl, link })
}

/// Run the IPAM plugin for `command` when the config has one (STATUS, GC,
/// CHECK and DEL of plugins whose only other state is in the netns).
pub fn ipam_if_configured(req: &Request, command: Command) -> Result<(), Error> {
    if req.conf.ipam_type.is_some() {
        delegate::ipam(req, command)?;
    }
    Ok(())
}

/// `daemonSocket` when it is a string, for a DEL whose configuration is
/// otherwise unusable.
pub fn daemon_socket_of(req: &Request) -> Option<std::path::PathBuf> {
    let path = req.conf.raw.get("daemonSocket")?.as_str()?;
    Some(path.into())
}

/// DEL for macvlan/ipvlan: IPAM first (so the lease goes even if the netns is
/// gone), then the link; the master is never needed (plugins#953).
pub fn del_single_iface(req: &Request, kind: &str) -> Result<(), Error> {
    // Both steps run even if the first fails: a broken IPAM must not keep the link.
    let ipam = ipam_if_configured(req, Command::Del);
    let ours = OwnLink { kind, bridge: None };
    let link = delete_container_link(req.netns(), req.ifname(), ours);
    Error::all([ipam, link])
}
