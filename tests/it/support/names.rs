//! Unique names: tests run in parallel threads of one process, and a killed
//! earlier run may have left things behind.

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A number unique within this test process.
pub fn next_id() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// 6 hex digits derived from the pid and a counter: unique within a run and
/// unlikely to meet leftovers of an earlier (killed) run.
pub fn short_hash() -> String {
    let n = next_id() as u64;
    let pid = std::process::id() as u64;
    // splitmix64 of (pid, n)
    let mut z = (pid << 32 | n).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    format!("{:06x}", z & 0xff_ffff)
}

/// A unique interface name `prefix` + 6 hex digits (prefix ≤ 9 bytes, so < 16).
pub fn ifname_with(prefix: &str) -> String {
    assert!(prefix.len() <= 9, "interface prefix {prefix:?} too long");
    format!("{prefix}{}", short_hash())
}

/// A unique container ID `ctr-TAG-xxxxxx`.
pub fn cid(tag: &str) -> String {
    format!("ctr-{tag}-{}", short_hash())
}

/// Host ports unique within this test process (and unlikely to meet another
/// run's leftovers), below the ephemeral range.
pub fn host_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 50) as u16 * 200;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 200
}

/// A unique IPv4 /24 and IPv6 /64 per call: 10.P.N.0/24 and fdcb:P:N::/64
/// where P derives from the pid and N counts up.
#[derive(Debug, Clone)]
pub struct Subnets {
    pub v4: String,
    pub v6: String,
    p: u32,
    n: u32,
}

static SUBNET_COUNTER: AtomicU32 = AtomicU32::new(0);

impl Subnets {
    pub(super) fn next() -> Subnets {
        let n = SUBNET_COUNTER.fetch_add(1, Ordering::Relaxed);
        assert!(n < 250 * 16, "too many subnets in one test process");
        let p = 100 + (std::process::id() % 16) * 8 + n / 250;
        let n = n % 250;
        Subnets {
            v4: format!("10.{p}.{n}.0/24"),
            v6: format!("fdcb:{p}:{n}::/64"),
            p,
            n,
        }
    }

    /// The IPv4 address with host part `host` in the /24.
    pub fn v4_addr(&self, host: u8) -> String {
        format!("10.{}.{}.{host}", self.p, self.n)
    }

    /// The IPv6 address `fdcb:p:n::host`, in canonical form (as plugins print it).
    pub fn v6_addr(&self, host: u16) -> String {
        let text = format!("fdcb:{}:{}::{host:x}", self.p, self.n);
        text.parse::<std::net::Ipv6Addr>()
            .map(|a| a.to_string())
            .unwrap_or(text)
    }

    /// A /30 inside the /24 (hosts .{4k+1} and .{4k+2}).
    pub fn v4_slash30(&self, k: u8) -> String {
        format!("10.{}.{}.{}/30", self.p, self.n, k * 4)
    }

    /// `[[{subnet v4}],[{subnet v6}]]` — one address of each family.
    pub fn dual_ranges(&self) -> Value {
        json!([[{"subnet": self.v4}], [{"subnet": self.v6}]])
    }

    pub fn v4_ranges(&self) -> Value {
        json!([[{"subnet": self.v4}]])
    }
}
