//! cnikit: CNI plugins (bridge, macvlan, ipvlan, portmap, loopback, ipamd) in
//! one multicall binary, and the runtime side (`cnikit net`) of the protocol.
//!
//! The layers, each only using the ones listed before it:
//! - [`cni`]: the protocol (environment, configuration, versions and result
//!   layouts, errors → codes, delegation, the plugin runner); no netlink.
//! - [`netlink`]: blocking rtnetlink and netfilter sockets, netns, sysctls.
//! - [`block_routes`]: the host's routes to other nodes' pool blocks (the ipamd
//!   daemon's `--route-blocks`).
//! - [`firewall`]: nftables over netlink (portmap, masquerade, MAC spoof check).
//! - [`dhcp`]: the DHCP client and its lease daemon service (the `dhcp` plugin's work).
//! - [`plugins`]: one module per plugin, each reading ADD/CHECK/DEL/STATUS/GC.
//! - [`runtime`]: running network lists the way libcni does (`cnikit net`,
//!   the churn benchmark).
//! - [`admin`]: the `cnikit` subcommands.

pub mod admin;
pub mod block_routes;
pub mod cni;
pub mod dhcp;
pub mod failure;
pub mod firewall;
mod hex;
pub mod netlink;
pub mod plugins;
pub mod runtime;
mod safe_dir;
