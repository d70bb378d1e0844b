//! The CNI `ipam` object. Accepts every key of the reference `host-local` plugin with the same
//! meaning and defaults, so users migrate by changing only `type`; adds `socket`.
//!
//! Parsing walks the JSON by hand rather than through serde so that every error can name the
//! exact key and value (`ipam.ranges[0][0].rangeStart 10.0.1.5 is outside subnet ...`).

mod resolv;
mod validate;

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::addr::{leading_zero_octet, parse_net_strict};
use crate::Error;

pub use resolv::{parse_resolv_conf, Dns};
pub(crate) use validate::canonicalize_range_sets;

/// Default `dataDir`: where each network's lease journal lives.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/ipamd";
/// Default `socket`: where the daemon listens.
pub const DEFAULT_SOCKET: &str = "/run/cnikit/ipamd.sock";

/// One range set: a list of ranges of one address family; an attachment gets one address
/// from each set (so `[[v4…],[v6…]]` is dual-stack).
pub type RangeSet = Vec<Range>;

/// One range, host-local's `{subnet, rangeStart, rangeEnd, gateway}`.
///
/// After validation (`IpamConfig::from_json`, `ranges_from_json`) `range_start`, `range_end`
/// and `gateway` are always filled with host-local's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Range {
    #[serde(deserialize_with = "strict_net")]
    pub subnet: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_start: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

/// One entry of `routes`: the CNI result's route (`types.Route` in the reference, which
/// host-local returns as configured), handed on unchanged to the result. The interface
/// plugins apply the metrics, table and scope; without them two default routes that differ
/// only in `priority` would collide, and a `table` route would land in main.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteSpec {
    #[serde(deserialize_with = "strict_net")]
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl RouteSpec {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> RouteSpec {
        RouteSpec {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// Range sets also arrive over the wire (the daemon's requests): their CIDRs are held to
/// the same rule as the config's.
fn strict_net<'de, D: serde::Deserializer<'de>>(d: D) -> Result<IpNet, D::Error> {
    let s = String::deserialize(d)?;
    parse_net_strict(&s).map_err(|why| serde::de::Error::custom(format!("{s:?} {why}")))
}

/// The validated `ipam` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConfig {
    /// Keys the configuration sets to no effect, for the plugin to say so on stderr (the
    /// reference ignores them without a word).
    pub ignored: Vec<String>,
    /// May be empty: the runtime can supply the ranges through `runtimeConfig.ipRanges`.
    /// The store refuses an allocation without any range set.
    pub range_sets: Vec<RangeSet>,
    /// Cluster pools (`pool`, or `pools` for one address from each) instead of ranges:
    /// their addresses come from this node's blocks, held by the daemon in etcd.
    pub pools: Vec<String>,
    pub routes: Vec<RouteSpec>,
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    pub resolv_conf: Option<PathBuf>,
}

impl IpamConfig {
    /// Parse and validate the `ipam` object of a network configuration.
    pub fn from_json(ipam: &Value) -> Result<Self, Error> {
        let obj = ipam
            .as_object()
            .ok_or_else(|| Error::invalid(format!("ipam must be an object, got {ipam}")))?;

        // host-local: a flat `subnet` form becomes the first range set, ahead of `ranges`.
        let mut sets: Vec<PathSet> = Vec::new();
        let mut ignored = Vec::new();
        if obj.get("subnet").is_some_and(|v| !v.is_null()) {
            let range = parse_range(ipam, "ipam")?;
            sets.push(PathSet {
                label: "ipam.subnet".to_string(),
                ranges: vec![("ipam".to_string(), range)],
            });
        } else {
            // The reference reads the flat range only when `subnet` is set and drops these
            // without a word, so configurations that carry them next to `ranges` work there.
            // Without a subnet they belong to no range: ignoring them changes nothing that
            // is allocated.
            ignored.extend(
                ["rangeStart", "rangeEnd", "gateway"]
                    .into_iter()
                    .filter(|key| obj.get(*key).is_some_and(|v| !v.is_null()))
                    .map(|key| format!("ipam.{key}")),
            );
        }
        if let Some(ranges) = obj.get("ranges").filter(|v| !v.is_null()) {
            sets.extend(parse_range_sets(ranges, "ipam.ranges")?);
        }
        let range_sets = validate::validate_sets(sets)?;
        let pools = parse_pools(obj)?;
        if !pools.is_empty() && !range_sets.is_empty() {
            return Err(Error::invalid(
                "ipam.pool/ipam.pools and ipam.subnet/ipam.ranges are exclusive: a cluster pool replaces the ranges",
            ));
        }

        let routes = match obj.get("routes").filter(|v| !v.is_null()) {
            Some(v) => parse_routes(v)?,
            None => Vec::new(),
        };

        Ok(IpamConfig {
            ignored,
            range_sets,
            pools,
            routes,
            data_dir: opt_path(ipam, "dataDir")?.unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
            socket: opt_path(ipam, "socket")?.unwrap_or_else(|| DEFAULT_SOCKET.into()),
            resolv_conf: opt_path(ipam, "resolvConf")?,
        })
    }

    /// Parse and validate `runtimeConfig.ipRanges` (capability `ipRanges`): the same shape as
    /// `ranges`. The plugins put these sets in front of the configured ones, as host-local
    /// does; the combination is validated again as a whole.
    pub fn ranges_from_json(v: &Value) -> Result<Vec<RangeSet>, Error> {
        let sets = parse_range_sets(v, "runtimeConfig.ipRanges")?;
        validate::validate_sets(sets)
    }

    /// Parse `ipam.routes` alone, by the same rules as `from_json`: for IPAM plugins whose
    /// `routes` are host-local's but whose other keys are not (static).
    pub fn routes_from_json(v: &Value) -> Result<Vec<RouteSpec>, Error> {
        parse_routes(v)
    }
}

/// `pool` (one name) or `pools` (a list, one address from each), never both.
fn parse_pools(obj: &serde_json::Map<String, Value>) -> Result<Vec<String>, Error> {
    let name = |v: &Value, path: &str| -> Result<String, Error> {
        let s = v
            .as_str()
            .ok_or_else(|| Error::invalid(format!("{path} must be a pool name, got {v}")))?;
        crate::attachment::check_network(s)
            .map_err(|e| Error::invalid(format!("{path} {s:?}: {}", e.message())))?;
        Ok(s.to_string())
    };
    let one = obj.get("pool").filter(|v| !v.is_null());
    let many = obj.get("pools").filter(|v| !v.is_null());
    match (one, many) {
        (Some(_), Some(_)) => Err(Error::invalid(
            "ipam.pool and ipam.pools are exclusive: use pools for more than one",
        )),
        (Some(v), None) => Ok(vec![name(v, "ipam.pool")?]),
        (None, Some(v)) => {
            let list = parse_list(v, "ipam.pools", "a list of pool names", |p, path| {
                name(p, &path)
            })?;
            if list.is_empty() {
                return Err(Error::invalid("ipam.pools is empty"));
            }
            Ok(list)
        }
        (None, None) => Ok(Vec::new()),
    }
}

/// A range set still carrying the config path of each range, for error messages.
pub(crate) struct PathSet {
    pub(crate) label: String,
    pub(crate) ranges: Vec<(String, Range)>,
}

fn parse_range_sets(v: &Value, path: &str) -> Result<Vec<PathSet>, Error> {
    parse_list(v, path, "a list of range sets", |set, set_path| {
        let ranges = parse_list(set, &set_path, "a list of ranges", |r, range_path| {
            let range = parse_range(r, &range_path)?;
            Ok((range_path, range))
        })?;
        if ranges.is_empty() {
            return Err(Error::invalid(format!("{set_path} is an empty range set")));
        }
        Ok(PathSet {
            label: set_path,
            ranges,
        })
    })
}

fn parse_range(v: &Value, path: &str) -> Result<Range, Error> {
    Ok(Range {
        subnet: object_with_net(v, path, "subnet")?,
        range_start: opt_ip(v, path, "rangeStart")?,
        range_end: opt_ip(v, path, "rangeEnd")?,
        gateway: opt_ip(v, path, "gateway")?,
    })
}

fn parse_routes(v: &Value) -> Result<Vec<RouteSpec>, Error> {
    parse_list(v, "ipam.routes", "a list", |r, path| {
        let dst = object_with_net(r, &path, "dst")?;
        let gw = opt_ip(r, &path, "gw")?;
        if let Some(gw) = gw {
            if gw.is_ipv4() != dst.addr().is_ipv4() {
                return Err(Error::invalid(format!(
                    "{path}.gw {gw} is not of the same address family as dst {dst}"
                )));
            }
        }
        let int = |key| opt_int(r, &path, key, u32::MAX.into());
        // The reference's ints, as its interface plugins read them: a metric (mtu, advmss,
        // priority) or table of 0 or less sets nothing (the kernel never sees it); 0 is
        // also left out of the result.
        let positive = |key| Ok::<_, Error>(int(key)?.and_then(|n| u32::try_from(n).ok()));
        let metric = |key| Ok::<_, Error>(positive(key)?.filter(|n| *n != 0));
        // A scope goes to the kernel as it is: there is none outside 0-255.
        let scope = match opt_int(r, &path, "scope", u8::MAX.into())? {
            None => None,
            Some(s) => Some(u8::try_from(s).map_err(|_| {
                Error::invalid(format!("{path}.scope must be from 0 to 255, got {s}"))
            })?),
        };
        Ok(RouteSpec {
            dst,
            gw,
            mtu: metric("mtu")?,
            advmss: metric("advmss")?,
            priority: metric("priority")?,
            // A table of 0 is a value of its own in the result (a pointer there): kept.
            table: positive("table")?,
            scope,
        })
    })
}

/// The whole number at `path.key`, if set, at most `max`; a fraction is refused, as Go
/// refuses one for an int.
fn opt_int(v: &Value, path: &str, key: &str, max: i64) -> Result<Option<i64>, Error> {
    let Some(n) = v.get(key).filter(|n| !n.is_null()) else {
        return Ok(None);
    };
    match n.as_i64().filter(|i| *i <= max) {
        Some(i) => Ok(Some(i)),
        None => Err(Error::invalid(format!(
            "{path}.{key} must be a whole number up to {max}, got {n}"
        ))),
    }
}

/// The list `v` at `path` (`what` it must be, for the error), each element
/// parsed by `item` with its own path, `path[i]`.
fn parse_list<T>(
    v: &Value,
    path: &str,
    what: &str,
    mut item: impl FnMut(&Value, String) -> Result<T, Error>,
) -> Result<Vec<T>, Error> {
    let arr = v
        .as_array()
        .ok_or_else(|| Error::invalid(format!("{path} must be {what}, got {v}")))?;
    arr.iter()
        .enumerate()
        .map(|(i, x)| item(x, format!("{path}[{i}]")))
        .collect()
}

/// The object at `path` and its required prefix `key` (strict notation).
fn object_with_net(v: &Value, path: &str, key: &str) -> Result<IpNet, Error> {
    if !v.is_object() {
        return Err(Error::invalid(format!("{path} must be an object, got {v}")));
    }
    let text =
        opt_str(v, path, key)?.ok_or_else(|| Error::invalid(format!("{path}.{key} is missing")))?;
    parse_net_strict(text).map_err(|why| Error::invalid(format!("{path}.{key} {text:?} {why}")))
}

fn opt_str<'a>(v: &'a Value, path: &str, key: &str) -> Result<Option<&'a str>, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(other) => Err(Error::invalid(format!(
            "{path}.{key} must be a string, got {other}"
        ))),
    }
}

fn opt_ip(v: &Value, path: &str, key: &str) -> Result<Option<IpAddr>, Error> {
    match opt_str(v, path, key)? {
        None => Ok(None),
        Some(s) => {
            if let Some(o) = leading_zero_octet(s) {
                return Err(Error::invalid(format!(
                    "{path}.{key} {s:?} has an octet with a leading zero ({o}), which some tools read as octal: write it without the zero"
                )));
            }
            s.parse()
                .map(Some)
                .map_err(|_| Error::invalid(format!("{path}.{key} {s:?} is not an IP address")))
        }
    }
}

/// A path key; `""` is not set, as the reference reads `dataDir` and `resolvConf`.
fn opt_path(v: &Value, key: &str) -> Result<Option<PathBuf>, Error> {
    match opt_str(v, "ipam", key)? {
        None | Some("") => Ok(None),
        Some(s) => Ok(Some(PathBuf::from(s))),
    }
}

#[cfg(test)]
mod tests;
