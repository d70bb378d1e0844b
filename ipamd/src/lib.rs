//! `ipamd`: the journalled lease store behind cnikit's `ipamd` IPAM plugin, the daemon that
//! serves it over a unix socket, and the client the short-lived plugin process uses.
//!
//! Layout:
//! - [`config`]: the CNI `ipam` object (host-local compatible keys) and its validation.
//! - [`attachment`]: the key (network, container ID, ifname) of everything kept per
//!   attachment, and the rules for those three names.
//! - [`api`]: request/response types shared by the daemon and the client.
//! - [`client`]: one call per plugin invocation; talks to the daemon, or does the same work
//!   in-process against the store when no daemon is listening.
//! - [`daemon`]: `cnikit ipamd daemon`.
//! - [`service`]: typed services the daemon hosts besides the lease API, each with its own
//!   request, response, error and permission check (cnikit's firewall is one).
//! - [`cluster`]: cluster-wide pools in etcd: `pool` commands and the daemon's blocks.
//! - [`hostlocal`]: the reference host-local plugin's lease directory (its on-disk format).
//! - [`files`]: modes, no links, root-owned dirs: how every file of cnikit's daemons is made.
//! - [`fsck`]: `cnikit ipamd fsck`: find damage in the store's files and salvage what is valid.
//! - [`fuzzing`]: entry points of the fuzz targets in `fuzz/`; not an API.
//! - internal: `addr` (address arithmetic), `pool` (range arithmetic), `journal`
//!   (checksummed records), `snapshot` (checksummed state), `index` (the snapshot's index for
//!   one call's lookups), `store` (one network's state under a flock), `server` (HTTP over
//!   the unix socket), `fault` (injected I/O failures for tests).

mod addr;
pub mod api;
pub mod attachment;
pub mod client;
pub mod cluster;
pub mod config;
pub mod daemon;
mod error;
mod fault;
pub mod files;
pub mod fsck;
pub mod fuzzing;
pub mod hostlocal;
mod index;
mod journal;
pub mod log;
mod peer;
pub mod plugin_calls;
mod pool;
mod prometheus;
mod repair_hint;
mod server;
pub mod service;
mod snapshot;
mod store;
mod systemd;

pub use error::{Error, ErrorKind};
/// For cnikit's own injected failures, which count the same way (see `fault`).
#[cfg(feature = "fault-injection")]
pub use fault::nth_add_call;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;
