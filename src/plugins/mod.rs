//! The plugins. Each file reads top to bottom as ADD / CHECK / DEL / STATUS / GC.

pub mod bandwidth;
pub mod bridge;
pub mod firewall;
pub mod host_local;
pub mod ipam;
pub mod ipvlan;
pub mod loopback;
pub mod macvlan;
pub mod portmap;
pub mod tuning;

mod child;
#[cfg(test)]
mod child_tests;
mod common;
mod container;
mod firewall_backend;
mod link_owner;
mod portmap_marker;
#[cfg(test)]
mod portmap_tests;
mod safe_dir;

use crate::cni::Plugin;
use firewall_backend::FirewallBackend;

/// Names a symlink (argv[0]) or `cnikit <name>` may use.
pub const NAMES: [&str; 10] = [
    "bridge",
    "macvlan",
    "ipvlan",
    "portmap",
    "ipamd",
    "loopback",
    "host-local",
    "tuning",
    "bandwidth",
    "firewall",
];

static BRIDGE: bridge::Bridge = bridge::Bridge {
    firewall: FirewallBackend::DAEMON_OR_HERE,
};
static PORTMAP: portmap::Portmap = portmap::Portmap {
    firewall: FirewallBackend::DAEMON_OR_HERE,
};
static FIREWALL: firewall::FirewallPlugin = firewall::FirewallPlugin {
    firewall: FirewallBackend::DAEMON_OR_HERE,
};

pub fn by_name(name: &str) -> Option<&'static dyn Plugin> {
    Some(match name {
        "bridge" => &BRIDGE,
        "macvlan" => &macvlan::Macvlan,
        "ipvlan" => &ipvlan::Ipvlan,
        "portmap" => &PORTMAP,
        "ipamd" => &ipam::Ipamd::PLUGIN,
        "loopback" => &loopback::Loopback,
        "bandwidth" => &bandwidth::Bandwidth,
        "host-local" => &host_local::HostLocal::PLUGIN,
        "tuning" => &tuning::Tuning,
        "firewall" => &FIREWALL,
        _ => return None,
    })
}
