//! host-local's range canonicalization and validation: fill the defaults (gateway `.1`,
//! rangeStart = network+1, rangeEnd = last usable) and refuse what could never allocate
//! correctly, naming the key and the value.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{PathSet, Range, RangeSet};
use crate::addr::{last_usable, next, to_u128};
use crate::Error;

/// Validate parsed range sets (config or runtimeConfig) and return them canonicalized.
pub(super) fn validate_sets(sets: Vec<PathSet>) -> Result<Vec<RangeSet>, Error> {
    let mut out: Vec<(String, RangeSet)> = Vec::with_capacity(sets.len());
    for set in sets {
        let mut canon = Vec::with_capacity(set.ranges.len());
        for (path, range) in &set.ranges {
            canon.push(canonicalize_range(range, path)?);
        }
        check_set(&set.label, &set.ranges, &canon)?;
        out.push((set.label, canon));
    }
    // host-local refuses range sets that overlap each other: one attachment would otherwise
    // be able to get two addresses from the same range.
    for i in 0..out.len() {
        for j in i + 1..out.len() {
            if let Some((a, b)) = sets_overlap(&out[i].1, &out[j].1) {
                return Err(Error::invalid(format!(
                    "{} ({}) overlaps {} ({})",
                    out[i].0, a, out[j].0, b
                )));
            }
        }
    }
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
    let gateway = match r.gateway {
        Some(gw) => {
            check_inside(path, "gateway", gw, &subnet)?;
            gw
        }
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

fn check_set(label: &str, paths: &[(String, Range)], set: &[Range]) -> Result<(), Error> {
    let Some(first) = set.first() else {
        return Err(Error::invalid(format!("{label} is an empty range set")));
    };
    let v4 = first.subnet.addr().is_ipv4();
    for (i, r) in set.iter().enumerate() {
        if r.subnet.addr().is_ipv4() != v4 {
            return Err(Error::invalid(format!(
                "{}.subnet {} mixes address families within one range set (the set's first range is {})",
                paths[i].0, r.subnet, first.subnet
            )));
        }
        for (j, other) in set.iter().enumerate().skip(i + 1) {
            if bounds_overlap(r, other) {
                return Err(Error::invalid(format!(
                    "{} ({}) overlaps {} ({})",
                    paths[i].0,
                    describe(r),
                    paths[j].0,
                    describe(other)
                )));
            }
        }
    }
    Ok(())
}

fn sets_overlap<'a>(a: &'a [Range], b: &'a [Range]) -> Option<(String, String)> {
    for ra in a {
        for rb in b {
            if bounds_overlap(ra, rb) {
                return Some((describe(ra), describe(rb)));
            }
        }
    }
    None
}

/// `[start, end]` intervals of two canonical ranges intersect (same family only).
fn bounds_overlap(a: &Range, b: &Range) -> bool {
    if a.subnet.addr().is_ipv4() != b.subnet.addr().is_ipv4() {
        return false;
    }
    let (Some(a0), Some(a1), Some(b0), Some(b1)) =
        (a.range_start, a.range_end, b.range_start, b.range_end)
    else {
        return false;
    };
    to_u128(a0) <= to_u128(b1) && to_u128(b0) <= to_u128(a1)
}

fn describe(r: &Range) -> String {
    match (r.range_start, r.range_end) {
        (Some(s), Some(e)) => format!("{} {s}-{e}", r.subnet),
        _ => r.subnet.to_string(),
    }
}
