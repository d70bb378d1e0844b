//! Meta plugins: chained after an interface plugin, they change what it made
//! (port mappings, firewall, link settings, shaping, source-based routing) and pass its
//! result on.

pub mod bandwidth;
pub mod firewall;
pub mod portmap;
pub mod sbr;
pub mod tuning;
pub mod vrf;

mod portmap_marker;
#[cfg(test)]
mod portmap_tests;
