//! The daemon's watch on the firewall: it listens to the kernel's nftables
//! events (what `nft monitor` shows) and, when a batch committed by another
//! process removed something of cnikit's, runs a repair (`repair.rs`) right
//! away. It also repairs once when it starts, for what went while no daemon
//! ran.
//!
//! What counts: a table, chain, rule, set or element deleted in `inet
//! cnikit` or `bridge cnikit` (a flush of the ruleset reports the deletion of
//! every table), and in iptables' `filter` tables the deletion of the table
//! or of a rule or chain in `FORWARD` or a `CNI-…` chain (the firewall
//! plugin's), and a `FORWARD` chain made (after a flush, iptables' tables come
//! back when the host's firewall loads them again, and the plugin's rules
//! belong there then). The kernel ends every batch's events with the
//! committing thread's id: the daemon's own batches (every plugin call it
//! serves, on any of its threads, and its repairs) are not looked at, so
//! nothing is added to the per-pod path and a repair never wakes itself up;
//! a repair with nothing to put back sends nothing.

use super::repair::{self, Repaired};
use super::socket::Nfnl;
use super::Sockets;
use crate::netlink::{Events, Reply};
use ipamd::log::Level;
use std::time::{Duration, Instant};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWGEN: u16 = 15;
/// The DESTROY messages (Linux 6.3+): a DEL that ignores a missing object.
const NFT_MSG_DESTROYTABLE: u16 = 26;
const NFT_MSG_DESTROYCHAIN: u16 = 27;
const NFT_MSG_DESTROYRULE: u16 = 28;
/// NFT_MSG_DESTROYTABLE … NFT_MSG_DESTROYSETELEM.
const NFT_MSG_DESTROY: std::ops::RangeInclusive<u16> = NFT_MSG_DESTROYTABLE..=30;
/// How long the watch pauses after its socket or a repair failed, before
/// reading or trying again.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_secs(1);
/// Tries of one repair: a batch refused while someone kept changing the
/// ruleset (an `nft -f` of a large file) may go through a moment later.
const ATTEMPTS: u32 = 3;

/// Starts the watch on its own thread, in the calling thread's network
/// namespace; it runs as long as the process.
pub fn start() -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("firewall-watch".into())
        .spawn(watch)
}

fn watch() {
    let mut events = match Nfnl::nftables_events() {
        Ok(s) => s,
        Err(f) => {
            let e = f.context("listen to nftables changes");
            ipamd::log_at!(Level::Error, "firewall: not repairing on its own: {e}");
            return;
        }
    };
    let sockets = Sockets::default();
    // Listening came first: a change during this repair is seen after it.
    repair_now(&sockets, "the daemon started");
    let mut touched = false;
    loop {
        let cause = match events.events() {
            Ok(Events::Got(replies)) => {
                let mut cause = None;
                for r in &replies {
                    match seen(r) {
                        Seen::Removal => touched = true,
                        Seen::Commit { pid, name } => {
                            if std::mem::take(&mut touched) && !pid.is_some_and(is_ours_committer) {
                                cause = Some(describe(pid, &name));
                            }
                        }
                        Seen::Other => {}
                    }
                }
                cause
            }
            Ok(Events::Quiet) => None,
            Ok(Events::Lost) => Some("nftables events were lost".to_string()),
            Err(f) => {
                let e = f.context("read nftables changes");
                ipamd::log_at!(Level::Warn, "firewall: {e}");
                std::thread::sleep(PAUSE_AFTER_FAILURE);
                None
            }
        };
        if let Some(cause) = cause {
            repair_now(&sockets, &cause);
        }
    }
}

/// Whether a batch's committer is this process. The kernel names the
/// committing thread (its task id), and the daemon commits from many
/// threads: any of ours counts. A thread gone since commits nothing more.
fn is_ours_committer(tid: u32) -> bool {
    tid == std::process::id() || std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}

fn describe(pid: Option<u32>, name: &str) -> String {
    match pid {
        Some(pid) => format!("a change by process {pid} ({name})"),
        None => "a change by another process".to_string(),
    }
}

fn repair_now(sockets: &Sockets, cause: &str) {
    for attempt in 1..=ATTEMPTS {
        let started = Instant::now();
        match repair::restore(sockets) {
            Ok(done) => return report(&done, cause, started.elapsed()),
            Err(e) if attempt < ATTEMPTS => {
                ipamd::log_at!(
                    Level::Warn,
                    "firewall: cannot put back what the pods had after {cause} (trying again): {e}"
                );
                std::thread::sleep(PAUSE_AFTER_FAILURE);
            }
            Err(e) => ipamd::log_at!(
                Level::Error,
                "firewall: cannot put back what the pods had after {cause}: {e}; \
                 `cnikit firewall restore` tries again"
            ),
        }
    }
}

fn report(done: &Repaired, cause: &str, took: Duration) {
    if done.changes == 0 {
        ipamd::log_at!(
            Level::Debug,
            "firewall: after {cause}, all {} attachments' state in place ({} ms)",
            done.attachments,
            took.as_millis()
        );
    } else {
        ipamd::log_at!(
            Level::Info,
            "firewall: after {cause}, put back what {} of {} attachments lacked ({} changes in one batch, {} ms)",
            done.restored.len(),
            done.attachments,
            done.changes,
            took.as_millis()
        );
    }
    for (who, why) in &done.skipped {
        ipamd::log_at!(Level::Warn, "firewall: not put back: {who}: {why}");
    }
    if !done.keys_only.is_empty() {
        ipamd::log_at!(
            Level::Warn,
            "firewall: {} attachments were recorded by an older cnikit, with keys only: re-create those pods to get back what they lost ({})",
            done.keys_only.len(),
            done.keys_only.join(", ")
        );
    }
}

/// What one event says.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Something of ours (or of the firewall plugin's) went, or iptables'
    /// FORWARD chain came (see `is_ours`).
    Removal,
    /// A batch ended: who committed it.
    Commit {
        pid: Option<u32>,
        name: String,
    },
    Other,
}

fn seen(r: &Reply) -> Seen {
    if r.kind >> 8 != NFNL_SUBSYS_NFTABLES {
        return Seen::Other;
    }
    let msg = r.kind & 0xff;
    let attrs = super::nft::attributes(&r.payload);
    let text = |kind: u16| {
        attrs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| super::nft::c_string(v))
    };
    if msg == NFT_MSG_NEWGEN {
        const NFTA_GEN_PROC_PID: u16 = 2;
        const NFTA_GEN_PROC_NAME: u16 = 3;
        let pid = attrs
            .iter()
            .find(|(k, _)| *k == NFTA_GEN_PROC_PID)
            .and_then(|(_, v)| v.get(..4)?.try_into().ok())
            .map(u32::from_be_bytes);
        let name = text(NFTA_GEN_PROC_NAME).unwrap_or_default();
        return Seen::Commit { pid, name };
    }
    let removal = matches!(
        msg,
        NFT_MSG_DELTABLE | NFT_MSG_DELCHAIN | NFT_MSG_DELRULE | NFT_MSG_DELSET | NFT_MSG_DELSETELEM
    ) || NFT_MSG_DESTROY.contains(&msg);
    if !removal && msg != NFT_MSG_NEWCHAIN {
        return Seen::Other;
    }
    // Every object's first attribute is its table's name; a chain's name is
    // attribute 3 of a chain, 2 of a rule.
    let family = r.payload.first().copied().unwrap_or(0);
    let table = text(1).unwrap_or_default();
    let chain = match msg {
        NFT_MSG_NEWCHAIN | NFT_MSG_DELCHAIN | NFT_MSG_DESTROYCHAIN => text(3),
        NFT_MSG_DELRULE | NFT_MSG_DESTROYRULE => text(2),
        _ => None,
    };
    if is_ours(family, &table, chain.as_deref(), msg) {
        Seen::Removal
    } else {
        Seen::Other
    }
}

/// NFPROTO_INET, NFPROTO_IPV4, NFPROTO_BRIDGE, NFPROTO_IPV6.
const INET: u8 = 1;
const IPV4: u8 = 2;
const BRIDGE: u8 = 7;
const IPV6: u8 = 10;

/// Whether event `msg` (a removal, or a new chain) concerns what cnikit
/// keeps: anything of ours removed; in iptables' filter tables the firewall
/// plugin's chains or the jump into them removed, or a FORWARD chain made
/// (iptables' tables back after a flush: the plugin's rules go there now,
/// as its ADD would have put them, not into our own table).
fn is_ours(family: u8, table: &str, chain: Option<&str>, msg: u16) -> bool {
    if msg == NFT_MSG_NEWCHAIN {
        return matches!(family, IPV4 | IPV6) && table == "filter" && chain == Some("FORWARD");
    }
    match family {
        INET | BRIDGE => table == "cnikit",
        IPV4 | IPV6 if table == "filter" => {
            let table_went = msg == NFT_MSG_DELTABLE || msg == NFT_MSG_DESTROYTABLE;
            table_went || chain.is_some_and(|c| c == "FORWARD" || c.starts_with("CNI-"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_tables_and_the_plugins_chains_count() {
        assert!(is_ours(INET, "cnikit", None, NFT_MSG_DELSETELEM));
        assert!(is_ours(BRIDGE, "cnikit", None, NFT_MSG_DELTABLE));
        assert!(!is_ours(INET, "filter", None, NFT_MSG_DELTABLE));
        assert!(!is_ours(IPV4, "nat", Some("FORWARD"), NFT_MSG_DELRULE));
        assert!(is_ours(IPV4, "filter", Some("FORWARD"), NFT_MSG_DELRULE));
        assert!(is_ours(
            IPV6,
            "filter",
            Some("CNI-FORWARD"),
            NFT_MSG_DELCHAIN
        ));
        assert!(is_ours(IPV4, "filter", None, NFT_MSG_DELTABLE));
        assert!(!is_ours(
            IPV4,
            "filter",
            Some("KUBE-SERVICES"),
            NFT_MSG_DELRULE
        ));
    }
}
