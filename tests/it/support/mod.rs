//! Shared harness of the integration tests.
//!
//! Every test runs the built `cnikit` binary exactly as a container runtime
//! does: a clean environment with the CNI_* variables, the network
//! configuration on stdin, the result (or error object) on stdout. Kernel state
//! is read back with `ip -j`, and connectivity is proven with real pings and
//! TCP/UDP exchanges between namespaces the test created.
//!
//! The suite must run inside the throwaway "host" namespace that `tests/run`
//! sets up (new network + mount namespace, tmpfs on /run/netns, /var/lib/cni
//! and /run/cnikit). [`TestEnv::new`] refuses to run anywhere else, so a plain
//! `cargo test` on a developer machine never touches the real network.
//!
//! Everything a test creates (netns, links, daemons, temp dirs with IPAM
//! state) is named uniquely — tests run in parallel threads of one process —
//! and removed in `Drop`, also when the test panics.
//!
//! - [`isolation`]: the proof that we run in the throwaway namespace, and the
//!   test host's uplink;
//! - [`process`]: the binary under test, checked command output, [`Netns`];
//! - [`names`]: unique names, container IDs, subnets and host ports;
//! - [`fixture`]: [`TestEnv`], one test's world, and [`Netns`], [`Ipam`];
//! - [`call`]: one plugin execution ([`Call`]) and what it produced ([`Outcome`]);
//! - [`attachment`]: the usual ADD/CHECK/DEL sequences of one attachment;
//! - [`differential`]: cnikit's plugin or the reference's, results compared by shape;
//! - [`json`]: reading results and building configs;
//! - [`matrix`]: the version matrices' shared steps (bridge, ptp);
//! - [`pod_link`]: the steps of plugins that give the pod one link of their own kind;
//! - [`kernel`]: kernel state (`ip -j`), pings, waiting;
//! - [`ipamd`]: the ipamd daemon as a child process, its HTTP API, metrics and leases;
//! - [`traffic`]: TCP/UDP servers and clients in namespaces, the nft ruleset;
//! - [`rng`]: a small random number generator for the fuzz and churn loops.

pub mod attachment;
pub mod call;
pub mod differential;
pub mod fixture;
pub mod ipamd;
pub mod isolation;
pub mod json;
pub mod kernel;
pub mod matrix;
pub mod names;
pub mod pod_link;
pub mod process;
pub mod rng;
pub mod traffic;

pub use attachment::*;
pub use call::*;
pub use differential::*;
pub use fixture::*;
pub use ipamd::*;
pub use isolation::*;
pub use json::*;
pub use kernel::*;
pub use matrix::*;
pub use names::*;
pub use pod_link::*;
pub use process::*;
pub use rng::*;
pub use traffic::*;

use std::collections::BTreeSet;

/// `setpriv` arguments that run the command after them as uid/gid 65534 with
/// no supplementary groups: the unprivileged caller of the permission tests.
pub const SETPRIV_NOBODY: [&str; 6] = [
    "--reuid",
    "65534",
    "--regid",
    "65534",
    "--clear-groups",
    "--",
];

/// The container IDs that have a portmap marker file: its content is the
/// attachment key (network, container ID, ifname, NUL-separated), so the
/// fault walks and the GC tests can tell whose marker is left.
pub fn portmap_marker_ids() -> BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir("/run/cnikit/portmap") else {
        return BTreeSet::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|c| {
            let id = c.split(|b| *b == 0).nth(1)?;
            Some(String::from_utf8_lossy(id).into_owned())
        })
        .collect()
}
