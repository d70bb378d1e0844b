//! bandwidth's configuration: the four keys from the configuration or the
//! capability, and the token bucket each direction gets, computed as the
//! reference computes it.

use crate::cni::{Error, Request};
use crate::netlink::Tbf;
use serde::Deserialize;

/// The four keys, at the top of the configuration or in the `bandwidth`
/// capability (`runtimeConfig.bandwidth`): rates in bits per second, bursts
/// in bits; 0 or absent means no limit in that direction.
#[derive(Debug, Default, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(super) struct Entry {
    #[serde(default)]
    ingress_rate: Option<u64>,
    #[serde(default)]
    ingress_burst: Option<u64>,
    #[serde(default)]
    egress_rate: Option<u64>,
    #[serde(default)]
    egress_burst: Option<u64>,
}

impl Entry {
    fn is_set(&self) -> bool {
        [
            self.ingress_rate,
            self.ingress_burst,
            self.egress_rate,
            self.egress_burst,
        ]
        .iter()
        .any(Option::is_some)
    }
}

/// What to shape, validated: a TBF per direction that has a limit.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shaping {
    pub ingress: Option<Tbf>,
    pub egress: Option<Tbf>,
}

impl Shaping {
    /// The configuration's own keys when it has any (as the reference reads
    /// them, they then replace the capability as a whole), else the capability.
    pub(super) fn load(req: &Request) -> Result<Shaping, Error> {
        let own: Entry = req.conf.typed()?;
        let entry = match req.conf.runtime_config("bandwidth") {
            Some(cap) if !own.is_set() => {
                serde_json::from_value::<Entry>(cap.clone()).map_err(|e| {
                    Error::invalid_config(format!("runtimeConfig.bandwidth {cap}: {e}"))
                })?
            }
            _ => own,
        };
        Ok(Shaping {
            ingress: direction("ingress", entry.ingress_rate, entry.ingress_burst)?,
            egress: direction("egress", entry.egress_rate, entry.egress_burst)?,
        })
    }

    /// DEL with a configuration `load` refuses: remove whatever there may be.
    pub(super) fn everything(_: &Request) -> Shaping {
        let any = Some(Tbf {
            rate: 0,
            limit: 0,
            buffer: 0,
        });
        Shaping {
            ingress: any,
            egress: any,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }
}

/// Scheduler ticks per microsecond: the kernel's PSCHED_SHIFT is 6, so a
/// tick is 64 ns (what /proc/net/psched has said since 2.6.x, and what the
/// reference reads there).
const TICKS_PER_USEC: f64 = 1000.0 / 64.0;
/// The reference's queueing latency bound: the TBF's limit is the burst
/// plus what the rate sends in this long.
const LATENCY_USEC: f64 = 25_000.0;

/// One direction's TBF from its `<dir>Rate` (bits/s) and `<dir>Burst`
/// (bits), computed as the reference does: bytes are bits / 8, the bucket
/// (buffer) is the time the burst takes at the rate, in ticks, and the limit
/// is the burst plus 25 ms at the rate.
///
/// A buffer or limit beyond the kernel's 32-bit fields is held at
/// `u32::MAX`. That is what the runtimes' bursts for the Kubernetes bandwidth
/// annotations need: containerd sends `math.MaxUint32` bits, CRI-O
/// `MaxUint32 * 8 - 1`, "no burst limit" in their words, which at most rates
/// is longer than the bucket can say. The reference casts to uint32 and
/// wraps, which makes a large burst a tiny or arbitrary one; the largest
/// bucket is the meaning the runtimes intend. What the reference refuses is
/// refused: a rate without its burst or the reverse, a burst of 4 GB or more.
pub(super) fn direction(
    dir: &str,
    rate: Option<u64>,
    burst: Option<u64>,
) -> Result<Option<Tbf>, Error> {
    let (rate, burst) = (rate.unwrap_or(0), burst.unwrap_or(0));
    let bad = |why: String| Error::invalid_config(format!("{dir}Rate/{dir}Burst: {why}"));
    match (rate, burst) {
        (0, 0) => return Ok(None),
        (_, 0) => {
            return Err(bad(format!(
                "{dir}Rate {rate} is set, so {dir}Burst must be too"
            )))
        }
        (0, _) => {
            return Err(bad(format!(
                "{dir}Burst {burst} is set, so {dir}Rate must be too"
            )))
        }
        _ => {}
    }
    // Under 8 bit/s the rate is 0 bytes/s: the reference divides by zero and
    // the kernel would read a rate of 0 as no limit at all.
    if rate < 8 {
        return Err(bad(format!(
            "{dir}Rate {rate} must be at least 8 bits per second"
        )));
    }
    let (rate_bytes, burst_bytes) = (rate / 8, burst / 8);
    let Some(burst_bytes) = u32::try_from(burst_bytes).ok().filter(|b| *b < u32::MAX) else {
        return Err(bad(format!("{dir}Burst {burst} is more than 4 GB")));
    };
    let usec = (f64::from(burst_bytes) * 1e6 / rate_bytes as f64).trunc();
    let queued = (rate_bytes as f64 * LATENCY_USEC / 1e6).trunc();
    Ok(Some(Tbf {
        rate: rate_bytes,
        limit: saturating_u32(queued + f64::from(burst_bytes)),
        buffer: saturating_u32((usec * TICKS_PER_USEC).trunc()),
    }))
}

/// `x` (whole, not negative) as a u32, `u32::MAX` when it is more.
fn saturating_u32(x: f64) -> u32 {
    // `as` saturates at the bounds (and maps NaN to 0, which cannot occur
    // here: every divisor is at least 1).
    x as u32
}

#[cfg(test)]
#[path = "conf_tests.rs"]
mod tests;
