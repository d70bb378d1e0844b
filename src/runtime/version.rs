//! Spec versions as the runtime sees them: which ones a list may run at, and
//! the ordering that decides which verbs (CHECK, STATUS, GC) a list allows.
//! Kept here rather than borrowed from `crate::cni` so this module tree stays
//! free of the plugin side (the benchmark compiles it on its own).

/// Every released spec version, oldest first.
pub const KNOWN: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// A version as (major, minor, patch), ordered numerically.
pub type Ver = (u32, u32, u32);

pub const V010: Ver = (0, 1, 0);
/// CHECK, and `prevResult` on DEL, exist from here on.
pub const V040: Ver = (0, 4, 0);
/// STATUS and GC exist from here on.
pub const V110: Ver = (1, 1, 0);

pub fn is_known(s: &str) -> bool {
    KNOWN.contains(&s)
}

/// "1.0.0" → (1, 0, 0); anything else → None.
pub fn parse(s: &str) -> Option<Ver> {
    let mut parts = s.split('.').map(|p| p.parse::<u32>().ok());
    let v = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(v)
}
