//! Address arithmetic shared by range validation (`config`) and allocation (`pool`).
//! Addresses are handled as `u128` so one code path serves v4 and v6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

pub(crate) fn from_u128(v: u128, v4: bool) -> IpAddr {
    if v4 {
        // Truncation is intended: v4 values never exceed u32 here.
        IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

/// The address after `ip` (wrapping at the end of its family).
pub(crate) fn next(ip: IpAddr) -> IpAddr {
    from_u128(to_u128(ip).wrapping_add(1), ip.is_ipv4())
}

/// host-local's `lastIP`: the broadcast address minus one for v4, the last address for v6.
pub(crate) fn last_usable(subnet: &IpNet) -> IpAddr {
    let b = subnet.broadcast();
    if b.is_ipv4() {
        from_u128(to_u128(b) - 1, true)
    } else {
        b
    }
}

/// A dotted-decimal octet written with a leading zero (`040` in `10.95.040.0/24`), if `s`
/// (an address or CIDR, v4 or v6 with an embedded v4) has one. Go, glibc and curl read such
/// an octet as octal (32) while a decimal parser reads 40: the same text would name two
/// different networks, so it is refused rather than guessed.
pub(crate) fn leading_zero_octet(s: &str) -> Option<&str> {
    let addr = s.split('/').next().unwrap_or(s);
    let dotted = addr.rsplit(':').next().unwrap_or(addr);
    if !dotted.contains('.') {
        return None;
    }
    dotted
        .split('.')
        .find(|o| o.len() > 1 && o.starts_with('0'))
}

/// A CIDR, refusing octets with leading zeros (which `ipnet` would read as decimal).
pub(crate) fn parse_net_strict(s: &str) -> Result<IpNet, String> {
    if let Some(o) = leading_zero_octet(s) {
        return Err(format!(
            "has an octet with a leading zero ({o}), which some tools read as octal: write it without the zero"
        ));
    }
    s.parse()
        .map_err(|_| "is not a CIDR (like 10.22.0.0/16)".to_string())
}
