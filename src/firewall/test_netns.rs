//! Kernel tests' sandbox: a named netns of their own.

use crate::netlink::NetNs;
use std::process::Command;

/// Runs `f` inside a new named netns (needs root: only under the
/// isolated test runner, CNIKIT_ISOLATED=1).
pub(crate) fn in_new_netns(tag: &str, f: impl FnOnce()) {
    if std::env::var("CNIKIT_ISOLATED").as_deref() != Ok("1") {
        eprintln!("skipping {tag}: needs an isolated root namespace (CNIKIT_ISOLATED=1)");
        return;
    }
    let name = format!("cnikit-{}-{tag}", std::process::id());
    let ip = |args: &[&str]| Command::new("ip").args(args).status().expect("run ip");
    assert!(ip(&["netns", "add", &name]).success());
    let ns = NetNs::open(format!("/run/netns/{name}")).expect("open netns");
    // The firewall's records are kept by netns inode, and a deleted
    // namespace's inode comes back: another test's records must not be seen.
    let records = format!("/run/cnikit/firewall/netns-{}", ns.id().expect("netns id"));
    let _ = std::fs::remove_dir_all(&records);
    let out = ns.run(f);
    let _ = std::fs::remove_dir_all(&records);
    ip(&["netns", "del", &name]);
    out.expect("enter netns");
}
