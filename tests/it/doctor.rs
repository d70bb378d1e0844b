//! `cnikit doctor` on a node that is right and on one that is not. Each run
//! happens in a network namespace of its own (`ip netns exec`), so the
//! nftables check sees only the tables the test made there, never those of
//! tests running alongside.

use crate::support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The node under test: bin dir, conf dir, daemon socket, lease store.
struct Node {
    bin: PathBuf,
    conf: PathBuf,
    socket: PathBuf,
    data: PathBuf,
    ns: Netns,
}

impl Node {
    fn new(env: &TestEnv, bin: &Path) -> Node {
        let data = env.dir("ipamd");
        Node {
            bin: bin.to_path_buf(),
            conf: env.dir("net.d"),
            socket: data.join("ipamd.sock"),
            data,
            ns: env.netns(),
        }
    }

    /// `cnikit doctor` for this node, plus `extra`: exit status and stdout.
    fn doctor(&self, extra: &[&str]) -> (i32, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns.name])
            .arg(cnikit_exe())
            .arg("doctor")
            .arg("--bin-dir")
            .arg(&self.bin)
            .arg("--conf-dir")
            .arg(&self.conf)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--data-dir")
            .arg(&self.data)
            .args(extra)
            .output()
            .expect("run cnikit doctor");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("doctor:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
        (out.status.code().expect("exit code"), stdout)
    }

    /// A node whose links all point at the binary (the test bin dir), with the
    /// network list `pods` and one lease on it.
    fn with_pods(env: &TestEnv) -> Node {
        let node = Node::new(env, &env.bin);
        node.conflist("10-pods.conflist", "pods", pods_plugins());
        node.lease(env, "pods");
        node
    }

    /// A network list in the conf dir.
    fn conflist(&self, file: &str, network: &str, plugins: Value) {
        let list = json!({"cniVersion": "1.0.0", "name": network, "plugins": plugins});
        std::fs::write(self.conf.join(file), list.to_string()).expect("write conflist");
    }

    /// One lease on `network` through the ipamd plugin (in-process unless a
    /// daemon listens on the node's socket).
    fn lease(&self, env: &TestEnv, network: &str) {
        let subnet = env.subnets().v4;
        let conf = json!({
            "cniVersion": "1.0.0", "name": network, "type": "ipamd",
            "ipam": {"type": "ipamd", "dataDir": self.data, "socket": self.socket,
                     "ranges": [[{"subnet": subnet}]]},
        });
        env.plugin("ipamd")
            .attach("ADD", &cid("doc"), &self.ns, "eth0")
            .conf(&conf)
            .run()
            .result();
    }
}

/// The report line of `check`, e.g. "ok    link bridge: …".
fn line<'a>(report: &'a str, check: &str) -> &'a str {
    report
        .lines()
        .find(|l| {
            l.get(6..)
                .is_some_and(|rest| rest.starts_with(&format!("{check}: ")))
        })
        .unwrap_or_else(|| panic!("no line for {check}:\n{report}"))
}

fn pods_plugins() -> Value {
    json!([
        {"type": "bridge", "bridge": "cni-doc", "ipMasq": true, "ipam": {"type": "ipamd"}},
        {"type": "portmap", "capabilities": {"portMappings": true}},
    ])
}

/// Proves: on a node with every link pointing at the binary, a network list
/// whose plugins are all there, a daemon that answers, cnikit's nftables
/// table present and leases of this boot only, every check is ok and the
/// exit status is 0, as text and as JSON.
#[test]
fn a_good_node_passes_every_check() {
    let env = TestEnv::new("doctor_good");
    let node = Node::with_pods(&env);
    let _daemon = Daemon::start(&node.socket, &node.data, &[], &[]);
    let (ok, _, err) = sh(
        "ip",
        &[
            "netns",
            "exec",
            &node.ns.name,
            "nft",
            "add",
            "table",
            "inet",
            "cnikit",
        ],
    );
    assert!(ok, "nft add table: {err}");

    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 0, "{report}");
    for l in report.lines().filter(|l| !l.contains(" checks: ")) {
        assert!(l.starts_with("ok "), "not ok: {l}\n{report}");
    }
    for name in PLUGINS {
        assert!(line(&report, &format!("link {name}")).contains("->"));
    }
    assert!(line(&report, "conf 10-pods.conflist").contains("bridge, ipamd, portmap"));
    assert!(line(&report, "daemon").contains("answers"));
    assert!(line(&report, "nftables").contains("exists"));
    assert!(line(&report, "leases pods").contains("all of this boot"));

    let (code, text) = node.doctor(&["--json"]);
    assert_eq!(code, 0);
    let doc: Value = serde_json::from_str(&text).expect("--json prints JSON");
    assert_eq!(
        (doc["fail"].as_u64(), doc["warn"].as_u64()),
        (Some(0), Some(0)),
        "{doc}"
    );
    assert!(doc["checks"]
        .as_array()
        .is_some_and(|c| c.len() > PLUGINS.len()));
}

/// Proves: a plugin link pointing at another program, a network list naming
/// a plugin the bin dir lacks, and a lease of an earlier boot (made by a
/// daemon under a fake boot ID) are each reported with a fix, the missing
/// socket reads as in-process mode, and the exit status is 1.
#[test]
fn a_broken_node_is_told_what_to_fix() {
    let env = TestEnv::new("doctor_broken");
    let bin = env.dir("bin");
    install_links(&bin);
    std::fs::remove_file(bin.join("bridge")).unwrap();
    std::os::unix::fs::symlink(Path::new(REF_DIR).join("bridge"), bin.join("bridge")).unwrap();
    let node = Node::new(&env, &bin);
    node.conflist("10-pods.conflist", "pods", pods_plugins());
    node.conflist(
        "20-overlay.conflist",
        "overlay",
        json!([{"type": "flannel", "delegate": {"isDefaultGateway": true}}]),
    );
    // A lease recorded under another boot ID, then no daemon any more.
    let boot = env.dir("boot").join("boot_id");
    std::fs::write(&boot, "11111111-2222-3333-4444-555555555555\n").unwrap();
    let daemon = Daemon::start(
        &node.socket,
        &node.data,
        &[],
        &[("CNIKIT_IPAMD_BOOT_ID_FILE", boot.as_path())],
    );
    node.lease(&env, "pods");
    daemon.stop();

    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1, "{report}");
    let bridge = line(&report, "link bridge");
    assert!(
        bridge.starts_with("fail") && bridge.contains("points at"),
        "{report}"
    );
    assert!(
        report.contains("--force"),
        "the fix replaces the link:\n{report}"
    );
    assert!(line(&report, "link portmap").starts_with("ok"));
    let overlay = line(&report, "conf 20-overlay.conflist");
    assert!(
        overlay.starts_with("fail") && overlay.contains("flannel"),
        "{report}"
    );
    // The bridge link exists (it is another program), so the list is fine.
    assert!(
        line(&report, "conf 10-pods.conflist").starts_with("ok"),
        "{report}"
    );
    assert!(
        line(&report, "daemon").contains("in-process mode"),
        "{report}"
    );
    let leases = line(&report, "leases pods");
    assert!(
        leases.starts_with("warn") && leases.contains("earlier boot"),
        "{report}"
    );
    // The pods' lease is an earlier boot's: no pods run, so no table is fine.
    assert!(line(&report, "nftables").starts_with("warn"), "{report}");
    let fixes = report
        .lines()
        .filter(|l| l.trim_start().starts_with("fix: "))
        .count();
    let not_ok = report
        .lines()
        .filter(|l| l.starts_with("fail") || l.starts_with("warn"))
        .count();
    assert_eq!(
        fixes, not_ok,
        "every warning and failure has its fix:\n{report}"
    );
}

/// Proves: a network using masquerade whose pods hold leases of this boot
/// while cnikit's table is missing (a flushed ruleset) is a failure.
#[test]
fn a_flushed_ruleset_under_running_pods_fails() {
    let env = TestEnv::new("doctor_flushed");
    let node = Node::with_pods(&env);
    let (code, report) = node.doctor(&[]);
    assert_eq!(code, 1, "{report}");
    let nft = line(&report, "nftables");
    assert!(nft.starts_with("fail") && nft.contains("pods"), "{report}");
}
