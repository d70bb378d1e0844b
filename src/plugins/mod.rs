//! The plugins, grouped as the reference groups them: interface plugins make
//! the pod's interface, IPAM plugins give out its addresses, meta plugins
//! change what an interface plugin made. Each plugin is one module reading
//! ADD / CHECK / DEL / STATUS / GC; the steps several of them take are the
//! modules beside the groups, named for what they do. A new plugin is its
//! module and a line in [`by_name`] (and its name in [`NAMES`]).

pub mod interface;
pub mod ipam;
pub mod meta;

mod conf_keys;
mod firewall_backend;
mod ipam_delegation;
mod link_owner;
mod masquerade;
mod pod_interface;
mod pod_netns;

use crate::cni::Plugin;
use firewall_backend::FirewallBackend;
use interface::{bridge, dummy, ipvlan, loopback, macvlan};
use ipam::{host_local, static_ipam};
use meta::{bandwidth, firewall, portmap, tuning};
/// Names a symlink (argv[0]) or `cnikit <name>` may use.
pub const NAMES: &[&str] = &[
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
    "static",
    "dummy",
    "host-device",
    "ptp",
    "sbr",
    "tap",
    "vlan",
    "vrf",
    "dhcp",
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
        "static" => &static_ipam::Static,
        "dummy" => &dummy::Dummy,
        "host-device" => &interface::host_device::HostDevice,
        "ptp" => &interface::ptp::Ptp::PLUGIN,
        "sbr" => &meta::sbr::Sbr,
        "tap" => &interface::tap::Tap,
        "vlan" => &interface::vlan::Vlan,
        "vrf" => &meta::vrf::Vrf,
        "dhcp" => &ipam::dhcp::Dhcp,
        _ => return None,
    })
}
