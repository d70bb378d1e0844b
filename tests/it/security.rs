//! Attacks on the daemon from peers that may connect but must not get the
//! host's firewall or leases changed for them: root with every capability
//! dropped (`setpriv`), and root in another network namespace (`unshare`).
//! What the client writes about itself does not matter: the body claims the
//! daemon's own namespace.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn masq_add(addr: &str) -> String {
    format!(
        r#"{{"netns":{},"request":{{"op":"masq-add","att":{{"network":"sec","container_id":"c-{addr}","ifname":"eth0"}},"addrs":["{addr}"],"subnets":["10.99.0.0/24"]}}}}"#,
        own_netns_ino()
    )
}

fn own_netns_ino() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").unwrap().ino()
}

/// The HTTP status `prefix… curl` got for POST `target` with `body`.
fn post_as(prefix: &[&str], sock: &Path, target: &str, body: &str) -> String {
    let mut cmd = Command::new(prefix[0]);
    cmd.args(&prefix[1..])
        .args(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg("--unix-socket")
        .arg(sock)
        .args([
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ])
        .arg(format!("http://ipamd{target}"));
    let out = cmd.output().expect("run curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const CAPLESS_ROOT: &[&str] = &["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"];
const OTHER_NETNS: &[&str] = &["unshare", "--net", "--"];
const AS_IS: &[&str] = &["env", "--"];

fn ruleset() -> String {
    let out = Command::new("nft")
        .args(["list", "ruleset"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A daemon of its own for the test behind `env`, and its socket.
fn start_daemon(env: &TestEnv) -> (Daemon, PathBuf) {
    let dir = env.dir("daemon");
    let sock = dir.join("ipamd.sock");
    (Daemon::start(&sock, &dir.join("data"), &[], &[]), sock)
}

/// POST a masquerade ADD for `addr` as `prefix`: answered with `status`, and in
/// the ruleset afterwards only if `applied`.
fn masq_add_as(prefix: &[&str], sock: &Path, addr: &str, status: &str, applied: bool) {
    let got = post_as(prefix, sock, "/v1/ext/firewall.masq-add", &masq_add(addr));
    assert_eq!(got, status);
    let rules = ruleset();
    assert_eq!(rules.contains(addr), applied, "{rules}");
}

#[test]
fn capability_less_root_is_refused_and_nothing_is_applied() {
    let env = TestEnv::new("security_capless");
    let (_d, sock) = start_daemon(&env);

    masq_add_as(CAPLESS_ROOT, &sock, "10.99.0.5", "403", false);
    let alloc = r#"{"key":{"network":"sec","containerId":"c1","ifname":"eth0"},"rangeSets":[[{"subnet":"10.99.0.0/24"}]]}"#;
    assert_eq!(post_as(CAPLESS_ROOT, &sock, "/v1/allocate", alloc), "403");
    assert_eq!(
        post_as(
            CAPLESS_ROOT,
            &sock,
            "/v1/gc",
            r#"{"network":"sec","valid":[]}"#
        ),
        "403"
    );

    // Control: the same request from root with its capabilities is served.
    masq_add_as(AS_IS, &sock, "10.99.0.7", "200", true);
    let del = format!(
        r#"{{"netns":{},"request":{{"op":"masq-del","att":{{"network":"sec","container_id":"c-10.99.0.7","ifname":"eth0"}}}}}}"#,
        own_netns_ino()
    );
    assert_eq!(
        post_as(AS_IS, &sock, "/v1/ext/firewall.masq-del", &del),
        "200"
    );
    assert!(
        !ruleset().contains("10.99.0.7"),
        "the control's entry is removed"
    );
}

#[test]
fn root_in_another_netns_gets_nothing_applied_in_the_daemons() {
    let env = TestEnv::new("security_netns");
    let (_d, sock) = start_daemon(&env);

    // Declined, so a plugin there would do it itself, in its own namespace.
    masq_add_as(OTHER_NETNS, &sock, "10.99.0.6", "421", false);
}
