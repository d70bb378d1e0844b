//! host-local: the reference IPAM plugin, with its keys, results and on-disk lease format
//! (one file per address under `dataDir/<network>/`, see `ipamd::hostlocal`), so that a
//! node keeps every lease when it switches between the reference and cnikit, either way.
//! The `ipam` object is parsed and validated by the same code as ipamd's.

use super::ipam::{ipam_object, Ipam, Leases};
use crate::cni::{Attachment, Error, Request, Version};
use ipamd::api::Allocation;
use ipamd::config::{IpamConfig, RangeSet, RouteSpec};
use ipamd::hostlocal::{HostLocal as Store, DEFAULT_DATA_DIR};
use serde_json::{Map, Value};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The `host-local` plugin.
pub type HostLocal = Ipam<LeaseFiles>;

/// host-local's leases: the range sets in the reference's order and the lease files.
pub struct LeaseFiles {
    store: Store,
    sets: Vec<RangeSet>,
    routes: Vec<RouteSpec>,
    resolv_conf: Option<PathBuf>,
}

impl Leases for LeaseFiles {
    const NAME: &'static str = "host-local";
    /// An address alone: the lease files keep no prefix length.
    type Lease = IpAddr;

    fn new(req: &Request) -> Result<LeaseFiles, Error> {
        let ipam = ipam_object(req)?;
        if req.conf.name.is_empty() {
            return Err(Error::invalid_config(
                "the network configuration needs a \"name\" (it names the lease directory)",
            ));
        }
        let ipam = without_empty_paths(with_runtime_ranges(
            ipam,
            req.conf.runtime_config("ipRanges"),
        ));
        let conf = IpamConfig::from_json(&ipam)?;
        if conf.range_sets.is_empty() {
            return Err(Error::invalid_config(
                "no IP ranges specified: set ipam.subnet, ipam.ranges or runtimeConfig.ipRanges",
            ));
        }
        one_per_family_before_0_3_0(req.conf.version, &conf.range_sets)?;
        Ok(LeaseFiles {
            store: Store::new(data_dir(req)),
            sets: conf.range_sets,
            routes: conf.routes,
            resolv_conf: conf.resolv_conf,
        })
    }

    /// DEL with an `ipam` section `new` refuses: freeing needs only where the leases are.
    fn del_fallback(req: &Request) -> LeaseFiles {
        LeaseFiles {
            store: Store::new(data_dir(req)),
            sets: Vec::new(),
            routes: Vec::new(),
            resolv_conf: None,
        }
    }

    fn resolv_conf(&self) -> Option<&Path> {
        self.resolv_conf.as_deref()
    }

    fn routes(&self) -> &[RouteSpec] {
        &self.routes
    }

    fn allocate(
        &self,
        key: Attachment,
        requested: Vec<IpAddr>,
    ) -> Result<Vec<Allocation>, ipamd::Error> {
        self.store.allocate(&key, &self.sets, &requested)
    }

    fn held(&self, key: &Attachment) -> Result<Vec<IpAddr>, ipamd::Error> {
        self.store.held(key)
    }

    fn address(lease: &IpAddr) -> IpAddr {
        *lease
    }

    fn release(&self, key: &Attachment) -> Result<(), ipamd::Error> {
        self.store.release(key).map(drop)
    }

    fn status(&self, network: &str) -> Result<(), ipamd::Error> {
        self.store.status(network, &self.sets)
    }

    fn gc(&self, network: &str, valid: &[Attachment]) -> Result<usize, ipamd::Error> {
        self.store.gc(network, valid)
    }

    fn place(&self, network: &str) -> String {
        self.store.network_dir(network).display().to_string()
    }
}

/// `ipam.dataDir` when it is a non-empty string, else the reference's default.
fn data_dir(req: &Request) -> PathBuf {
    req.conf
        .raw
        .get("ipam")
        .and_then(|i| i.get("dataDir"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_DATA_DIR)
        .into()
}

/// The `ipam` object with `runtimeConfig.ipRanges` (capability `ipRanges`) put in front of
/// the configured range sets, the flat `subnet` form next, then `ranges`: the reference's
/// order, which decides the index of each `last_reserved_ip.N`. Unchanged when there are
/// no runtime ranges, or when `ranges` is malformed (then its own error is reported).
fn with_runtime_ranges(ipam: &Value, runtime: Option<&Value>) -> Value {
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

/// The reference reads an empty `dataDir` as its default and an empty `resolvConf` as
/// none, where ipamd's parser refuses them: drop them first.
fn without_empty_paths(mut ipam: Value) -> Value {
    if let Some(obj) = ipam.as_object_mut() {
        obj.retain(|k, v| !(matches!(k.as_str(), "dataDir" | "resolvConf") && v == ""));
    }
    ipam
}

/// Results before 0.3.0 carry one address per family (`ip4`, `ip6`).
fn one_per_family_before_0_3_0(version: Version, sets: &[RangeSet]) -> Result<(), Error> {
    if version >= Version::V030 {
        return Ok(());
    }
    let v4 = sets
        .iter()
        .filter(|s| s.first().is_some_and(|r| r.subnet.addr().is_ipv4()))
        .count();
    if v4 > 1 || sets.len() - v4 > 1 {
        return Err(Error::invalid_config(format!(
            "cniVersion {version} results hold one address per family, but the configuration has {v4} IPv4 and {} IPv6 range sets: use cniVersion 0.3.0 or later",
            sets.len() - v4
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn empty_paths_mean_the_defaults() {
        let ipam = json!({"subnet": "10.1.0.0/24", "dataDir": "", "resolvConf": ""});
        let conf = IpamConfig::from_json(&without_empty_paths(ipam)).unwrap();
        assert_eq!(conf.resolv_conf, None);
        let kept = json!({"dataDir": "/d", "resolvConf": "/r", "x": ""});
        assert_eq!(without_empty_paths(kept.clone()), kept);
    }

    #[test]
    fn legacy_versions_take_one_set_per_family() {
        let sets = |json: serde_json::Value| IpamConfig::ranges_from_json(&json).unwrap();
        let dual = sets(json!([[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd01::/64"}]]));
        one_per_family_before_0_3_0(Version::V020, &dual).unwrap();
        let two_v4 = sets(json!([[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.2.0.0/24"}]]));
        let e = one_per_family_before_0_3_0(Version::V020, &two_v4).unwrap_err();
        assert_eq!(e.code, 7);
        one_per_family_before_0_3_0(Version::V030, &two_v4).unwrap();
    }
}
