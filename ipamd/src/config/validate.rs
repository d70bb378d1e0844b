//! host-local's range canonicalization and validation: fill the defaults (gateway `.1`,
//! rangeStart = network+1, rangeEnd = last usable) and refuse what could never allocate
//! correctly, naming the key and the value.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{PathSet, Range, RangeSet};
use crate::addr::{last_usable, next, to_u128};
use crate::Error;

/// Most ranges, all range sets together. Validation is O(n log n), but every allocation and
/// STATUS walks the ranges again under the network's lock: a request must not be able to
/// make that arbitrarily expensive. Real networks have a handful.
pub(crate) const MAX_RANGES: usize = 1024;

/// Validate parsed range sets (config or runtimeConfig) and return them canonicalized.
pub(super) fn validate_sets(sets: Vec<PathSet>) -> Result<Vec<RangeSet>, Error> {
    let total: usize = sets.iter().map(|s| s.ranges.len()).sum();
    if total > MAX_RANGES {
        let what = sets.first().map_or("the range sets", |s| s.label.as_str());
        return Err(Error::invalid(format!(
            "{total} ranges given (starting at {what}); at most {MAX_RANGES} ranges are allowed in all range sets together"
        )));
    }
    let mut out: Vec<(String, RangeSet)> = Vec::with_capacity(sets.len());
    for set in &sets {
        let mut canon = Vec::with_capacity(set.ranges.len());
        for (path, range) in &set.ranges {
            canon.push(canonicalize_range(range, path)?);
        }
        check_family(&set.label, &set.ranges, &canon)?;
        out.push((set.label.clone(), canon));
    }
    check_overlaps(&sets, &out)?;
    Ok(out.into_iter().map(|(_, s)| s).collect())
}

/// Validate range sets received over the wire (the daemon does not trust its callers to have
/// run the config validation). Error paths are `rangeSets[i][j]`.
pub(crate) fn canonicalize_range_sets(sets: &[RangeSet]) -> Result<Vec<RangeSet>, Error> {
    if sets.is_empty() {
        return Err(Error::invalid(
            "no IP ranges specified (set ipam.subnet, ipam.ranges or runtimeConfig.ipRanges)",
        ));
    }
    let path_sets = sets
        .iter()
        .enumerate()
        .map(|(i, set)| PathSet {
            label: format!("rangeSets[{i}]"),
            ranges: set
                .iter()
                .enumerate()
                .map(|(j, r)| (format!("rangeSets[{i}][{j}]"), r.clone()))
                .collect(),
        })
        .collect();
    validate_sets(path_sets)
}

fn canonicalize_range(r: &Range, path: &str) -> Result<Range, Error> {
    let subnet = r.subnet;
    if subnet.trunc() != subnet {
        return Err(Error::invalid(format!(
            "{path}.subnet {subnet} has host bits set (the network is {})",
            subnet.trunc()
        )));
    }
    // Like host-local: a subnet needs at least two host bits, otherwise there is no address
    // left besides network/broadcast (v4 /31, /32; v6 /127, /128 are refused).
    if subnet.prefix_len() + 2 > subnet.max_prefix_len() {
        return Err(Error::invalid(format!(
            "{path}.subnet {subnet} is too small to allocate from (at most /{} allowed)",
            subnet.max_prefix_len() - 2
        )));
    }
    let first = next(subnet.network());
    // The gateway need not be inside the subnet, as in the reference: a link-local gateway
    // (ptp, ipvlan L3, a router reached on-link) is a real pattern. It is never handed
    // out (`Pool` excludes every gateway of a set), which matters only when it lies in a
    // range. Another address family could only be a mistake, and would put a v6 gateway
    // with a v4 prefix length on a bridge: refused.
    let gateway = match r.gateway {
        Some(gw) if gw.is_ipv4() != subnet.addr().is_ipv4() => {
            return Err(Error::invalid(format!(
                "{path}.gateway {gw} is not of the address family of subnet {subnet}"
            )));
        }
        Some(gw) => gw,
        None => first,
    };
    let start = match r.range_start {
        Some(s) => {
            check_inside(path, "rangeStart", s, &subnet)?;
            s
        }
        None => first,
    };
    let end = match r.range_end {
        Some(e) => {
            check_inside(path, "rangeEnd", e, &subnet)?;
            e
        }
        None => last_usable(&subnet),
    };
    if to_u128(start) > to_u128(end) {
        return Err(Error::invalid(format!(
            "{path}.rangeStart {start} is after {path}.rangeEnd {end}"
        )));
    }
    Ok(Range {
        subnet,
        range_start: Some(start),
        range_end: Some(end),
        gateway: Some(gateway),
    })
}

fn check_inside(path: &str, key: &str, ip: IpAddr, subnet: &IpNet) -> Result<(), Error> {
    if subnet.contains(&ip) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{path}.{key} {ip} is outside subnet {subnet}"
        )))
    }
}

fn check_family(label: &str, paths: &[(String, Range)], set: &[Range]) -> Result<(), Error> {
    let Some(first) = set.first() else {
        return Err(Error::invalid(format!("{label} is an empty range set")));
    };
    let v4 = first.subnet.addr().is_ipv4();
    if let Some(i) = set.iter().position(|r| r.subnet.addr().is_ipv4() != v4) {
        return Err(Error::invalid(format!(
            "{}.subnet {} mixes address families within one range set (the set's first range is {})",
            paths[i].0, set[i].subnet, first.subnet
        )));
    }
    Ok(())
}

/// Refuse intersecting `[start, end]` bounds, within a set (host-local refuses that) or
/// between sets (one attachment would get two addresses from the same range). Sorting by
/// start finds an intersection, if there is one, between a range and the one reaching
/// furthest among those before it: O(n log n).
fn check_overlaps(paths: &[PathSet], sets: &[(String, RangeSet)]) -> Result<(), Error> {
    // (v4, start, end, set index, range index)
    let mut all: Vec<(bool, u128, u128, usize, usize)> = Vec::new();
    for (i, (_, set)) in sets.iter().enumerate() {
        for (j, r) in set.iter().enumerate() {
            if let (Some(s), Some(e)) = (r.range_start, r.range_end) {
                all.push((s.is_ipv4(), to_u128(s), to_u128(e), i, j));
            }
        }
    }
    all.sort_unstable();
    let mut reach: Option<(bool, u128, usize, usize)> = None;
    for &(v4, start, end, i, j) in &all {
        if let Some((rv4, rend, ri, rj)) = reach {
            if rv4 == v4 && start <= rend {
                let (a, b) = ((ri, rj).min((i, j)), (ri, rj).max((i, j)));
                let (ra, rb) = (&sets[a.0].1[a.1], &sets[b.0].1[b.1]);
                let (la, lb) = if a.0 == b.0 {
                    (&paths[a.0].ranges[a.1].0, &paths[b.0].ranges[b.1].0)
                } else {
                    (&sets[a.0].0, &sets[b.0].0)
                };
                return Err(Error::invalid(format!(
                    "{la} ({}) overlaps {lb} ({})",
                    describe(ra),
                    describe(rb)
                )));
            }
            if rv4 == v4 && rend >= end {
                continue;
            }
        }
        reach = Some((v4, end, i, j));
    }
    Ok(())
}

fn describe(r: &Range) -> String {
    match (r.range_start, r.range_end) {
        (Some(s), Some(e)) => format!("{} {s}-{e}", r.subnet),
        _ => r.subnet.to_string(),
    }
}
