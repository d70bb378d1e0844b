//! Block arithmetic: a pool of prefix P cut into blocks of prefix B (2^(B-P) blocks), each
//! handed to the store as one range whose gateway is the block's first usable address.
//! Network, gateway and last address of every block are never leased, so the bridge
//! plugin's `isGateway` works per block and a v4 block's broadcast stays free.

use std::collections::HashSet;

use ipnet::IpNet;

use super::PoolSpec;
use crate::addr::{from_u128, to_u128};
use crate::config::Range;
use crate::Error;

/// Most blocks a pool may have: the claim walk and `pool show` list them, so keep that
/// bounded (a /8 of /26 blocks is 2^18).
pub(crate) const MAX_BLOCKS: u128 = 1 << 20;

/// Check a pool's CIDR and block size (as `pool create` is given them).
pub(crate) fn check_spec(spec: &PoolSpec) -> Result<(), Error> {
    let cidr = spec.cidr;
    if cidr.trunc() != cidr {
        return Err(Error::invalid(format!(
            "--cidr {cidr} has host bits set (the network is {})",
            cidr.trunc()
        )));
    }
    let max = cidr.max_prefix_len();
    if spec.block_size < cidr.prefix_len() || spec.block_size > max - 2 {
        return Err(Error::invalid(format!(
            "--block-size {} must be between the pool's prefix /{} and /{} (a block needs network, gateway, broadcast and one address)",
            spec.block_size,
            cidr.prefix_len(),
            max - 2
        )));
    }
    if count(spec) > MAX_BLOCKS {
        return Err(Error::invalid(format!(
            "--cidr {cidr} with --block-size {} makes {} blocks; at most {MAX_BLOCKS} are allowed (use larger blocks)",
            spec.block_size,
            count(spec)
        )));
    }
    Ok(())
}

/// How many blocks the pool has.
pub(crate) fn count(spec: &PoolSpec) -> u128 {
    let bits = u32::from(spec.block_size - spec.cidr.prefix_len().min(spec.block_size));
    1u128.checked_shl(bits).unwrap_or(u128::MAX)
}

/// Addresses of one block.
fn size(spec: &PoolSpec) -> u128 {
    let bits = u32::from(spec.cidr.max_prefix_len() - spec.block_size);
    1u128 << bits
}

/// Block number `i` of the pool.
pub(crate) fn nth(spec: &PoolSpec, i: u128) -> IpNet {
    let base = to_u128(spec.cidr.network());
    let addr = from_u128(base + i * size(spec), spec.cidr.addr().is_ipv4());
    // The prefix is within the family's bounds (checked by check_spec).
    IpNet::new(addr, spec.block_size).unwrap_or(spec.cidr)
}

/// The index of `block` in the pool, if it is one of its blocks.
pub(crate) fn index_of(spec: &PoolSpec, block: &IpNet) -> Option<u128> {
    if block.prefix_len() != spec.block_size || !spec.cidr.contains(block) {
        return None;
    }
    let off = to_u128(block.network()) - to_u128(spec.cidr.network());
    off.is_multiple_of(size(spec)).then(|| off / size(spec))
}

/// Addresses a block can lease (all but network, gateway and its last address).
#[cfg(test)]
fn capacity(spec: &PoolSpec) -> u128 {
    size(spec) - 3
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
        gateway: Some(from_u128(net + 1, v4)),
    }
}

/// The first block not in `claimed`, walking from block `start` and wrapping. Each step
/// passes a claimed block, so the walk is O(claimed), not O(blocks).
pub(crate) fn first_free(spec: &PoolSpec, claimed: &HashSet<IpNet>, start: u128) -> Option<IpNet> {
    let n = count(spec);
    let steps = (claimed.len() as u128 + 1).min(n);
    (0..steps)
        .map(|k| nth(spec, (start + k) % n))
        .find(|b| !claimed.contains(b))
}

/// Where a node starts looking: spread by its name, so nodes claiming at once rarely
/// race for the same block (the transaction settles it when they do).
pub(crate) fn start_for(spec: &PoolSpec, node: &str) -> u128 {
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    u128::from(h) % count(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cidr: &str, bs: u8) -> PoolSpec {
        PoolSpec {
            cidr: cidr.parse().unwrap(),
            block_size: bs,
        }
    }

    #[test]
    fn blocks_of_a_slash24() {
        let s = spec("10.9.0.0/24", 26);
        assert_eq!(count(&s), 4);
        assert_eq!(nth(&s, 3).to_string(), "10.9.0.192/26");
        assert_eq!(index_of(&s, &"10.9.0.64/26".parse().unwrap()), Some(1));
        assert_eq!(index_of(&s, &"10.9.0.64/27".parse().unwrap()), None);
        assert_eq!(index_of(&s, &"10.9.1.0/26".parse().unwrap()), None);
        assert_eq!(capacity(&s), 61);
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
        assert!(check_spec(&spec("10.0.0.0/16", 26)).is_ok());
        assert!(check_spec(&spec("10.0.0.1/16", 26)).is_err());
        assert!(check_spec(&spec("10.0.0.0/16", 15)).is_err());
        assert!(check_spec(&spec("10.0.0.0/16", 31)).is_err());
        assert!(check_spec(&spec("10.0.0.0/8", 30)).is_err()); // 2^22 blocks
        assert!(check_spec(&spec("fd00::/48", 122)).is_err());
        assert!(check_spec(&spec("fd00::/104", 122)).is_ok());
    }

    #[test]
    fn first_free_skips_claimed_and_wraps() {
        let s = spec("10.9.0.0/24", 26);
        let claimed: HashSet<IpNet> = [nth(&s, 2), nth(&s, 3)].into_iter().collect();
        assert_eq!(first_free(&s, &claimed, 2), Some(nth(&s, 0)));
        assert_eq!(first_free(&s, &claimed, 1), Some(nth(&s, 1)));
        let all: HashSet<IpNet> = (0..4).map(|i| nth(&s, i)).collect();
        assert_eq!(first_free(&s, &all, 0), None);
    }
}
