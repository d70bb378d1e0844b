//! Kernel access: a small, *blocking* rtnetlink layer built on the rust-netlink
//! message crates (`netlink-packet-route`, `netlink-sys`).
//!
//! Why blocking and not `rtnetlink` (async): a plugin process lives for one CNI
//! call and sends a dozen messages; a tokio runtime and futures machinery per
//! exec costs more than the work itself. One socket per network namespace,
//! request → ack, nothing else.
//!
//! API CONTRACT (implemented in the submodules; plugins only use what is here):
//!
//! ```text
//! NetNs::open(path) -> Result<NetNs>            // ErrorKind::NetnsNotFound when the path is gone
//! NetNs::current() -> Result<NetNs>
//! NetNs::run(&self, f)                          // run f with this thread inside the netns, then return
//! Netlink::open() / Netlink::open_in(&NetNs)    // socket bound to the current / given netns
//! Netlink::link_by_name / link_by_index -> Result<Option<Link>>
//! Netlink::links() -> Result<Vec<Link>>
//! Netlink::ensure_bridge(BridgeSpec) -> Result<Link>   // creates or returns the existing one; race-safe (EEXIST => re-read)
//! Netlink::create_veth(VethSpec) -> Result<VethPair>   // peer created directly inside spec.peer_netns
//! Netlink::create_macvlan(MacvlanSpec) / create_ipvlan(IpvlanSpec) -> Result<Link> (created into the target netns under a temporary name, renamed there)
//! Netlink::set_up / set_master / set_mtu / set_promisc / set_mac / rename / delete_link
//! Netlink::set_bridge_port(index, BridgePort)          // hairpin, isolated (AF_BRIDGE protinfo)
//! Netlink::bridge_vlan_add(index, vid, pvid, untagged, on_bridge_self)
//! Netlink::bridge_vlan_filtering(index) -> Result<bool>
//! Netlink::addresses(index) -> Result<Vec<IpNet>>; add_address(index, IpNet) (EEXIST is Ok); del_address
//! Netlink::routes() -> Result<Vec<Route>> (main table, both families); add_route(&Route) (EEXIST is Ok); del_route
//! Netlink::default_route_link() -> Result<Option<Link>>
//! sysctl::set(key, value) / sysctl::get(key)    // "net/ipv4/ip_forward" style, in the *current* netns
//! ```
//!
//! Additions beyond the contract: `NetNs::path/as_raw_fd/is_same`,
//! `Netlink::set_down/set_nomaster/bridge_vlan_del`, `Link::is_kind`,
//! `Route::new/is_default` and `Display for Route`.
//!
//! Layout: `socket.rs` does framing, sequence numbers and errno mapping;
//! `linkops.rs`, `bridge.rs`, `addr.rs` and `route.rs` add the typed
//! operations as further `impl Netlink` blocks. Replies are decoded attribute
//! by attribute, so an attribute this crate version cannot parse (a newer
//! kernel) is skipped instead of failing the whole read.

// The contract is the crate's whole kernel API; not every build path calls
// every operation (e.g. `links()` or `set_nomaster`), which must not fail
// `clippy -D warnings` for the binary.

mod addr;
mod bridge;
mod error;
mod link;
mod linkops;
mod netns;
mod route;
mod socket;
pub mod sysctl;
#[cfg(test)]
mod tests;

pub use error::{Error, ErrorKind};
pub use link::{
    BridgePort, BridgeSpec, IpvlanMode, IpvlanSpec, Link, MacvlanMode, MacvlanSpec, VethPair,
    VethSpec,
};
pub use netns::NetNs;
pub use route::Route;
pub use socket::Netlink;

pub type Result<T, E = Error> = std::result::Result<T, E>;
