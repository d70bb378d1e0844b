//! Firewalling over nftables netlink (never by exec of `nft` or `iptables`):
//! port mappings (portmap), masquerade (bridge `ipMasq`), the MAC spoof
//! check (bridge `macspoofchk`) and the firewall plugin (`forward`).
//!
//! Layout. cnikit owns `table inet cnikit` and, only once `macspoofchk` is
//! used, `table bridge cnikit` (bridged frames are only seen by bridge-family
//! tables). Other tables are never read for writing, modified or flushed,
//! with one exception: the firewall plugin's chains and rules in the host's
//! iptables-nft `filter` tables (see `iptables.rs` for why and how), added
//! and removed one by one, never flushed.
//!
//! The firewall plugin's part of our table, used where iptables has no
//! FORWARD chain: sets `fw4-pods`/`fw6-pods` (pod addresses), `fw-iso`,
//! `fw-iso-pair`, `fw-iso-self` (isolated bridges) and chains `fw-forward`
//! (filter forward 0) and `fw-isolation` (see `schema::FORWARD`).
//!
//! ```text
//! table inet cnikit
//!   map pm4-any   proto . hostPort          : containerIP . port   (hostIP empty)
//!   map pm4-ip    hostIP . proto . hostPort : containerIP . port
//!   map pm6-any / pm6-ip                    (the same for IPv6)
//!   chain pm-prerouting  nat prerouting  -100: fib daddr type local goto pm-hostports
//!   chain pm-output      nat output      -100: fib daddr type local goto pm-hostports
//!   chain pm-hostports   4 rules: dnat via the four maps (specific hostIP first)
//!   set pm4-masq-all containerIP           (masqAll)                    (+ v6)
//!   set pm4-hairpin-<subnet id> containerIP  (hairpin and localhost)   (+ v6)
//!   chain pm-masquerade  nat postrouting  100: per set above one rule
//!                        ct status dnat ip daddr @pm4-… goto pm-masq-all | pm-hairpin-<id>
//!   chain pm-masq-all: masquerade
//!   chain pm-hairpin-<id>: saddr <subnet> masquerade, saddr 127.0.0.0/8 masquerade
//!   set masq4-<subnets id> containerIP     (one per network's subnets)  (+ v6)
//!   chain masq-pods nat postrouting 100: per set one rule
//!                   ip saddr @masq4-<id> goto masq-<id>
//!   chain masq-<id>: daddr <subnet> return (each), multicast return, masquerade
//! table bridge cnikit
//!   set macspoof-ports hostVeth; set macspoof-allow hostVeth . containerMAC
//!   chain macspoof filter prerouting -300: allowed return; guarded port: drop
//! ```
//!
//! Every per-pod element sits in a hash set or map under an exact key (an
//! address, a port, an interface): adding or removing one costs the same on
//! a node with a thousand pods as on an empty one, and so does every packet's
//! lookup (the reference plugin adds chains and rules per container). The
//! subnet tests live in one small chain per network (`masq-…`,
//! `pm-hairpin-…`), reached from the network's set of pod addresses
//! (`dispatch.rs` says why a set per network and not one verdict map); the
//! sets, chains and rules go with the network's last pod. `legacy.rs` moves
//! 0.1's layout (interval sets)
//! into this one. Each element carries its attachment's tag (see `tag.rs`),
//! and each attachment's keys are recorded (`index.rs`): DEL and GC delete
//! by exact key, so they need neither the netns nor prevResult.
//! Every call is one netlink batch: it applies whole or not at all.
//!
//! Each feature module (`portmap`, `masq`, `macspoof`, `conntrack`) holds its
//! sets, chains and logic and names its operations in its own `Op`; a
//! `Request` is one of them. A plugin hands requests to the `Firewall`
//! backend its call chose (`backend.rs`): in-process, or the ipamd daemon,
//! which hosts the firewall as a typed service (`service.rs`).

mod cleanup;
mod dispatch;
mod error;
mod expr;
mod index;
mod iptables;
mod legacy;
mod matches;
mod nft;
pub mod repair;
mod rules;
mod schema;
mod sets;
mod socket;
mod store;
mod tag;
#[cfg(test)]
mod test_netns;
mod turn;
mod unmapped;
pub mod watch;
mod xt;

pub mod backend;
pub mod conntrack;
pub mod forward;
pub mod inspect;
pub mod macspoof;
pub mod masq;
pub mod portmap;
mod request;
pub mod service;
#[cfg(test)]
mod service_tests;

pub use backend::{Firewall, InProcess, Recording, ViaDaemon};
pub use cleanup::{Del, Gc};
pub use error::{Error, ErrorKind};
pub use iptables::{Isolation, DEFAULT_ADMIN_CHAIN};
pub use request::Request;
pub use socket::Sockets;
pub use tag::Attachment;

pub type Result<T, E = Error> = std::result::Result<T, E>;
