//! Steps shared by the interface plugins: container interface setup from an
//! IPAM result, CHECK read-back, MAC arguments, rollback on a failed ADD.

use crate::cni::delegate;
use crate::cni::{CniResult, Code, Command, Error, Request};
use crate::netlink::{random_bytes, sysctl, Link, NetNs, Netlink, Route as KernelRoute};
use ipnet::IpNet;
use serde_json::Value;
use std::net::IpAddr;

pub use super::container::{delete_container_link, open_netns, OwnLink};

/// The kernel's "main" routing table; routes with no table land there.
const MAIN_TABLE: u32 = 254;

/// `veth` + 8 random hex digits, like the reference (fits IFNAMSIZ).
pub fn random_veth_name() -> String {
    format!("veth{:08x}", u32::from_be_bytes(random_bytes()))
}

/// The smallest and largest MTU an Ethernet-like link takes (the kernel's
/// ETH_MIN_MTU and ETH_MAX_MTU).
const MTU_RANGE: std::ops::RangeInclusive<u32> = 68..=65535;

/// The `mtu` key: 0 means "not set", as in the reference's Go structs; any
/// other value outside what the kernel takes is refused here, before a link
/// is made, instead of coming back from the kernel half-way through ADD.
pub fn configured_mtu(mtu: Option<u32>) -> Result<Option<u32>, Error> {
    match mtu {
        None | Some(0) => Ok(None),
        Some(m) if MTU_RANGE.contains(&m) => Ok(Some(m)),
        Some(m) => Err(Error::invalid_config(format!(
            "mtu {m} must be between {} and {}",
            MTU_RANGE.start(),
            MTU_RANGE.end()
        ))),
    }
}

/// The configuration's `dns`, when it sets anything, is the result's (the
/// reference interface plugins report it, and Podman writes it into the
/// container's resolv.conf); otherwise whatever IPAM returned.
pub fn with_configured_dns(req: &Request, mut result: CniResult) -> CniResult {
    if !req.conf.dns.is_empty() {
        result.dns = req.conf.dns.clone();
    }
    result
}

/// The container MAC requested by the runtime, in the order of precedence the
/// reference uses: `runtimeConfig.mac` (capability), `args.cni.mac`, `CNI_ARGS MAC=`.
/// An empty value is not set, and the next one counts, as in the reference.
pub fn requested_mac(req: &Request) -> Result<Option<String>, Error> {
    let from_conf = |v: &Value, key: &'static str| -> Result<Option<(String, &str)>, Error> {
        match v.as_str() {
            Some(s) => Ok(Some((s.to_string(), key))),
            None => Err(Error::invalid_config(format!(
                "{key} must be a string, got {v}"
            ))),
        }
    };
    let candidates = [
        req.conf
            .runtime_config("mac")
            .map(|v| from_conf(v, "runtimeConfig.mac"))
            .transpose()?
            .flatten(),
        req.conf
            .args_cni("mac")
            .map(|v| from_conf(v, "args.cni.mac"))
            .transpose()?
            .flatten(),
        req.args.get("MAC").map(|m| (m.to_string(), "CNI_ARGS MAC")),
    ];
    let chosen = candidates
        .into_iter()
        .flatten()
        .find(|(m, _)| !m.is_empty());
    chosen.map(|(m, key)| validate_mac(&m, key)).transpose()
}

/// A MAC in any form Go's `net.ParseMAC` reads — `0a:58:0a:00:00:05`,
/// `0A-58-0A-00-00-05`, `0a58.0a00.0005` — as lower-case `0a:58:0a:00:00:05`,
/// the form the kernel reports. `net.ParseMAC` also reads 8- and 20-byte
/// addresses (EUI-64, InfiniBand); an Ethernet link cannot take those, so they
/// are refused here by name rather than by the kernel half-way through ADD.
pub fn validate_mac(mac: &str, key: &str) -> Result<String, Error> {
    let bytes = parse_mac(mac).ok_or_else(|| {
        Error::invalid_config(format!(
            "{key} {mac:?} is not a MAC address like 0a:58:0a:00:00:05"
        ))
    })?;
    if bytes.len() != 6 {
        return Err(Error::invalid_config(format!(
            "{key} {mac:?} is a {}-byte hardware address (EUI-64 or InfiniBand); an Ethernet link takes a 6-byte MAC",
            bytes.len()
        )));
    }
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(hex.join(":"))
}

/// `net.ParseMAC`'s grammar: 6, 8 or 20 bytes, as two-digit groups separated
/// by one of `:` or `-` throughout, or as four-digit groups separated by `.`.
fn parse_mac(s: &str) -> Option<Vec<u8>> {
    let byte = |pair: &str| {
        (pair.len() == 2 && pair.bytes().all(|c| c.is_ascii_hexdigit()))
            .then(|| u8::from_str_radix(pair, 16).ok())
            .flatten()
    };
    let sep = s.chars().find(|c| matches!(c, ':' | '-' | '.'))?;
    let width = if sep == '.' { 4 } else { 2 };
    let mut bytes = Vec::new();
    for group in s.split(sep) {
        if group.len() != width || !group.is_ascii() {
            return None;
        }
        for i in (0..width).step_by(2) {
            bytes.push(byte(&group[i..i + 2])?);
        }
    }
    matches!(bytes.len(), 6 | 8 | 20).then_some(bytes)
}

/// IPAM ADD. When it fails, IPAM DEL follows (the spec asks it of a plugin
/// whose delegate's ADD failed), so that an IPAM plugin that allocated part
/// of what it was asked for can let go of it.
pub fn ipam_add(req: &Request) -> Result<CniResult, Error> {
    ipam_rollback_on_error(req, || delegate::ipam(req, Command::Add)).map(Option::unwrap_or_default)
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
    // An IPv6 route (say ::/0 from IPAM's routes on an IPv4-only range) needs
    // IPv6 on the interface even without an IPv6 address of its own.
    let has_v6 = result.ips.iter().any(|ip| ip.address.addr().is_ipv6())
        || result.routes.iter().any(|r| r.dst.addr().is_ipv6());
    if has_v6 {
        ns.run(|| prepare_ipv6(ifname, enable_dad))??;
    } else {
        ns.run(|| without_ipv6(ifname))??;
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

/// An interface with no IPv6 address or route to carry gets no IPv6 at all (set
/// before it goes up): otherwise its link-local address's DAD, router and
/// MLD solicitations are multicast, which a bridge floods to every port and
/// every pod then handles — a cost of each new pod that grows with the pods
/// already there. A kernel without IPv6 has nothing to turn off.
pub fn without_ipv6(ifname: &str) -> Result<(), Error> {
    match sysctl::set(&format!("net/ipv6/conf/{ifname}/disable_ipv6"), "1") {
        Err(e) if e.is_not_found() => Ok(()),
        other => Ok(other?),
    }
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
            return Err(Error::check_failed(format_args!(
                "{ifname} lacks address {} (has {})",
                ip.address,
                list(&present)
            )));
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
            return Err(Error::check_failed(format_args!(
                "route to {}{} is missing in the container",
                want.dst,
                gw.map(|g| format!(" via {g}")).unwrap_or_default()
            )));
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
        Error::check_failed(format_args!(
            "interface {} is missing in {}",
            req.ifname(),
            req.netns()
        ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::args::CniArgs;
    use crate::plugins::firewall_backend::test_request;
    use serde_json::json;

    #[test]
    fn macs_in_every_form_go_reads_come_out_lower_case_with_colons() {
        for mac in [
            "0a:58:0a:00:00:05",
            "0A:58:0A:00:00:05",
            "0a-58-0a-00-00-05",
            "0a58.0a00.0005",
            "0A58.0A00.0005",
        ] {
            assert_eq!(validate_mac(mac, "mac").unwrap(), "0a:58:0a:00:00:05");
        }
        for bad in [
            "0a:58:0a:00:00",
            "0a:58:0a:00:00:05:",
            "0a:58-0a:00:00:05",
            "0a5:80a:000:05",
            "0a580a000005",
            "0a58:0a00:0005",
            "0a.58.0a.00.00.05",
            "0g:58:0a:00:00:05",
            " 0a:58:0a:00:00:05",
            "0a:58:0a:00:00:é5",
        ] {
            let e = validate_mac(bad, "runtimeConfig.mac").unwrap_err();
            assert_eq!(e.code, 7, "{bad}");
            assert!(e.msg.contains("runtimeConfig.mac"), "{bad}: {}", e.msg);
        }
        // EUI-64 and InfiniBand addresses parse, but no Ethernet link takes one.
        let ib = "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01";
        for long in ["02:00:5e:10:00:00:00:01", "0200.5e10.0000.0001", ib] {
            let e = validate_mac(long, "mac").unwrap_err();
            assert!(
                e.msg.contains("6-byte") && e.msg.contains("mac"),
                "{long}: {}",
                e.msg
            );
        }
    }

    #[test]
    fn an_empty_requested_mac_is_not_set_and_the_next_one_counts() {
        let req = |extra: serde_json::Value, env: &str| {
            let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge"});
            conf.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let mut r = test_request(crate::cni::Command::Add, conf);
            r.args = CniArgs::parse(env).unwrap();
            requested_mac(&r)
        };
        let none = json!({"runtimeConfig": {"mac": ""}, "args": {"cni": {"mac": ""}}});
        assert_eq!(req(none.clone(), "MAC=").unwrap(), None);
        assert_eq!(
            req(none, "MAC=0A-58-0A-00-00-07").unwrap().as_deref(),
            Some("0a:58:0a:00:00:07")
        );
        let args = json!({"runtimeConfig": {"mac": ""}, "args": {"cni": {"mac": "0a580a000006"}}});
        assert!(req(args, "").is_err(), "a bad value still counts");
        let args =
            json!({"runtimeConfig": {"mac": ""}, "args": {"cni": {"mac": "0a58.0a00.0006"}}});
        assert_eq!(
            req(args, "MAC=0a:58:0a:00:00:07").unwrap().as_deref(),
            Some("0a:58:0a:00:00:06")
        );
        let first =
            json!({"runtimeConfig": {"mac": "0a:58:0a:00:00:05"}, "args": {"cni": {"mac": ""}}});
        assert_eq!(
            req(first, "MAC=0a:58:0a:00:00:07").unwrap().as_deref(),
            Some("0a:58:0a:00:00:05")
        );
    }
}
