//! Which address each range set gives an attachment, decided from the directory's leases
//! alone (pure, so the rules are unit tested here). The reference's rules, except where
//! noted: a requested address must lie in some set and not be its gateway; otherwise the
//! round robin resumes after `last_reserved_ip.N`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::dir::{Leases, Owner};
use crate::config::RangeSet;
use crate::pool::{describe, requested_set, want_once, Pool};
use crate::{Error, ErrorKind};

/// The address one range set gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pick {
    pub addr: IpAddr,
    /// Index of the range within its set (for the prefix and gateway).
    pub range: usize,
    /// False when the attachment holds it already (an ADD repeated).
    pub new: bool,
}

/// One address per set for `owner` (an `Owner::Attachment`).
///
/// Unlike the reference, which refuses a second ADD of the same attachment ("duplicate
/// allocation is not allowed"), an address the attachment already holds in a set is given
/// again: runtimes retry ADD after a timeout, and the retry must not fail or leak.
pub(crate) fn choose(
    sets: &[RangeSet],
    leases: &Leases,
    owner: &Owner,
    requested: &[IpAddr],
    last: impl Fn(usize) -> Option<IpAddr>,
) -> Result<Vec<Pick>, Error> {
    let pools: Vec<Pool<'_>> = sets.iter().map(Pool::new).collect();
    let wanted = assign_requested(sets, &pools, requested)?;
    let mine: Vec<IpAddr> = leases
        .iter()
        .filter(|(_, o)| *o == owner)
        .map(|(a, _)| *a)
        .collect();
    let mut taken: BTreeSet<IpAddr> = BTreeSet::new();
    let mut out = Vec::with_capacity(sets.len());
    for (i, pool) in pools.iter().enumerate() {
        let held = mine.iter().copied().find(|a| pool.range_for(*a).is_some());
        let pick = match (wanted[i], held) {
            (Some(want), Some(h)) if want == h => reuse(pool, h),
            (Some(want), Some(h)) => {
                return Err(Error::conflict(format!(
                    "{} already holds {h} in range set {}; requested address {want} differs (delete the attachment first)",
                    owner.describe(),
                    describe(&sets[i])
                )))
            }
            (Some(want), None) => requested_pick(pool, &sets[i], leases, want)?,
            (None, Some(h)) => reuse(pool, h),
            (None, None) => {
                let used = leases.len() + taken.len();
                let is_used = |a: IpAddr| leases.contains_key(&a) || taken.contains(&a);
                let (addr, range) = pool
                    .next_free(last(i), used, is_used)
                    .ok_or_else(|| exhausted(&sets[i], pool, leases))?;
                Pick {
                    addr,
                    range,
                    new: true,
                }
            }
        };
        taken.insert(pick.addr);
        out.push(pick);
    }
    Ok(out)
}

fn reuse(pool: &Pool<'_>, addr: IpAddr) -> Pick {
    Pick {
        addr,
        range: pool.range_for(addr).unwrap_or(0),
        new: false,
    }
}

/// Each requested address goes to the set whose ranges contain it, one per set.
fn assign_requested(
    sets: &[RangeSet],
    pools: &[Pool<'_>],
    requested: &[IpAddr],
) -> Result<Vec<Option<IpAddr>>, Error> {
    let mut wanted: Vec<Option<IpAddr>> = vec![None; sets.len()];
    for &ip in requested {
        let i = requested_set(pools, ip)?;
        want_once(&mut wanted, pools, i, ip)?;
    }
    Ok(wanted)
}

fn requested_pick(
    pool: &Pool<'_>,
    set: &RangeSet,
    leases: &Leases,
    ip: IpAddr,
) -> Result<Pick, Error> {
    let range = pool.requested_range(ip)?;
    if let Some(holder) = leases.get(&ip) {
        return Err(Error::conflict(format!(
            "requested address {ip} is not available in range set {}: it is held by {}",
            describe(set),
            holder.describe()
        )));
    }
    Ok(Pick {
        addr: ip,
        range,
        new: true,
    })
}

fn exhausted(set: &RangeSet, pool: &Pool<'_>, leases: &Leases) -> Error {
    let used = in_set(pool, leases);
    Error::new(
        ErrorKind::Exhausted,
        format!(
            "no IP addresses available in range set {} ({used} in use); leases whose containers are gone are freed by CNI GC or by removing their files",
            describe(set)
        ),
    )
}

/// How many leases lie in the set's ranges.
pub(crate) fn in_set(pool: &Pool<'_>, leases: &Leases) -> u128 {
    leases
        .keys()
        .filter(|a| pool.range_for(**a).is_some())
        .count() as u128
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sets(json: &str) -> Vec<RangeSet> {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        crate::config::IpamConfig::ranges_from_json(&v).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn me() -> Owner {
        Owner::attachment("c1", "eth0")
    }

    fn addrs(p: &[Pick]) -> Vec<String> {
        p.iter().map(|p| p.addr.to_string()).collect()
    }

    #[test]
    fn round_robin_resumes_after_last_reserved_and_skips_held() {
        let s = sets(r#"[[{"subnet":"10.1.0.0/29"}]]"#);
        let mut leases = Leases::new();
        let p = choose(&s, &leases, &me(), &[], |_| None).unwrap();
        assert_eq!(addrs(&p), ["10.1.0.2"]);
        leases.insert(ip("10.1.0.5"), Owner::Container("old".into()));
        let p = choose(&s, &leases, &me(), &[], |_| Some(ip("10.1.0.4"))).unwrap();
        assert_eq!(addrs(&p), ["10.1.0.6"]);
        assert!(p[0].new);
    }

    #[test]
    fn dual_stack_gets_one_per_set_and_repeat_add_reuses() {
        let s = sets(r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd01::/64"}]]"#);
        let mut leases = Leases::new();
        let p = choose(&s, &leases, &me(), &[], |_| None).unwrap();
        assert_eq!(addrs(&p), ["10.1.0.2", "fd01::2"]);
        for pick in &p {
            leases.insert(pick.addr, me());
        }
        let again = choose(&s, &leases, &me(), &[], |_| None).unwrap();
        assert_eq!(addrs(&again), ["10.1.0.2", "fd01::2"]);
        assert!(again.iter().all(|p| !p.new));
        // Another interface of the same container gets addresses of its own.
        let other = Owner::attachment("c1", "eth1");
        let p = choose(&s, &leases, &other, &[], |_| None).unwrap();
        assert_eq!(addrs(&p), ["10.1.0.3", "fd01::3"]);
    }

    #[test]
    fn requested_addresses() {
        let s = sets(r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd01::/64"}]]"#);
        let mut leases = Leases::new();
        let p = choose(&s, &leases, &me(), &[ip("fd01::9"), ip("10.1.0.9")], |_| {
            None
        })
        .unwrap();
        assert_eq!(addrs(&p), ["10.1.0.9", "fd01::9"]);
        leases.insert(ip("10.1.0.9"), Owner::attachment("c2", "eth0"));
        let e = choose(&s, &leases, &me(), &[ip("10.1.0.9")], |_| None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert!(e.message().contains("container c2/eth0"), "{e}");
        let e = choose(&s, &leases, &me(), &[ip("10.1.0.1")], |_| None).unwrap_err();
        assert!(e.message().contains("gateway"), "{e}");
        let e = choose(&s, &leases, &me(), &[ip("10.9.0.1")], |_| None).unwrap_err();
        assert!(e.message().contains("not in any range set"), "{e}");
        let e = choose(
            &s,
            &leases,
            &me(),
            &[ip("10.1.0.7"), ip("10.1.0.8")],
            |_| None,
        )
        .unwrap_err();
        assert!(e.message().contains("both in range set"), "{e}");
        // Requested again by its holder: the same answer; a different one: refused.
        leases.insert(ip("10.1.0.7"), me());
        let p = choose(&s, &leases, &me(), &[ip("10.1.0.7")], |_| None).unwrap();
        assert_eq!(p[0].addr, ip("10.1.0.7"));
        let e = choose(&s, &leases, &me(), &[ip("10.1.0.8")], |_| None).unwrap_err();
        assert!(e.message().contains("already holds 10.1.0.7"), "{e}");
    }

    #[test]
    fn full_set_is_exhausted_naming_the_count() {
        let s = sets(r#"[[{"subnet":"10.1.0.0/30"}]]"#);
        let mut leases = Leases::new();
        leases.insert(ip("10.1.0.2"), Owner::Unreadable);
        let e = choose(&s, &leases, &me(), &[], |_| None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Exhausted);
        assert!(e.message().contains("(1 in use)"), "{e}");
    }
}
