//! The IPAM plugins: one plugin, [`Ipam`], over two places to keep leases. `ipamd` is a
//! thin client of the lease daemon (or, with no daemon running, of the same store
//! in-process; see the `ipamd` crate); `host-local` keeps the reference's lease files
//! (host_local.rs). Configuration keys are host-local's, so migrating is a change of
//! `type`.

pub mod dhcp;
pub mod host_local;
pub mod static_ipam;

use crate::cni::{Attachment, CniResult, Code, Dns, Error, IpConfig, Plugin, Request};
use ipamd::api::{AllocateRequest, Allocation};
use ipamd::client::Client;
use ipamd::config::{IpamConfig, RouteSpec};
use ipnet::IpNet;
use serde_json::{Map, Value};
use std::fmt::Display;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::path::Path;

/// An IPAM plugin keeping its leases in `L`.
pub struct Ipam<L>(PhantomData<fn() -> L>);

impl<L> Ipam<L> {
    pub const PLUGIN: Ipam<L> = Ipam(PhantomData);
}

/// The `ipamd` plugin.
pub type Ipamd = Ipam<DaemonLeases>;

/// One call's leases, as the IPAM plugin's commands use them. Each store parses the
/// `ipam` object itself: their keys differ (pools and the daemon's socket are ipamd's).
pub trait Leases: Sized {
    /// The plugin's name, for log lines.
    const NAME: &'static str;
    /// A held lease as CHECK names it.
    type Lease: Display;

    fn new(req: &Request) -> Result<Self, Error>;
    /// The call DEL makes when `new` refuses the configuration: releasing needs only
    /// where the leases are, not the ranges.
    fn del_fallback(req: &Request) -> Self;
    fn resolv_conf(&self) -> Option<&Path>;
    fn routes(&self) -> &[RouteSpec];
    fn allocate(
        &self,
        key: Attachment,
        requested: Vec<IpAddr>,
    ) -> Result<Vec<Allocation>, ipamd::Error>;
    fn held(&self, key: &Attachment) -> Result<Vec<Self::Lease>, ipamd::Error>;
    fn address(lease: &Self::Lease) -> IpAddr;
    fn release(&self, key: &Attachment) -> Result<(), ipamd::Error>;
    /// Whether ADD could allocate in `network` now.
    fn status(&self, network: &str) -> Result<(), ipamd::Error>;
    /// Frees the leases of `network` held by no attachment in `valid`; how many.
    fn gc(&self, network: &str, valid: &[Attachment]) -> Result<usize, ipamd::Error>;
    /// Where `network`'s leases are, as errors and log lines name it.
    fn place(&self, network: &str) -> String;
}

impl<L: Leases> Plugin for Ipam<L> {
    /// As the reference's (and, for ipamd, host-local's): it decodes them.
    fn reads_cni_args(&self) -> bool {
        true
    }

    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let call = L::new(req)?;
        // Read resolvConf first: failing after the allocation would leave leases.
        let dns = read_dns(call.resolv_conf())?;
        let allocations = call.allocate(req.attachment(), requested_ips(req)?)?;
        Ok(add_result(allocations, call.routes(), dns))
    }

    // ---------------------------------------------------------------- CHECK
    /// The attachment holds a lease (the reference's check), and every lease it holds is
    /// among prevResult's addresses when there is one.
    fn check(&self, req: &Request) -> Result<(), Error> {
        let call = L::new(req)?;
        let held = call.held(&req.attachment())?;
        if held.is_empty() {
            return Err(Error::new(
                Code::AddressUnavailable,
                format!(
                    "CHECK: no lease for container {} interface {} in {}",
                    req.container_id(),
                    req.ifname(),
                    call.place(&req.conf.name),
                ),
            ));
        }
        let Some(prev) = &req.conf.prev_result else {
            return Ok(());
        };
        let in_prev = |a: IpAddr| prev.ips.iter().any(|ip| ip.address.addr() == a);
        match held.iter().find(|lease| !in_prev(L::address(lease))) {
            Some(lost) => Err(Error::new(
                Code::AddressUnavailable,
                format!("CHECK: lease {lost} is not among prevResult's addresses"),
            )),
            None => Ok(()),
        }
    }

    // ---------------------------------------------------------------- DEL
    /// Releases the attachment's leases, whatever the rest of the configuration says.
    fn del(&self, req: &Request) -> Result<(), Error> {
        if req.conf.name.is_empty() {
            // No ADD can have succeeded without a network name: nothing to release.
            return Ok(());
        }
        let call = req.conf_or_del_fallback(L::new, L::del_fallback)?;
        call.release(&req.attachment())?;
        Ok(())
    }

    // ---------------------------------------------------------------- STATUS
    /// Any failure means "cannot serve ADD now": code 50, with the reason.
    fn status(&self, req: &Request) -> Result<(), Error> {
        L::new(req)?
            .status(&req.conf.name)
            .map_err(|e| Error::new(Code::NotAvailable, e.to_string()))
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        let call = L::new(req)?;
        let freed = call.gc(&req.conf.name, &gc_valid_attachments(req)?)?;
        if freed > 0 {
            eprintln!(
                "{}: GC freed {freed} lease(s) in {}",
                L::NAME,
                call.place(&req.conf.name)
            );
        }
        Ok(())
    }
}

/// ipamd's leases: the parsed `ipam` object and the daemon's client.
pub struct DaemonLeases {
    conf: IpamConfig,
    client: Client,
}

impl Leases for DaemonLeases {
    const NAME: &'static str = "ipamd";
    /// With its prefix length, as the store keeps it.
    type Lease = IpNet;

    fn new(req: &Request) -> Result<DaemonLeases, Error> {
        let ipam = ipam_object(req)?;
        let has_pools = ["pool", "pools"]
            .iter()
            .any(|k| ipam.get(*k).is_some_and(|v| !v.is_null()));
        let conf = match runtime_ranges(req) {
            // Cluster pools and ranges are exclusive; the runtime's ranges are the more
            // specific wish and replace the pools (host-local has no pools to follow).
            Some(ranges) if has_pools => {
                let mut conf = parse_ipam(Self::NAME, ipam)?;
                conf.range_sets = IpamConfig::ranges_from_json(ranges)?;
                conf.pools.clear();
                conf
            }
            // Capability ipRanges goes in front of the configured range sets, where
            // host-local puts it, so that moving from host-local is a change of type. The
            // daemon takes each request's range sets as they come: pods with and without
            // the capability see the sets in another order, which moves no lease (a lease
            // is its attachment's, whichever set it came from).
            runtime => parse_ipam(Self::NAME, &with_runtime_ranges(ipam, runtime))?,
        };
        if req.conf.name.is_empty() {
            return Err(Error::invalid_config(
                "the network configuration needs a \"name\"",
            ));
        }
        let client = Client::new(&conf.socket, &conf.data_dir);
        Ok(DaemonLeases { conf, client })
    }

    /// DEL with an `ipam` section `new` refuses: a release needs only where
    /// the store is, and ranges are irrelevant to it.
    fn del_fallback(req: &Request) -> DaemonLeases {
        let ipam = req.conf.raw.get("ipam");
        // "" is not set, as the parser reads it.
        let path = |key: &str, default: &str| -> std::path::PathBuf {
            ipam.and_then(|i| i.get(key))
                .and_then(serde_json::Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or(default)
                .into()
        };
        let conf = IpamConfig {
            ignored: Vec::new(),
            range_sets: Vec::new(),
            pools: Vec::new(),
            routes: Vec::new(),
            data_dir: path("dataDir", ipamd::config::DEFAULT_DATA_DIR),
            socket: path("socket", ipamd::config::DEFAULT_SOCKET),
            resolv_conf: None,
        };
        let client = Client::new(&conf.socket, &conf.data_dir);
        DaemonLeases { conf, client }
    }

    fn resolv_conf(&self) -> Option<&Path> {
        self.conf.resolv_conf.as_deref()
    }

    fn routes(&self) -> &[RouteSpec] {
        &self.conf.routes
    }

    fn allocate(
        &self,
        key: Attachment,
        requested: Vec<IpAddr>,
    ) -> Result<Vec<Allocation>, ipamd::Error> {
        self.client.allocate(&AllocateRequest {
            key,
            range_sets: self.conf.range_sets.clone(),
            requested,
            pools: self.conf.pools.clone(),
        })
    }

    fn held(&self, key: &Attachment) -> Result<Vec<IpNet>, ipamd::Error> {
        let leases = self.client.check(key)?;
        Ok(leases.into_iter().map(|lease| lease.address).collect())
    }

    fn address(lease: &IpNet) -> IpAddr {
        lease.addr()
    }

    fn release(&self, key: &Attachment) -> Result<(), ipamd::Error> {
        self.client.release(key)
    }

    fn status(&self, network: &str) -> Result<(), ipamd::Error> {
        if self.conf.pools.is_empty() {
            self.client.status(network, &self.conf.range_sets)
        } else {
            self.client.status_pools(network, &self.conf.pools)
        }
    }

    fn gc(&self, network: &str, valid: &[Attachment]) -> Result<usize, ipamd::Error> {
        self.client.gc(network, valid)
    }

    fn place(&self, network: &str) -> String {
        format!("network {network}")
    }
}

/// The configuration's `ipam` object, which every command but DEL needs.
pub(super) fn ipam_object(req: &Request) -> Result<&Value, Error> {
    let ipam = req.conf.raw.get("ipam");
    ipam.ok_or_else(|| Error::invalid_config("missing \"ipam\" section"))
}

/// `ipam` parsed and validated; keys it sets to no effect are named on stderr.
pub(super) fn parse_ipam(plugin: &str, ipam: &Value) -> Result<IpamConfig, Error> {
    let conf = IpamConfig::from_json(ipam)?;
    if !conf.ignored.is_empty() {
        eprintln!(
            "{plugin}: ignoring {}: they describe the range of ipam.subnet, which is not set \
             (the reference ignores them as well); put them in a range of ipam.ranges",
            conf.ignored.join(", ")
        );
    }
    Ok(conf)
}

/// `runtimeConfig.ipRanges` (capability `ipRanges`) when it names any range set.
pub(super) fn runtime_ranges(req: &Request) -> Option<&Value> {
    req.conf
        .runtime_config("ipRanges")
        .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
}

/// The `ipam` object with `runtime` (`runtimeConfig.ipRanges`) put in front of the
/// configured range sets, the flat `subnet` form next, then `ranges`: the reference
/// host-local's order, which decides the index of each set (host-local's
/// `last_reserved_ip.N`, ipamd's round robin per set). Unchanged when there are no runtime
/// ranges, or when `ranges` is malformed (then its own error is reported).
pub(super) fn with_runtime_ranges(ipam: &Value, runtime: Option<&Value>) -> Value {
    let Some(extra) = runtime.and_then(Value::as_array).filter(|a| !a.is_empty()) else {
        return ipam.clone();
    };
    let Some(obj) = ipam.as_object() else {
        return ipam.clone();
    };
    let configured = match obj.get("ranges") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(sets)) => sets.clone(),
        Some(_) => return ipam.clone(),
    };
    let mut obj = obj.clone();
    let mut sets = extra.clone();
    if obj.get("subnet").is_some_and(|v| !v.is_null()) {
        let mut flat = Map::new();
        for key in ["subnet", "rangeStart", "rangeEnd", "gateway"] {
            if let Some(v) = obj.remove(key) {
                flat.insert(key.to_string(), v);
            }
        }
        sets.push(Value::Array(vec![Value::Object(flat)]));
    }
    sets.extend(configured);
    obj.insert("ranges".to_string(), Value::Array(sets));
    Value::Object(obj)
}

/// `ipam.resolvConf` read into the result's `dns`, or none.
fn read_dns(resolv_conf: Option<&Path>) -> Result<Dns, Error> {
    Ok(match resolv_conf {
        Some(path) => ipamd::config::parse_resolv_conf(path)?,
        None => Dns::default(),
    })
}

/// ADD's result: the allocated addresses with their gateways, the configured routes
/// and `dns`; no interfaces.
fn add_result(allocations: Vec<Allocation>, routes: &[RouteSpec], dns: Dns) -> CniResult {
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
        // As configured, metrics, table and scope included (the reference returns its
        // `types.Route`s unchanged); the result's version decides what is printed.
        routes: routes.to_vec(),
        dns,
    }
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
fn requested_ips(req: &Request) -> Result<Vec<IpAddr>, Error> {
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
    use super::*;
    use crate::cni::{gojson, Version};
    use ipamd::config::IpamConfig;
    use serde_json::json;

    /// The `ipam` object is walked by hand in the ipamd crate; these are its
    /// typed parts, and the keys either plugin reads by hand are in `gojson::KEYS`.
    #[test]
    fn ipam_keys_get_go_matching() {
        use gojson::{assert_known, struct_fields};
        assert_known(&[
            struct_fields::<ipamd::config::Range>(),
            struct_fields::<RouteSpec>(),
            &[
                "subnet",
                "ranges",
                "pool",
                "pools",
                "routes",
                "dataDir",
                "socket",
                "resolvConf",
                "ipRanges",
                "ips",
            ],
        ]);
    }

    #[test]
    fn runtime_ranges_come_first_then_subnet_then_ranges() {
        let ipam = json!({"type": "host-local", "subnet": "10.1.0.0/24", "gateway": "10.1.0.254",
            "ranges": [[{"subnet": "10.2.0.0/24"}]], "dataDir": "/d"});
        let rt = json!([[{"subnet": "10.3.0.0/24"}]]);
        let v = with_runtime_ranges(&ipam, Some(&rt));
        assert_eq!(
            v,
            json!({"type": "host-local", "dataDir": "/d", "ranges": [
                [{"subnet": "10.3.0.0/24"}],
                [{"subnet": "10.1.0.0/24", "gateway": "10.1.0.254"}],
                [{"subnet": "10.2.0.0/24"}]]})
        );
        let conf = IpamConfig::from_json(&v).unwrap();
        let subnets: Vec<String> = conf
            .range_sets
            .iter()
            .map(|s| s[0].subnet.to_string())
            .collect();
        assert_eq!(subnets, ["10.3.0.0/24", "10.1.0.0/24", "10.2.0.0/24"]);
        // Nothing from the runtime, or an empty list: the object as configured.
        assert_eq!(with_runtime_ranges(&ipam, None), ipam);
        assert_eq!(with_runtime_ranges(&ipam, Some(&json!([]))), ipam);
        let bad = json!({"ranges": "x"});
        assert_eq!(with_runtime_ranges(&bad, Some(&rt)), bad);
    }

    /// A route's metrics, table and scope (Go-spelled keys too) reach the result as
    /// configured; 1.1.0 prints them, and the result renders by src/cni/result.rs's rules
    /// for older versions.
    #[test]
    fn routes_keep_metrics_table_and_scope() {
        let mut ipam = json!({"subnet": "10.1.0.0/24", "routes": [
            {"dst": "0.0.0.0/0", "gw": "10.1.0.1", "priority": 100, "MTU": 1400,
             "table": 100, "scope": 0, "advmss": 1360},
            {"dst": "0.0.0.0/0", "gw": "10.1.0.1", "priority": 200, "table": 0},
            {"dst": "10.9.0.0/16", "scope": 253, "mtu": 0, "priority": -1}]});
        gojson::canonicalize(&mut ipam);
        let conf = IpamConfig::from_json(&ipam).unwrap();
        let alloc = Allocation {
            address: "10.1.0.2/24".parse().unwrap(),
            gateway: Some("10.1.0.1".parse().unwrap()),
        };
        let result = add_result(vec![alloc], &conf.routes, Dns::default());
        let want = json!([
            {"dst": "0.0.0.0/0", "gw": "10.1.0.1", "mtu": 1400, "advmss": 1360, "priority": 100,
             "table": 100, "scope": 0},
            {"dst": "0.0.0.0/0", "gw": "10.1.0.1", "priority": 200, "table": 0},
            {"dst": "10.9.0.0/16", "scope": 253}]);
        assert_eq!(result.to_value(Version::V110)["routes"], want);
        let v100 = result.to_value(Version::V100);
        for (have, want) in v100["routes"]
            .as_array()
            .unwrap()
            .iter()
            .zip(want.as_array().unwrap())
        {
            assert_eq!(have["dst"], want["dst"]);
            assert_eq!(have["gw"], want["gw"]);
        }
    }
}
