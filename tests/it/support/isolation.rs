//! Where the tests may run: only inside the throwaway namespace `tests/run`
//! makes, which then gets what a node has (an uplink with a default route).

use super::kernel::{ip, link};

/// Panic unless we are inside the namespace `tests/run` creates.
///
/// Proof of isolation: CNIKIT_ISOLATED=1 and our network namespace differs
/// from PID 1's. Where PID 1's namespace cannot be read (a container without
/// CAP_SYS_PTRACE), an ancestor process in another network namespace (the
/// shell that ran `tests/run`, outside the `unshare`) is the proof instead.
pub fn require_isolation() {
    let flag = std::env::var("CNIKIT_ISOLATED").unwrap_or_default();
    let own = std::fs::read_link("/proc/self/ns/net").ok();
    let init = std::fs::read_link("/proc/1/ns/net").ok();
    let isolated_ns = match (&own, &init) {
        (Some(a), Some(b)) => a != b,
        (Some(a), None) => ancestors()
            .iter()
            .filter_map(|pid| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok())
            .any(|ns| &ns != a),
        _ => false,
    };
    if flag != "1" || !isolated_ns {
        panic!(
            "the integration tests create network namespaces, bridges and veths and must run \
             inside a throwaway network namespace: run them with `sudo tests/run` \
             (optionally `tests/run --test it bridge::`), not with a bare `cargo test` \
             (CNIKIT_ISOLATED={flag:?}, own netns {own:?}, pid 1 netns {init:?})"
        );
    }
}

/// Our ancestor PIDs, parent first (stops at PID 1 or an unreadable entry).
fn ancestors() -> Vec<u32> {
    let mut out = Vec::new();
    let mut pid = std::process::id();
    while pid > 1 && out.len() < 64 {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            break;
        };
        let Some(ppid) = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
        else {
            break;
        };
        if ppid == 0 {
            break;
        }
        out.push(ppid);
        pid = ppid;
    }
    out
}

/// The test host's own interface and addresses (as `host_uplink` sets them).
pub const HOST_IF: &str = "eth0";
pub const HOST_V4: &str = "192.0.2.10";

/// Give the test host namespace what a node has: an `eth0` (a veth to
/// `uplink0`, both up for carrier; this kernel has no dummy links) with an
/// address per family and the default routes. Pods get `CNI_IFNAME=eth0` too,
/// so a plugin whose pod link ever passes through the host's names meets the
/// host's `eth0` here, and "no master" resolves to it as on a node. Every step
/// is idempotent: the first test of the process runs it.
pub fn host_uplink() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let uplink = link(None, HOST_IF).is_some();
        let create = (!uplink).then_some("link add eth0 type veth peer name uplink0");
        for cmd in create.into_iter().chain([
            "link set uplink0 up",
            "link set eth0 up",
            "addr replace 192.0.2.10/24 dev eth0",
            "-6 addr replace 2001:db8::10/64 dev eth0 nodad",
            "route replace default via 192.0.2.1 dev eth0",
            "-6 route replace default via 2001:db8::1 dev eth0",
        ]) {
            ip(&cmd.split(' ').collect::<Vec<_>>());
        }
    });
}
