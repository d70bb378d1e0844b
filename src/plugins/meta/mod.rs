//! Meta plugins: chained after an interface plugin, they change what it made
//! (port mappings, firewall, link settings, shaping) and pass its result on.

pub mod bandwidth;
pub mod firewall;
pub mod portmap;
pub mod tuning;

mod portmap_marker;
#[cfg(test)]
mod portmap_tests;
