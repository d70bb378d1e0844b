//! Waiting for the machine to go quiet between a setup's rounds. Deleting a
//! pod's netns returns before the kernel has torn it down: `cleanup_net`
//! runs later in the kernel's own workers, and after 1,000 residents'
//! DEL that is seconds of CPU. Measured at once, the next rounds would carry
//! it, and so would the baseline rounds that follow a delete.

use std::time::{Duration, Instant};

/// Below this share of busy CPU time over one window the machine is quiet.
const QUIET: f64 = 0.10;
const WINDOW: Duration = Duration::from_millis(250);
/// Bounded: on a machine that is never quiet the rounds run anyway.
const LONGEST: Duration = Duration::from_secs(20);

/// Waits until one window's busy CPU share is below [`QUIET`] (at most
/// [`LONGEST`]); returns how long it waited.
pub fn until_quiet() -> Duration {
    let start = Instant::now();
    let mut last = cpu_times();
    while start.elapsed() < LONGEST {
        std::thread::sleep(WINDOW);
        let now = cpu_times();
        let (Some((busy0, all0)), Some((busy1, all1))) = (last, now) else {
            break; // no /proc/stat to read: nothing to wait for
        };
        let all = all1.saturating_sub(all0);
        if all > 0 && (busy1.saturating_sub(busy0) as f64) < QUIET * all as f64 {
            break;
        }
        last = now;
    }
    start.elapsed()
}

/// (busy, all) CPU time since boot, in ticks, from /proc/stat's first line;
/// idle and iowait are not busy.
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let all: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((all - idle, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_reads_busy_below_all() {
        let (busy, all) = cpu_times().expect("/proc/stat");
        assert!(busy <= all && all > 0);
    }
}
