//! ipamd: the IPAM plugin. A thin client of the lease daemon (or, with no
//! daemon running, of the same store in-process); see the `ipamd` crate.
//! Configuration keys are host-local's, so migrating is a change of `type`.

use crate::cni::{Attachment, CniResult, Code, Dns, Error, IpConfig, Plugin, Request, Route};
use ipamd::api::{AllocateRequest, Allocation};
use ipamd::client::Client;
use ipamd::config::{IpamConfig, RangeSet, RouteSpec};
use ipnet::IpNet;
use std::fmt::Display;
use std::net::IpAddr;
use std::path::Path;

pub struct Ipamd;

/// Everything one call needs: the parsed `ipam` object and the client.
struct Call {
    conf: IpamConfig,
    client: Client,
    network: String,
}

impl Call {
    fn new(req: &Request) -> Result<Call, Error> {
        let ipam = req
            .conf
            .raw
            .get("ipam")
            .ok_or_else(|| Error::invalid_config("missing \"ipam\" section"))?;
        let mut conf = IpamConfig::from_json(ipam)?;
        // Capability ipRanges replaces the configured range sets (CONVENTIONS).
        if let Some(ranges) = req.conf.runtime_config("ipRanges") {
            if ranges.as_array().is_some_and(|a| !a.is_empty()) {
                conf.range_sets = IpamConfig::ranges_from_json(ranges)?;
                // The runtime's ranges replace the configured ones, pools included.
                conf.pools.clear();
            }
        }
        if req.conf.name.is_empty() {
            return Err(Error::invalid_config(
                "the network configuration needs a \"name\"",
            ));
        }
        let client = Client::new(&conf.socket, &conf.data_dir);
        Ok(Call {
            conf,
            client,
            network: req.conf.name.clone(),
        })
    }

    /// DEL with an `ipam` section `new` refuses: a release needs only where
    /// the store is, and ranges are irrelevant to it.
    fn del_fallback(req: &Request) -> Call {
        let ipam = req.conf.raw.get("ipam");
        let path = |key: &str, default: &str| -> std::path::PathBuf {
            ipam.and_then(|i| i.get(key))
                .and_then(serde_json::Value::as_str)
                .unwrap_or(default)
                .into()
        };
        let conf = IpamConfig {
            range_sets: Vec::new(),
            pools: Vec::new(),
            routes: Vec::new(),
            data_dir: path("dataDir", ipamd::config::DEFAULT_DATA_DIR),
            socket: path("socket", ipamd::config::DEFAULT_SOCKET),
            resolv_conf: None,
        };
        let client = Client::new(&conf.socket, &conf.data_dir);
        Call {
            conf,
            client,
            network: req.conf.name.clone(),
        }
    }
}

impl Plugin for Ipamd {
    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let call = Call::new(req)?;
        // Read resolvConf first: failing after the allocation would leave a lease.
        let dns = read_dns(call.conf.resolv_conf.as_deref())?;
        let allocations = call.client.allocate(&AllocateRequest {
            key: req.attachment(),
            range_sets: call.conf.range_sets.clone(),
            requested: requested_ips(req)?,
            pools: call.conf.pools.clone(),
        })?;
        Ok(add_result(allocations, &call.conf.routes, dns))
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let call = Call::new(req)?;
        let held: Vec<IpNet> = call
            .client
            .check(&req.attachment())?
            .into_iter()
            .map(|lease| lease.address)
            .collect();
        check_held(
            req,
            &held,
            IpNet::addr,
            format_args!("network {}", call.network),
        )
    }

    // ---------------------------------------------------------------- DEL
    fn del(&self, req: &Request) -> Result<(), Error> {
        if req.conf.name.is_empty() {
            // No ADD can have succeeded without a network name: nothing to release.
            return Ok(());
        }
        let call = req.conf_or_del_fallback(Call::new, Call::del_fallback)?;
        call.client.release(&req.attachment())?;
        Ok(())
    }

    // ---------------------------------------------------------------- STATUS
    /// Any failure means "cannot serve ADD now": code 50, with the reason.
    fn status(&self, req: &Request) -> Result<(), Error> {
        let call = Call::new(req)?;
        let sets: &[RangeSet] = &call.conf.range_sets;
        let status = if call.conf.pools.is_empty() {
            call.client.status(&call.network, sets)
        } else {
            call.client.status_pools(&call.network, &call.conf.pools)
        };
        status.map_err(|e| Error::new(Code::NotAvailable, e.to_string()))
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        let call = Call::new(req)?;
        let freed = call.client.gc(&call.network, &gc_valid_attachments(req)?)?;
        if freed > 0 {
            eprintln!(
                "ipamd: GC freed {freed} lease(s) in network {}",
                call.network
            );
        }
        Ok(())
    }
}

/// `ipam.resolvConf` read into the result's `dns`, or none. Both IPAM plugins call it
/// before allocating: failing after the allocation would leave leases.
pub(super) fn read_dns(resolv_conf: Option<&Path>) -> Result<Dns, Error> {
    Ok(match resolv_conf {
        Some(path) => ipamd::config::parse_resolv_conf(path)?,
        None => Dns::default(),
    })
}

/// ADD's result of an IPAM plugin (ipamd and host-local alike): the allocated addresses
/// with their gateways, the configured routes and `dns`; no interfaces.
pub(super) fn add_result(
    allocations: Vec<Allocation>,
    routes: &[RouteSpec],
    dns: Dns,
) -> CniResult {
    CniResult {
        interfaces: Vec::new(),
        ips: allocations
            .into_iter()
            .map(|a| IpConfig {
                address: a.address,
                gateway: a.gateway,
                interface: None,
            })
            .collect(),
        routes: routes.iter().map(|r| Route::new(r.dst, r.gw)).collect(),
        dns,
    }
}

/// CHECK of an IPAM plugin: the attachment holds a lease (`held`, from the store at
/// `place`), and every lease it holds is among prevResult's addresses when there is one.
/// `addr` reads a lease's address; the error names the lease as it is displayed (with
/// its prefix length where the store keeps one).
pub(super) fn check_held<L: Display>(
    req: &Request,
    held: &[L],
    addr: impl Fn(&L) -> IpAddr,
    place: impl Display,
) -> Result<(), Error> {
    if held.is_empty() {
        return Err(Error::new(
            Code::AddressUnavailable,
            format!(
                "CHECK: no lease for container {} interface {} in {place}",
                req.container_id(),
                req.ifname(),
            ),
        ));
    }
    let Some(prev) = &req.conf.prev_result else {
        return Ok(());
    };
    if let Some(lost) = held
        .iter()
        .find(|lease| !prev.ips.iter().any(|ip| ip.address.addr() == addr(lease)))
    {
        return Err(Error::new(
            Code::AddressUnavailable,
            format!("CHECK: lease {lost} is not among prevResult's addresses"),
        ));
    }
    Ok(())
}

/// GC's list of attachments still in use, which an IPAM plugin needs: without it every
/// lease of the network would look stale.
pub(super) fn gc_valid_attachments(req: &Request) -> Result<Vec<Attachment>, Error> {
    req.conf.valid_attachments()?.ok_or_else(|| {
        Error::invalid_config("GC needs cni.dev/valid-attachments (or cni.dev/attachments)")
    })
}

/// Explicitly requested addresses: `CNI_ARGS IP=a,b`, `args.cni.ips`,
/// `runtimeConfig.ips` (capability `ips`), in that order, without duplicates.
pub(super) fn requested_ips(req: &Request) -> Result<Vec<IpAddr>, Error> {
    let mut out: Vec<IpAddr> = Vec::new();
    let mut push = |raw: &str, key: &str| -> Result<(), Error> {
        // Accept "10.0.0.5" and "10.0.0.5/24" (CONVENTIONS uses both).
        let addr = raw.split('/').next().unwrap_or(raw).trim();
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| Error::invalid_config(format!("{key}: {raw:?} is not an IP address")))?;
        if !out.contains(&ip) {
            out.push(ip);
        }
        Ok(())
    };
    if let Some(list) = req.args.get("IP") {
        for raw in list.split(',').filter(|s| !s.is_empty()) {
            push(raw, "CNI_ARGS IP")?;
        }
    }
    for (key, value) in [
        ("args.cni.ips", req.conf.args_cni("ips")),
        ("runtimeConfig.ips", req.conf.runtime_config("ips")),
    ] {
        let Some(value) = value else { continue };
        let Some(list) = value.as_array() else {
            return Err(Error::invalid_config(format!(
                "{key} must be a list of addresses"
            )));
        };
        for item in list {
            let raw = item
                .as_str()
                .ok_or_else(|| Error::invalid_config(format!("{key}: {item} is not a string")))?;
            push(raw, key)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::cni::gojson::{assert_known, struct_fields};

    /// The `ipam` object is walked by hand in the ipamd crate; these are its
    /// typed parts, and the hand-read keys are in `gojson::KEYS` by name.
    #[test]
    fn ipam_keys_get_go_matching() {
        assert_known(&[
            struct_fields::<ipamd::config::Range>(),
            struct_fields::<ipamd::config::RouteSpec>(),
            &[
                "subnet",
                "ranges",
                "pool",
                "pools",
                "routes",
                "dataDir",
                "socket",
                "resolvConf",
            ],
        ]);
    }
}
