//! static: the reference IPAM plugin that hands out exactly the addresses it is told to,
//! with the configured routes and DNS. It keeps no state: DEL, STATUS and GC have nothing
//! to do. The addresses come from one of three places, merged as the reference v1.9.1
//! merges them (`LoadIPAMConfig`):
//!
//! 1. `ipam.addresses`, then the addresses of `CNI_ARGS IP=` appended; `CNI_ARGS GATEWAY=`
//!    sets the gateway of each `IP=` address whose subnet holds it (never of a configured
//!    one, which has its own `gateway` key);
//! 2. `args.cni.ips`, when it lists any, replaces all of that;
//! 3. `runtimeConfig.ips` (capability `ips`), when it lists any, replaces whatever came
//!    before, `args.cni.ips` included.
//!
//! Every address is a CIDR (`10.10.0.1/24`): one without a prefix is refused wherever it
//! comes from, since the prefix decides the subnet route the interface plugin makes.

use crate::cni::config::without_nulls;
use crate::cni::{CniResult, Code, Dns, Error, IpConfig, Plugin, Request, Route, Version};
use ipamd::config::IpamConfig;
use ipnet::IpNet;
use serde_json::Value;
use std::net::IpAddr;

/// The `static` plugin.
pub struct Static;

/// One address to hand out, as the reference holds it while merging: a configured
/// `address` stays text until every source is merged (a replaced one is never parsed).
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// `ipam.addresses[i].address` as written; None for addresses from the runtime.
    text: Option<String>,
    parsed: Option<IpNet>,
    gateway: Option<IpAddr>,
}

/// The configuration once merged and validated: what ADD returns.
#[derive(Debug, Clone, PartialEq)]
struct StaticConf {
    addresses: Vec<(IpNet, Option<IpAddr>)>,
    routes: Vec<Route>,
    dns: Dns,
}

impl Plugin for Static {
    /// The reference decodes `IP` and `GATEWAY` with `types.LoadArgs`: strict.
    fn reads_cni_args(&self) -> bool {
        true
    }

    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = load(req)?;
        // The reference prints its result in the configuration's version, and a result
        // before 0.3.0 cannot be made without an address.
        if req.conf.version.has_legacy_result() && conf.addresses.is_empty() {
            return Err(Error::invalid_config(format!(
                "static has no address to return, and a cniVersion {} result needs one: set ipam.addresses, CNI_ARGS IP, args.cni.ips or runtimeConfig.ips",
                req.conf.version
            )));
        }
        Ok(CniResult {
            interfaces: Vec::new(),
            ips: conf
                .addresses
                .into_iter()
                .map(|(address, gateway)| IpConfig {
                    address,
                    gateway,
                    interface: None,
                })
                .collect(),
            routes: conf.routes,
            dns: conf.dns,
        })
    }

    // ---------------------------------------------------------------- CHECK
    /// The configuration is valid, and each of its addresses is among prevResult's, with
    /// the configured gateway if one is configured. The reference fails only on a gateway
    /// that differs and lets an address missing from prevResult pass; here that fails too.
    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = load(req)?;
        let Some(prev) = &req.conf.prev_result else {
            return Err(Error::invalid_config("CHECK needs prevResult"));
        };
        check_against(&conf, prev, req.ifname())
    }

    // ---------------------------------------------------------------- DEL
    /// Nothing was allocated, so nothing is released, whatever the configuration says.
    fn del(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    // ---------------------------------------------------------------- STATUS
    /// Always ready: there is no pool to run out of.
    fn status(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    // ---------------------------------------------------------------- GC
    /// No state to collect.
    fn gc(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }
}

/// `ipam`, `CNI_ARGS`, `args.cni.ips` and `runtimeConfig.ips` merged (see the module
/// documentation), every address parsed, at most one per family before 0.3.0.
fn load(req: &Request) -> Result<StaticConf, Error> {
    let ipam = match req.conf.raw.get("ipam") {
        None | Some(Value::Null) => {
            return Err(Error::invalid_config(
                "static needs an \"ipam\" section (IPAM config missing 'ipam' key)",
            ))
        }
        Some(v) => v,
    };
    let mut entries = configured_addresses(ipam)?;
    let routes = match ipam.get("routes").filter(|v| !v.is_null()) {
        Some(v) => IpamConfig::routes_from_json(v)?,
        None => Vec::new(),
    };
    let dns = match ipam.get("dns").filter(|v| !v.is_null()) {
        Some(v) => serde_json::from_value(without_nulls(v))
            .map_err(|e| Error::invalid_config(format!("ipam.dns {v} is not a DNS object: {e}")))?,
        None => Dns::default(),
    };
    merge_cni_args(&mut entries, req.args.get("IP"), req.args.get("GATEWAY"))?;
    for (key, list) in [
        ("args.cni.ips", req.conf.args_cni("ips")),
        ("runtimeConfig.ips", req.conf.runtime_config("ips")),
    ] {
        if let Some(replacement) = runtime_ips(key, list)? {
            entries = replacement;
        }
    }
    let addresses = validate(entries, req.conf.version)?;
    Ok(StaticConf {
        addresses,
        routes,
        dns,
    })
}

/// `ipam.addresses`: each `{"address": CIDR, "gateway": IP}`, the address left as text.
fn configured_addresses(ipam: &Value) -> Result<Vec<Entry>, Error> {
    let list = match ipam.get("addresses") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(Error::invalid_config(format!(
                "ipam.addresses must be a list of {{\"address\": …, \"gateway\": …}}, got {other}"
            )))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let path = format!("ipam.addresses[{i}]");
        if !item.is_object() {
            return Err(Error::invalid_config(format!(
                "{path} must be an object, got {item}"
            )));
        }
        let text = optional_str(item, &path, "address")?.unwrap_or_default();
        let gateway = match optional_str(item, &path, "gateway")? {
            // Go's net.IP reads "" as no address.
            None | Some("") => None,
            Some(g) => Some(parse_ip(g).ok_or_else(|| {
                Error::invalid_config(format!("{path}.gateway {g:?} is not an IP address"))
            })?),
        };
        out.push(Entry {
            text: Some(text.to_string()),
            parsed: None,
            gateway,
        });
    }
    Ok(out)
}

fn optional_str<'a>(v: &'a Value, path: &str, key: &str) -> Result<Option<&'a str>, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(Error::invalid_config(format!(
            "{path}.{key} must be a string, got {other}"
        ))),
    }
}

/// `CNI_ARGS IP=a/24,b/24` appended to `entries`; then `GATEWAY=g,h`: each gateway
/// becomes the gateway of every `IP=` address whose subnet holds it, a later one winning.
/// A configured address is still text here, so no gateway reaches it (as in the reference).
fn merge_cni_args(
    entries: &mut Vec<Entry>,
    ip: Option<&str>,
    gateway: Option<&str>,
) -> Result<(), Error> {
    for item in ip
        .filter(|s| !s.is_empty())
        .into_iter()
        .flat_map(|s| s.split(','))
    {
        let item = item.trim();
        let net = parse_cidr(item).ok_or_else(|| {
            Error::invalid_config(format!(
                "CNI_ARGS IP: {item:?} is not in CIDR notation (like 10.10.0.1/24)"
            ))
        })?;
        entries.push(Entry {
            text: None,
            parsed: Some(net),
            gateway: None,
        });
    }
    for item in gateway
        .filter(|s| !s.is_empty())
        .into_iter()
        .flat_map(|s| s.split(','))
    {
        let gw = parse_ip(item.trim()).ok_or_else(|| {
            Error::invalid_config(format!("CNI_ARGS GATEWAY: {item:?} is not an IP address"))
        })?;
        for entry in entries.iter_mut() {
            if entry.parsed.is_some_and(|net| net.contains(&gw)) {
                entry.gateway = Some(gw);
            }
        }
    }
    Ok(())
}

/// `args.cni.ips` or `runtimeConfig.ips`: the addresses that replace all others when the
/// list names any (None when it is absent or empty).
fn runtime_ips(key: &str, list: Option<&Value>) -> Result<Option<Vec<Entry>>, Error> {
    let Some(list) = list else { return Ok(None) };
    let Some(items) = list.as_array() else {
        return Err(Error::invalid_config(format!(
            "{key} must be a list of CIDRs, got {list}"
        )));
    };
    if items.is_empty() {
        return Ok(None);
    }
    let entries = items
        .iter()
        .map(|item| {
            let net = item.as_str().and_then(parse_cidr).ok_or_else(|| {
                Error::invalid_config(format!(
                    "{key}: {item} is not in CIDR notation (like 10.10.0.1/24)"
                ))
            })?;
            Ok(Entry {
                text: None,
                parsed: Some(net),
                gateway: None,
            })
        })
        .collect::<Result<_, Error>>()?;
    Ok(Some(entries))
}

/// The configured addresses that are still text parsed; before 0.3.0 (one `ip4` and one
/// `ip6` block) at most one address of each family.
fn validate(entries: Vec<Entry>, version: Version) -> Result<Vec<(IpNet, Option<IpAddr>)>, Error> {
    let mut out = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let net = match (entry.parsed, &entry.text) {
            (Some(net), _) => net,
            (None, text) => {
                let text = text.as_deref().unwrap_or_default();
                parse_cidr(text).ok_or_else(|| {
                    Error::invalid_config(format!(
                        "ipam.addresses[{i}].address {text:?} is not in CIDR notation (like 10.10.0.1/24)"
                    ))
                })?
            }
        };
        out.push((net, entry.gateway));
    }
    let v4 = out.iter().filter(|(net, _)| net.addr().is_ipv4()).count();
    let v6 = out.len() - v4;
    if version < Version::V030 && (v4 > 1 || v6 > 1) {
        return Err(Error::invalid_config(format!(
            "cniVersion {version} results hold one address per family, but static has {v4} IPv4 and {v6} IPv6 addresses: use cniVersion 0.3.0 or later"
        )));
    }
    Ok(out)
}

/// Go's `net.ParseCIDR`: an address (no zone, no octet with a leading zero) and a prefix
/// of decimal digits no longer than the family's; the address keeps its host bits. An
/// IPv4-mapped IPv6 address with a prefix of 96 or more is the IPv4 network it maps, as
/// Go prints it.
fn parse_cidr(s: &str) -> Option<IpNet> {
    let (addr, prefix) = s.split_once('/')?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let addr: IpAddr = addr.parse().ok()?;
    match addr {
        IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => IpNet::new(v4.into(), prefix - 96).ok(),
            None => IpNet::new(addr, prefix).ok(),
        },
        _ => IpNet::new(addr, prefix).ok(),
    }
}

/// Go's `net.ParseIP`, an IPv4-mapped IPv6 address being the IPv4 one (Go prints it so).
fn parse_ip(s: &str) -> Option<IpAddr> {
    let ip: IpAddr = s.parse().ok()?;
    Some(ip.to_canonical())
}

/// CHECK's comparison of the configured addresses with prevResult's.
fn check_against(conf: &StaticConf, prev: &CniResult, ifname: &str) -> Result<(), Error> {
    for (net, gateway) in &conf.addresses {
        let found = prev.ips.iter().find(|ip| ip.address.addr() == net.addr());
        match (found, gateway) {
            (None, _) => {
                return Err(Error::new(
                    Code::AddressUnavailable,
                    format!(
                        "CHECK: static address {} of interface {ifname} is not among prevResult's addresses",
                        net.addr()
                    ),
                ))
            }
            (Some(ip), Some(gw)) if ip.gateway != Some(*gw) => {
                return Err(Error::new(
                    Code::AddressUnavailable,
                    format!(
                        "CHECK: static address {} of interface {ifname} has gateway {} in prevResult, the configuration says {gw}",
                        net.addr(),
                        ip.gateway.map_or("none".to_string(), |g| g.to_string())
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "static_ipam_tests.rs"]
mod tests;
