//! host-local: the reference IPAM plugin, with its keys, results and on-disk lease format
//! (one file per address under `dataDir/<network>/`, see `ipamd::hostlocal`), so that a
//! node keeps every lease when it switches between the reference and cnikit, either way.
//! The `ipam` object is parsed and validated by the same code as ipamd's.

use super::{ipam_object, parse_ipam, runtime_ranges, with_runtime_ranges, Ipam, Leases};
use crate::cni::{Attachment, Error, Request, Version};
use ipamd::api::Allocation;
use ipamd::config::{RangeSet, RouteSpec};
use ipamd::hostlocal::{HostLocal as Store, DEFAULT_DATA_DIR};
use serde_json::Value;
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
        let conf = parse_ipam(Self::NAME, &with_runtime_ranges(ipam, runtime_ranges(req)))?;
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
    use ipamd::config::IpamConfig;
    use serde_json::json;

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
