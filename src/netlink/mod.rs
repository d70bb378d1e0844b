//! Kernel access over netlink: one small, *blocking* socket type for every
//! protocol family ([`Socket`]`<`[`Rtnetlink`]`>`, alias [`Netlink`], for links,
//! addresses and routes; `Socket<`[`Netfilter`]`>` for nftables and
//! conntrack), network namespaces and sysctls. Messages come from the
//! rust-netlink message crates (`netlink-packet-route`, `-netfilter`).
//!
//! Why blocking and not `rtnetlink` (async): a plugin process lives for one CNI
//! call and sends a dozen messages; a tokio runtime and futures machinery per
//! exec costs more than the work itself. One socket per network namespace,
//! request → ack, nothing else.
//!
//! Layout:
//! - `frame.rs`: the netlink header, pure: encoding a message with flags and
//!   sequence number, splitting a datagram into answers (data, ACK, -errno
//!   with the kernel's extended-ack text).
//! - `socket.rs`: the socket, generic over the [`Family`]: sequence numbers,
//!   send, receive until the exchange's last answer; I/O only.
//! - `netfilter.rs`: the netfilter family and its nftables batches.
//! - `linkops.rs`, `linkattr.rs`, `bridge.rs`, `dummy.rs`, `addr.rs`, `route.rs`: the
//!   typed rtnetlink operations, as `impl Netlink` blocks; `link.rs` their value types.
//! - `error.rs`: [`Error`] with one errno table for all of the above.
//! - `linger.rs`: netfilter sockets closed after the plugin's exit by a detached
//!   child (their close can wait an RCU grace period).
//! - `netns.rs`: [`NetNs`] (open, run a closure inside, the current one's id).
//! - `sysctl.rs`: `net/ipv4/ip_forward` style keys of the current netns.
//! - `tc.rs`: qdiscs, u32 redirect filters and ifb links (bandwidth).
//! - `vlan.rs`: 802.1Q links and VRF devices, with their VLAN id and table (vlan, vrf).
//! - `proto_route.rs`: the main table's routes of one protocol number, an owner's own
//!   (the daemon's routes to other nodes' blocks).
//! - `rule.rs`, `route_table.rs`: policy rules and routes of any table, moved whole
//!   between tables (sbr).
//! - `move_link.rs`: an existing link moved into another netns, renamed and
//!   aliased on the way (host-device).
//! - `tap.rs`: persistent taps made through `/dev/net/tun` in a netns, and their tun
//!   details (tap).
//! - `link_setup.rs`: a fresh link's name, MTU, MAC, `arp_notify` (it announces its
//!   addresses going up) and no IPv6 link-local address from the kernel in one RTM_SETLINK.
//! - `ipv6.rs`: IPv6 on a pod's link without `/proc/sys`: the address generation mode
//!   (alone, with a bridge port's enslave, with a veth end's up), addresses without DAD.
//!
//! Replies are decoded attribute by attribute, so an attribute this crate
//! version cannot parse (a newer kernel) is skipped instead of failing the
//! whole read.

mod addr;
mod bridge;
#[cfg(test)]
mod child_tests;
mod dummy;
mod error;
mod fault;
mod frame;
mod ipv6;
pub mod linger;
mod link;
mod link_setup;
mod linkattr;
mod linkops;
mod move_link;
mod netfilter;
mod netns;
mod proto_route;
mod route;
mod route_table;
mod rule;
mod socket;
pub mod sysctl;
mod tap;
mod tc;
#[cfg(test)]
mod tests;
mod vlan;

pub(crate) use error::Failure;
pub use error::{Error, ErrorKind};
pub(crate) use frame::{nla, Reply};
pub use ipv6::link_local;
pub(crate) use link::random_bytes;
pub use link::{
    link_name, BridgePort, BridgeSpec, ChildLink, IpvlanMode, IpvlanSpec, Link, MacvlanMode,
    MacvlanSpec, VethPair, VethSpec,
};
pub use link_setup::LinkSetup;
pub(crate) use netfilter::Events;
pub use netfilter::Netfilter;
pub use netns::NetNs;
pub use proto_route::ProtoRoute;
pub use route::Route;
pub use route_table::{TableRoute, MAIN_TABLE};
pub use rule::Rule;
pub use socket::{Family, Netlink, Rtnetlink, Socket};
pub use tap::{selinux_context, tap_supported, TapSpec, TunInfo};
pub use tc::{Ifb, Qdisc, Tbf, INGRESS_HANDLE};
pub use vlan::VlanSpec;

pub type Result<T, E = Error> = std::result::Result<T, E>;
