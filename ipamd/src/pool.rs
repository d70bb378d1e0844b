//! Range arithmetic and host-local's round-robin choice of the next address.
//!
//! The search never walks a whole range: it only steps over addresses in use or excluded,
//! so it is bounded by the number of leases, which keeps a /64 cheap.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::addr::{from_u128, last_usable, to_u128};
use crate::config::{Range, RangeSet};
use crate::Error;

/// A range resolved to numbers, with host-local's defaults filled in for unset bounds.
#[derive(Debug, Clone)]
struct Bounds {
    start: u128,
    end: u128,
    v4: bool,
}

impl Bounds {
    fn of(r: &Range) -> Bounds {
        let v4 = r.subnet.addr().is_ipv4();
        let net = to_u128(r.subnet.network());
        let start = r.range_start.map(to_u128).unwrap_or(net + 1);
        let end = r
            .range_end
            .map(to_u128)
            .unwrap_or_else(|| to_u128(last_usable(&r.subnet)));
        Bounds { start, end, v4 }
    }

    fn holds(&self, ip: IpAddr) -> bool {
        let v = to_u128(ip);
        self.v4 == ip.is_ipv4() && self.start <= v && v <= self.end
    }
}

/// One range set prepared for allocation decisions.
pub(crate) struct Pool<'a> {
    set: &'a RangeSet,
    bounds: Vec<Bounds>,
    /// Addresses never handed out: each subnet's network address, the v4 broadcast, and
    /// every gateway of the set (a gateway of one range may sit inside another range).
    excluded: BTreeSet<u128>,
}

impl<'a> Pool<'a> {
    pub(crate) fn new(set: &'a RangeSet) -> Pool<'a> {
        let mut excluded = BTreeSet::new();
        for r in set {
            let v4 = r.subnet.addr().is_ipv4();
            let net = to_u128(r.subnet.network());
            excluded.insert(net);
            if v4 {
                excluded.insert(to_u128(r.subnet.broadcast()));
            }
            excluded.insert(r.gateway.map(to_u128).unwrap_or(net + 1));
        }
        Pool {
            set,
            bounds: set.iter().map(Bounds::of).collect(),
            excluded,
        }
    }

    /// Which range of the set may hand out `ip` (inside its bounds and not excluded).
    pub(crate) fn range_for(&self, ip: IpAddr) -> Option<usize> {
        if self.excluded.contains(&to_u128(ip)) {
            return None;
        }
        self.bounds.iter().position(|b| b.holds(ip))
    }

    /// Whether `ip` lies within the bounds of some range of the set, excluded or not.
    pub(crate) fn in_bounds(&self, ip: IpAddr) -> bool {
        self.bounds.iter().any(|b| b.holds(ip))
    }

    /// Is `ip` a gateway of some range in the set (to explain a refused request).
    pub(crate) fn is_gateway(&self, ip: IpAddr) -> bool {
        self.set.iter().any(|r| r.gateway == Some(ip))
    }

    /// The range a requested `ip` (within the set's bounds) is taken from; the gateway
    /// and a subnet's network or broadcast address are refused, by both stores alike.
    pub(crate) fn requested_range(&self, ip: IpAddr) -> Result<usize, Error> {
        self.range_for(ip).ok_or_else(|| {
            let what = if self.is_gateway(ip) {
                "the gateway"
            } else {
                "a network or broadcast address"
            };
            Error::conflict(format!(
                "requested address {ip} is {what} of {}",
                describe(self.set)
            ))
        })
    }

    /// The range `idx` of the set.
    pub(crate) fn range(&self, idx: usize) -> Option<&'a Range> {
        self.set.get(idx)
    }

    /// How many addresses the set can hand out.
    pub(crate) fn capacity(&self) -> u128 {
        self.bounds
            .iter()
            .map(|b| {
                let span = (b.end - b.start).saturating_add(1);
                let skipped = self.excluded.range(b.start..=b.end).count() as u128;
                span - skipped
            })
            .fold(0u128, u128::saturating_add)
    }

    /// The next free address after `last` (host-local's round robin): start just past `last`
    /// if it lies in one of the set's ranges, else at the first range's start; walk the
    /// ranges in order, wrapping, until back at the start. Returns the address and the index
    /// of its range.
    ///
    /// `used` is an upper bound of the addresses `is_used` can say yes to (the network's
    /// lease count). Every address the walk passes over is excluded or used, so after
    /// `used + excluded + 1` steps it has necessarily wrapped around: the walk stops there,
    /// and None means the set is full. The cost is O(min(capacity, leases)) even for a /64,
    /// and no count of the addresses in use is needed beforehand.
    pub(crate) fn next_free(
        &self,
        last: Option<IpAddr>,
        used: usize,
        is_used: impl Fn(IpAddr) -> bool,
    ) -> Option<(IpAddr, usize)> {
        let all = &self.bounds;
        if all.is_empty() {
            return None;
        }
        let (mut idx, mut cur) =
            match last.and_then(|l| all.iter().position(|b| b.holds(l)).map(|i| (i, to_u128(l)))) {
                Some((i, v)) => advance(all, i, v),
                None => (0, all[0].start),
            };
        let (start_idx, start) = (idx, cur);
        let max_steps = (used as u128)
            .saturating_add(self.excluded.len() as u128)
            .saturating_add(1);
        let mut steps = 0u128;
        loop {
            let ip = from_u128(cur, all[idx].v4);
            if !self.excluded.contains(&cur) && !is_used(ip) {
                return Some((ip, idx));
            }
            steps += 1;
            (idx, cur) = advance(all, idx, cur);
            if (idx, cur) == (start_idx, start) || steps >= max_steps {
                return None;
            }
        }
    }
}

/// The address after `cur` in range `idx`, or the start of the next range (wrapping).
fn advance(all: &[Bounds], idx: usize, cur: u128) -> (usize, u128) {
    if cur < all[idx].end {
        (idx, cur + 1)
    } else {
        let n = (idx + 1) % all.len();
        (n, all[n].start)
    }
}

/// The index of the set, among `pools`, that a requested `ip` goes to: the first whose
/// ranges hold it; every requested address must find one (the reference: "failed to
/// allocate all requested IPs").
pub(crate) fn requested_set(pools: &[Pool<'_>], ip: IpAddr) -> Result<usize, Error> {
    pools.iter().position(|p| p.in_bounds(ip)).ok_or_else(|| {
        let all: Vec<String> = pools.iter().map(|p| describe(p.set)).collect();
        Error::conflict(format!(
            "requested address {ip} is not in any range set ({})",
            all.join("; ")
        ))
    })
}

/// Records a requested `ip` as set `i`'s address in `wanted` (indexed like `pools`):
/// at most one requested address per range set.
pub(crate) fn want_once(
    wanted: &mut [Option<IpAddr>],
    pools: &[Pool<'_>],
    i: usize,
    ip: IpAddr,
) -> Result<(), Error> {
    if let Some(prev) = wanted[i] {
        return Err(Error::conflict(format!(
            "requested addresses {prev} and {ip} are both in range set {}: at most one address per range set",
            describe(pools[i].set)
        )));
    }
    wanted[i] = Some(ip);
    Ok(())
}

/// Human description of a set for messages: `10.22.0.0/24` or `10.22.0.0/24, 10.23.0.0/24`.
pub(crate) fn describe(set: &RangeSet) -> String {
    let parts: Vec<String> = set.iter().map(|r| r.subnet.to_string()).collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn set(json: &str) -> RangeSet {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        crate::config::IpamConfig::ranges_from_json(&serde_json::json!([v]))
            .unwrap()
            .remove(0)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The address handed out after `last` when nothing is held.
    fn next_after(s: &RangeSet, last: &str) -> IpAddr {
        Pool::new(s)
            .next_free(Some(ip(last)), 0, |_| false)
            .unwrap()
            .0
    }

    #[test]
    fn capacity_of_a_slash24_skips_network_gateway_broadcast() {
        let s = set(r#"[{"subnet":"10.0.0.0/24"}]"#);
        assert_eq!(Pool::new(&s).capacity(), 253);
        let s = set(r#"[{"subnet":"10.0.0.0/30"}]"#);
        assert_eq!(Pool::new(&s).capacity(), 1); // .1 gateway, .2 usable
        let s = set(r#"[{"subnet":"fd00::/120"}]"#);
        assert_eq!(Pool::new(&s).capacity(), 254); // ::1..::ff minus gateway ::1
    }

    #[test]
    fn first_allocation_skips_gateway() {
        let s = set(r#"[{"subnet":"10.0.0.0/24"}]"#);
        assert_eq!(
            Pool::new(&s).next_free(None, 0, |_| false),
            Some((ip("10.0.0.2"), 0))
        );
    }

    #[test]
    fn round_robin_continues_after_last_and_wraps() {
        let s = set(r#"[{"subnet":"10.0.0.0/29"}]"#); // .2 .. .6 usable
        assert_eq!(next_after(&s, "10.0.0.3"), ip("10.0.0.4"));
        // After the range end, wrap to the start, skipping the gateway.
        assert_eq!(next_after(&s, "10.0.0.6"), ip("10.0.0.2"));
        // A freed address right after last is not preferred over ones further along: the
        // walk continues from last.
        let used: HashSet<IpAddr> = [ip("10.0.0.5")].into();
        assert_eq!(
            Pool::new(&s)
                .next_free(Some(ip("10.0.0.4")), used.len(), |a| used.contains(&a))
                .unwrap()
                .0,
            ip("10.0.0.6")
        );
        // last outside the set: start at the beginning.
        assert_eq!(next_after(&s, "192.168.0.1"), ip("10.0.0.2"));
    }

    #[test]
    fn multi_range_set_walks_ranges_in_order() {
        let s = set(
            r#"[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.10","rangeEnd":"10.0.0.11"},
                {"subnet":"10.0.1.0/24","rangeStart":"10.0.1.20","rangeEnd":"10.0.1.21"}]"#,
        );
        assert_eq!(Pool::new(&s).capacity(), 4);
        assert_eq!(
            Pool::new(&s).next_free(Some(ip("10.0.0.11")), 0, |_| false),
            Some((ip("10.0.1.20"), 1))
        );
        assert_eq!(
            Pool::new(&s).next_free(Some(ip("10.0.1.21")), 0, |_| false),
            Some((ip("10.0.0.10"), 0))
        );
        let all: HashSet<IpAddr> = ["10.0.0.10", "10.0.0.11", "10.0.1.20", "10.0.1.21"]
            .iter()
            .map(|a| ip(a))
            .collect();
        assert_eq!(
            Pool::new(&s).next_free(None, all.len(), |a| all.contains(&a)),
            None
        );
    }

    #[test]
    fn full_walk_hands_out_every_usable_address_once() {
        let s = set(r#"[{"subnet":"10.0.0.0/24"}]"#);
        let mut used = HashSet::new();
        let mut last = None;
        while let Some((a, _)) = Pool::new(&s).next_free(last, used.len(), |x| used.contains(&x)) {
            assert!(used.insert(a));
            last = Some(a);
        }
        assert_eq!(used.len() as u128, Pool::new(&s).capacity());
        assert!(!used.contains(&ip("10.0.0.0")));
        assert!(!used.contains(&ip("10.0.0.1")));
        assert!(!used.contains(&ip("10.0.0.255")));
    }

    #[test]
    fn range_for_refuses_excluded_and_outside() {
        let s = set(
            r#"[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.10","rangeEnd":"10.0.0.20","gateway":"10.0.0.15"}]"#,
        );
        assert_eq!(Pool::new(&s).range_for(ip("10.0.0.10")), Some(0));
        assert_eq!(Pool::new(&s).range_for(ip("10.0.0.15")), None);
        assert!(Pool::new(&s).is_gateway(ip("10.0.0.15")));
        assert_eq!(Pool::new(&s).range_for(ip("10.0.0.21")), None);
        assert!(!Pool::new(&s).in_bounds(ip("10.0.0.21")));
        assert_eq!(Pool::new(&s).capacity(), 10);
    }

    #[test]
    fn huge_v6_range_is_cheap() {
        let s = set(r#"[{"subnet":"fd00::/64"}]"#);
        assert_eq!(Pool::new(&s).capacity(), (1u128 << 64) - 2);
        assert_eq!(
            Pool::new(&s).next_free(None, 0, |_| false).unwrap().0,
            ip("fd00::2")
        );
    }

    #[test]
    fn walk_is_bounded_by_the_lease_count() {
        // A /64 whose first 1000 addresses after the gateway are held: found after ~1000
        // steps, and a caller whose count says "1000 held" never walks much further.
        let s = set(r#"[{"subnet":"fd00::/64"}]"#);
        let held = |a: IpAddr| to_u128(a) - to_u128(ip("fd00::")) <= 1001;
        let steps = std::cell::Cell::new(0u32);
        let counting = |a: IpAddr| {
            steps.set(steps.get() + 1);
            held(a)
        };
        assert_eq!(
            Pool::new(&s).next_free(None, 1000, counting).unwrap().0,
            ip("fd00::3ea")
        );
        steps.set(0);
        // Told that only 10 are held while more are: gives up (None = full) after ~10 steps.
        assert_eq!(Pool::new(&s).next_free(None, 10, counting), None);
        assert!(steps.get() <= 12, "{} steps", steps.get());
    }
}
