//! ipamd: the IPAM plugin. A thin client of the lease daemon (or, with no
//! daemon running, of the same store in-process); see the `ipamd` crate.
//! Configuration keys are host-local's, so migrating is a change of `type`.

use crate::cni::{CniResult, Code, Error, IpConfig, Plugin, Request, Route};
use ipamd::api::AllocateRequest;
use ipamd::client::Client;
use ipamd::config::{IpamConfig, RangeSet};
use std::net::IpAddr;

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
        let dns = match &call.conf.resolv_conf {
            Some(path) => ipamd::config::parse_resolv_conf(path)?,
            None => Default::default(),
        };
        let allocations = call.client.allocate(&AllocateRequest {
            key: req.attachment(),
            range_sets: call.conf.range_sets.clone(),
            requested: requested_ips(req)?,
            pools: call.conf.pools.clone(),
        })?;
        Ok(CniResult {
            interfaces: Vec::new(),
            ips: allocations
                .into_iter()
                .map(|a| IpConfig {
                    address: a.address,
                    gateway: a.gateway,
                    interface: None,
                })
                .collect(),
            routes: call
                .conf
                .routes
                .iter()
                .map(|r| Route::new(r.dst, r.gw))
                .collect(),
            dns,
        })
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let call = Call::new(req)?;
        let held = call.client.check(&req.attachment())?;
        if held.is_empty() {
            return Err(Error::new(
                Code::AddressUnavailable,
                format!(
                    "CHECK: no lease for container {} interface {} in network {}",
                    req.container_id(),
                    req.ifname(),
                    call.network
                ),
            ));
        }
        let Some(prev) = &req.conf.prev_result else {
            return Ok(());
        };
        for lease in &held {
            if !prev
                .ips
                .iter()
                .any(|ip| ip.address.addr() == lease.address.addr())
            {
                return Err(Error::new(
                    Code::AddressUnavailable,
                    format!(
                        "CHECK: lease {} is not among prevResult's addresses",
                        lease.address
                    ),
                ));
            }
        }
        Ok(())
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
        let Some(valid) = req.conf.valid_attachments()? else {
            return Err(Error::invalid_config(
                "GC needs cni.dev/valid-attachments (or cni.dev/attachments)",
            ));
        };
        let freed = call.client.gc(&call.network, &valid)?;
        if freed > 0 {
            eprintln!(
                "ipamd: GC freed {freed} lease(s) in network {}",
                call.network
            );
        }
        Ok(())
    }
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
