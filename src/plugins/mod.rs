//! The plugins, grouped as the reference groups them: interface plugins make
//! the pod's interface, IPAM plugins give out its addresses, meta plugins
//! change what an interface plugin made. Each plugin is one module reading
//! ADD / CHECK / DEL / STATUS / GC; the steps several of them take are the
//! modules beside the groups, named for what they do. A new plugin is its
//! module and a line in [`Registry::by_name`] (and its name in [`NAMES`]).

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

use crate::cni::{Builtins, Plugin};
use crate::netlink::linger::DeferredClose;
use firewall_backend::FirewallBackend;
use interface::{bridge, dummy, ipvlan, loopback, macvlan, ptp};
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

/// The plugins of one plugin process. Those with firewall work hold its
/// firewall backend: the daemon when it serves, else this process, on
/// netfilter sockets closed only after the reply (`netlink::linger`).
pub struct Registry {
    bridge: bridge::Bridge,
    portmap: portmap::Portmap,
    firewall: firewall::FirewallPlugin,
    ptp: ptp::Ptp,
}

impl Registry {
    /// The plugins for a call whose runner hands `sockets_closed_after_reply`
    /// off once the reply is written.
    pub fn new(sockets_closed_after_reply: &DeferredClose) -> Registry {
        let firewall = || FirewallBackend::daemon_or_here(sockets_closed_after_reply.clone());
        Registry {
            bridge: bridge::Bridge {
                firewall: firewall(),
            },
            portmap: portmap::Portmap {
                firewall: firewall(),
            },
            firewall: firewall::FirewallPlugin {
                firewall: firewall(),
            },
            ptp: ptp::Ptp {
                firewall: firewall(),
            },
        }
    }
}

impl Builtins for Registry {
    fn by_name(&self, name: &str) -> Option<&dyn Plugin> {
        Some(match name {
            "bridge" => &self.bridge,
            "macvlan" => &macvlan::Macvlan,
            "ipvlan" => &ipvlan::Ipvlan,
            "portmap" => &self.portmap,
            "ipamd" => &ipam::Ipamd::PLUGIN,
            "loopback" => &loopback::Loopback,
            "bandwidth" => &bandwidth::Bandwidth,
            "host-local" => &host_local::HostLocal::PLUGIN,
            "tuning" => &tuning::Tuning,
            "firewall" => &self.firewall,
            "static" => &static_ipam::Static,
            "dummy" => &dummy::Dummy,
            "host-device" => &interface::host_device::HostDevice,
            "ptp" => &self.ptp,
            "sbr" => &meta::sbr::Sbr,
            "tap" => &interface::tap::Tap,
            "vlan" => &interface::vlan::Vlan,
            "vrf" => &meta::vrf::Vrf,
            "dhcp" => &ipam::dhcp::Dhcp,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary runs as a plugin exactly the names it installs links for.
    #[test]
    fn every_name_is_a_plugin_and_no_other() {
        let plugins = Registry::new(&DeferredClose::new());
        for name in NAMES {
            assert!(plugins.by_name(name).is_some(), "{name} is no plugin");
        }
        for other in ["cnikit", "ipam", "net", ""] {
            assert!(plugins.by_name(other).is_none(), "{other:?} is a plugin");
        }
    }
}
