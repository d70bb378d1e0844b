//! Block arithmetic: each CIDR of a pool is cut into blocks of the pool's block size, each
//! handed to the store as one range whose gateway is the block's first usable address.
//! Network, gateway and last address of every block are never leased, so the bridge
//! plugin's `isGateway` works per block and a v4 block's broadcast stays free.
//!
//! Blocks are numbered across the pool's CIDRs in their order (the first CIDR's blocks,
//! then the second's, …); claims walk only the CIDRs that are not draining.

use std::collections::HashSet;

use ipnet::IpNet;

use super::PoolSpec;
use crate::addr::{from_u128, to_u128};
use crate::config::Range;
use crate::Error;

/// Most blocks a pool may have: the claim walk and `pool show` list them, so keep that
/// bounded (a /8 of /26 blocks is 2^18).
pub(crate) const MAX_BLOCKS: u128 = 1 << 20;

/// Check a pool's CIDRs and block size (as `pool create` and `pool update` are given them).
pub(crate) fn check_spec(spec: &PoolSpec) -> Result<(), Error> {
    let Some(first) = spec.cidrs.first() else {
        return Err(Error::invalid("a pool needs at least one --cidr"));
    };
    for (i, cidr) in spec.cidrs.iter().enumerate() {
        check_cidr(spec, cidr)?;
        if cidr.addr().is_ipv4() != first.addr().is_ipv4() {
            return Err(Error::invalid(format!(
                "--cidr {cidr} is not of the family of {first}: a pool is IPv4 or IPv6 (make one of each for dual-stack)"
            )));
        }
        if let Some(other) = spec.cidrs[..i].iter().find(|o| overlap(o, cidr)) {
            return Err(Error::invalid(format!(
                "--cidr {cidr} overlaps the pool's {other}"
            )));
        }
    }
    if let Some(d) = spec.draining.iter().find(|d| !spec.cidrs.contains(d)) {
        return Err(Error::invalid(format!(
            "{d} is draining but not one of the pool's CIDRs"
        )));
    }
    if count(spec) > MAX_BLOCKS {
        return Err(Error::invalid(format!(
            "the pool's CIDRs with --block-size {} make {} blocks; at most {MAX_BLOCKS} are allowed (use larger blocks)",
            spec.block_size,
            count(spec)
        )));
    }
    Ok(())
}

fn check_cidr(spec: &PoolSpec, cidr: &IpNet) -> Result<(), Error> {
    if cidr.trunc() != *cidr {
        return Err(Error::invalid(format!(
            "--cidr {cidr} has host bits set (the network is {})",
            cidr.trunc()
        )));
    }
    let max = cidr.max_prefix_len();
    if spec.block_size < cidr.prefix_len() || spec.block_size > max - 2 {
        return Err(Error::invalid(format!(
            "--block-size {} must be between the prefix of --cidr {cidr} and /{} (a block needs network, gateway, broadcast and one address)",
            spec.block_size,
            max - 2
        )));
    }
    Ok(())
}

/// Whether two networks share an address.
pub(crate) fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Blocks of one CIDR.
fn blocks_in(cidr: &IpNet, block_size: u8) -> u128 {
    let bits = u32::from(block_size.saturating_sub(cidr.prefix_len()));
    1u128.checked_shl(bits).unwrap_or(u128::MAX)
}

/// How many blocks the pool has, draining CIDRs included.
pub(crate) fn count(spec: &PoolSpec) -> u128 {
    spec.cidrs
        .iter()
        .map(|c| blocks_in(c, spec.block_size))
        .fold(0u128, u128::saturating_add)
}

/// The CIDRs new blocks come from.
pub(crate) fn claimable(spec: &PoolSpec) -> impl Iterator<Item = &IpNet> {
    spec.cidrs.iter().filter(|c| !spec.draining.contains(c))
}

/// Blocks new claims can take (those of CIDRs not draining).
pub(crate) fn claimable_count(spec: &PoolSpec) -> u128 {
    claimable(spec)
        .map(|c| blocks_in(c, spec.block_size))
        .fold(0u128, u128::saturating_add)
}

/// Whether `block` lies in a CIDR that is draining.
pub(crate) fn is_draining(spec: &PoolSpec, block: &IpNet) -> bool {
    spec.draining.iter().any(|d| d.contains(block))
}

/// Addresses of one block.
fn size(block_size: u8, v4: bool) -> u128 {
    let max = if v4 { 32 } else { 128 };
    1u128 << (max - block_size)
}

/// Addresses a block can lease (all but network, gateway and its last address).
pub(crate) fn capacity(spec: &PoolSpec) -> u128 {
    let v4 = spec.cidrs.first().is_none_or(|c| c.addr().is_ipv4());
    size(spec.block_size, v4) - 3
}

/// Block `i` of `cidr`.
fn nth_in(cidr: &IpNet, block_size: u8, i: u128) -> IpNet {
    let v4 = cidr.addr().is_ipv4();
    let addr = from_u128(to_u128(cidr.network()) + i * size(block_size, v4), v4);
    // The prefix is within the family's bounds (checked by check_spec).
    IpNet::new(addr, block_size).unwrap_or(*cidr)
}

/// Block number `i` of the CIDRs `cidrs`, numbered one CIDR after the other.
fn nth_of<'a>(
    cidrs: impl Iterator<Item = &'a IpNet>,
    block_size: u8,
    mut i: u128,
) -> Option<IpNet> {
    for c in cidrs {
        let n = blocks_in(c, block_size);
        if i < n {
            return Some(nth_in(c, block_size, i));
        }
        i -= n;
    }
    None
}

/// The number of `block` across the pool's CIDRs, if it is one of its blocks.
pub(crate) fn index_of(spec: &PoolSpec, block: &IpNet) -> Option<u128> {
    if block.prefix_len() != spec.block_size {
        return None;
    }
    let mut before = 0u128;
    for c in &spec.cidrs {
        if c.contains(block) {
            let v4 = c.addr().is_ipv4();
            let off = to_u128(block.network()) - to_u128(c.network());
            let sz = size(spec.block_size, v4);
            return off.is_multiple_of(sz).then(|| before + off / sz);
        }
        before += blocks_in(c, spec.block_size);
    }
    None
}

/// The block as a store range: gateway = first usable, leases from the one after it to the
/// one before the last address.
pub(crate) fn range(block: &IpNet) -> Range {
    let v4 = block.addr().is_ipv4();
    let net = to_u128(block.network());
    let last = net + (1u128 << (block.max_prefix_len() - block.prefix_len())) - 1;
    Range {
        subnet: *block,
        range_start: Some(from_u128(net + 2, v4)),
        range_end: Some(from_u128(last - 1, v4)),
        gateway: Some(gateway(block)),
    }
}

/// A block's gateway: its first usable address (what a bridge on the owning node has).
pub fn gateway(block: &IpNet) -> std::net::IpAddr {
    from_u128(to_u128(block.network()) + 1, block.addr().is_ipv4())
}

/// The first block of a claimable CIDR not in `taken`, walking from claimable block
/// `start` and wrapping. Each step passes a taken block, so the walk is O(taken), not
/// O(blocks).
pub(crate) fn first_free(spec: &PoolSpec, taken: &HashSet<IpNet>, start: u128) -> Option<IpNet> {
    let n = claimable_count(spec);
    if n == 0 {
        return None;
    }
    let steps = (taken.len() as u128 + 1).min(n);
    (0..steps)
        .filter_map(|k| nth_of(claimable(spec), spec.block_size, (start + k) % n))
        .find(|b| !taken.contains(b))
}

/// Where a node starts looking: spread by its name, so nodes claiming at once rarely
/// race for the same block (the transaction settles it when they do).
pub(crate) fn start_for(spec: &PoolSpec, node: &str) -> u128 {
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    u128::from(h) % claimable_count(spec).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cidrs: &[&str], bs: u8) -> PoolSpec {
        PoolSpec {
            cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            block_size: bs,
            reclaim_after: 0,
            draining: Vec::new(),
        }
    }

    fn nth(s: &PoolSpec, i: u128) -> IpNet {
        nth_of(s.cidrs.iter(), s.block_size, i).unwrap()
    }

    #[test]
    fn blocks_of_a_slash24() {
        let s = spec(&["10.9.0.0/24"], 26);
        assert_eq!(count(&s), 4);
        assert_eq!(nth(&s, 3).to_string(), "10.9.0.192/26");
        assert_eq!(index_of(&s, &"10.9.0.64/26".parse().unwrap()), Some(1));
        assert_eq!(index_of(&s, &"10.9.0.64/27".parse().unwrap()), None);
        assert_eq!(index_of(&s, &"10.9.1.0/26".parse().unwrap()), None);
        assert_eq!(capacity(&s), 61);
    }

    #[test]
    fn blocks_are_numbered_across_cidrs() {
        let s = spec(&["10.9.0.0/25", "10.8.0.0/24"], 26);
        assert_eq!(count(&s), 6);
        assert_eq!(nth(&s, 2).to_string(), "10.8.0.0/26");
        assert_eq!(index_of(&s, &"10.8.0.64/26".parse().unwrap()), Some(3));
        assert_eq!(index_of(&s, &"10.9.0.64/26".parse().unwrap()), Some(1));
    }

    #[test]
    fn block_range_reserves_network_gateway_and_last() {
        let r = range(&"10.9.0.64/26".parse().unwrap());
        assert_eq!(r.gateway.unwrap().to_string(), "10.9.0.65");
        assert_eq!(r.range_start.unwrap().to_string(), "10.9.0.66");
        assert_eq!(r.range_end.unwrap().to_string(), "10.9.0.126");
        let r = range(&"fd00::40/122".parse().unwrap());
        assert_eq!(r.range_end.unwrap().to_string(), "fd00::7e");
    }

    #[test]
    fn specs_are_checked() {
        assert!(check_spec(&spec(&["10.0.0.0/16"], 26)).is_ok());
        assert!(check_spec(&spec(&["10.0.0.1/16"], 26)).is_err());
        assert!(check_spec(&spec(&["10.0.0.0/16"], 15)).is_err());
        assert!(check_spec(&spec(&["10.0.0.0/16"], 31)).is_err());
        assert!(check_spec(&spec(&["10.0.0.0/8"], 30)).is_err()); // 2^22 blocks
        assert!(check_spec(&spec(&["fd00::/48"], 122)).is_err());
        assert!(check_spec(&spec(&["fd00::/104"], 122)).is_ok());
        assert!(check_spec(&spec(&[], 26)).is_err());
        assert!(check_spec(&spec(&["10.0.0.0/16", "10.0.1.0/24"], 26)).is_err());
        assert!(check_spec(&spec(&["10.0.0.0/16", "fd00::/104"], 26)).is_err());
        assert!(check_spec(&spec(&["10.0.0.0/16", "10.1.0.0/24"], 26)).is_ok());
        // Every CIDR must hold whole blocks.
        assert!(check_spec(&spec(&["10.0.0.0/16", "10.1.0.0/28"], 26)).is_err());
    }

    #[test]
    fn first_free_skips_taken_and_wraps() {
        let s = spec(&["10.9.0.0/24"], 26);
        let taken: HashSet<IpNet> = [nth(&s, 2), nth(&s, 3)].into_iter().collect();
        assert_eq!(first_free(&s, &taken, 2), Some(nth(&s, 0)));
        assert_eq!(first_free(&s, &taken, 1), Some(nth(&s, 1)));
        let all: HashSet<IpNet> = (0..4).map(|i| nth(&s, i)).collect();
        assert_eq!(first_free(&s, &all, 0), None);
    }

    #[test]
    fn draining_cidrs_give_no_new_block() {
        let mut s = spec(&["10.9.0.0/25", "10.8.0.0/25"], 26);
        s.draining.push("10.9.0.0/25".parse().unwrap());
        assert_eq!(claimable_count(&s), 2);
        let none = HashSet::new();
        for start in 0..4 {
            let b = first_free(&s, &none, start).unwrap();
            assert!(b.to_string().starts_with("10.8."), "{b}");
        }
        assert!(is_draining(&s, &"10.9.0.64/26".parse().unwrap()));
        s.draining.push("10.8.0.0/25".parse().unwrap());
        assert_eq!(first_free(&s, &none, 0), None);
    }
}
