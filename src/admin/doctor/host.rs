//! The checks of `cnikit doctor` on what runs on the host: the ipamd
//! daemon (over its socket) and cnikit's nftables table (over netlink).

use super::{canonical_plugins, Check};
use crate::runtime::ConfList;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// `GET /healthz` on the daemon's socket. No socket file at all is
/// in-process mode, which is a working setup. Also says whether the daemon
/// answered (the lease check words its fix by that).
pub fn daemon(socket: &Path) -> (Check, bool) {
    use ipamd::client::{Daemon, Outcome};
    let check = "daemon";
    let present = std::fs::symlink_metadata(socket).is_ok();
    let daemon = Daemon::new(socket).with_timeouts(Duration::from_secs(2), Duration::from_secs(10));
    match daemon.send("GET", "/healthz", &[], None) {
        Outcome::Answered { status: 200, .. } => (
            Check::ok(check, format!("ipamd answers on {}", socket.display())),
            true,
        ),
        Outcome::Answered { status, body } => (
            Check::fail(
                check,
                format!(
                    "ipamd on {} answered {status}: {}",
                    socket.display(),
                    String::from_utf8_lossy(&body).trim()
                ),
                "run doctor as root; otherwise see the daemon's log: journalctl -u ipamd.service",
            ),
            true,
        ),
        Outcome::Local(_) if !present => (
            Check::ok(
                check,
                format!(
                    "no daemon socket at {}: in-process mode (plugins use the lease files directly)",
                    socket.display()
                ),
            ),
            false,
        ),
        Outcome::Local(why) => (
            Check::warn(
                check,
                format!("{why}; plugins fall back to in-process mode"),
                "systemctl restart ipamd.socket (or remove the stale socket file)",
            ),
            false,
        ),
        Outcome::Failed(why) => (
            Check::fail(check, why, "run doctor as root; check the socket's owner and mode"),
            false,
        ),
    }
}

/// Networks whose lists need `table inet cnikit`: a `portmap` plugin, or
/// `ipMasq` on a plugin.
pub fn firewall_networks(lists: &[ConfList]) -> Vec<String> {
    lists
        .iter()
        .filter(|l| {
            canonical_plugins(l).any(|p| {
                p.get("type").and_then(Value::as_str) == Some("portmap")
                    || matches!(p.get("ipMasq"), Some(Value::Bool(true)))
                    || p.get("ipMasq").and_then(Value::as_str) == Some("true")
            })
        })
        .map(|l| l.name.clone())
        .collect()
}

/// `table inet cnikit` exists when a network needs it. It is made by the
/// first ADD that needs it, so a missing table is only a failure when such a
/// network has pods (leases of this boot); `tables` is the netlink read.
pub fn nftables(
    lists: &[ConfList],
    live: &BTreeMap<String, usize>,
    tables: impl FnOnce() -> crate::firewall::Result<crate::firewall::inspect::Tables>,
) -> Check {
    use crate::firewall::inspect::INET_TABLE;
    let check = "nftables";
    let users = firewall_networks(lists);
    if users.is_empty() {
        return Check::ok(
            check,
            "no network list uses ipMasq or portmap: no table needed",
        );
    }
    let tables = match tables() {
        Ok(t) => t,
        Err(e) => return Check::fail(
            check,
            format!("cannot read the nftables ruleset: {e}"),
            "run doctor as root (CAP_NET_ADMIN) on a kernel with nf_tables (modprobe nf_tables)",
        ),
    };
    let names = users.join(", ");
    if tables.inet {
        return Check::ok(
            check,
            format!("table {INET_TABLE} exists (used by {names})"),
        );
    }
    let with_pods: Vec<&str> = users
        .iter()
        .filter(|n| live.get(n.as_str()).is_some_and(|&c| c > 0))
        .map(String::as_str)
        .collect();
    if with_pods.is_empty() {
        return Check::warn(
            check,
            format!("table {INET_TABLE} does not exist yet; the first ADD on {names} makes it"),
            "nothing, unless pods already run there: then their port mappings and masquerade \
             were removed (`nft flush ruleset`, a firewall reload); run `cnikit firewall restore` \
             (the ipamd daemon does it by itself while it runs)",
        );
    }
    Check::fail(
        check,
        format!(
            "table {INET_TABLE} is missing while pods run on {}: their port mappings and masquerade are gone",
            with_pods.join(", ")
        ),
        "run `cnikit firewall restore` (the ipamd daemon does it by itself while it runs); \
         it was removed by `nft flush ruleset` or a firewall reload",
    )
}
