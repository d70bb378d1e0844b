//! Kernel state read back with `ip -j`, reachability by ping, and waiting
//! for what the kernel does asynchronously.

use super::process::Netns;
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Run a helper command (ip, ping), returning (success, stdout, stderr).
pub fn sh(program: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Run `ip ARGS` and panic (with its stderr) if it fails.
pub fn ip(args: &[&str]) -> String {
    let (ok, out, err) = sh("ip", args);
    assert!(ok, "ip {} failed: {err}", args.join(" "));
    out
}

/// `ip -j ARGS`, parsed; an empty answer is an empty list.
fn ip_json(args: &[&str]) -> Vec<Value> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let out = ip(&full);
    if out.trim().is_empty() {
        return Vec::new();
    }
    match serde_json::from_str::<Value>(&out) {
        Ok(Value::Array(a)) => a,
        Ok(other) => panic!("ip -j {} printed a non-list: {other}", args.join(" ")),
        Err(e) => panic!("ip -j {} printed invalid JSON ({e}): {out}", args.join(" ")),
    }
}

/// Prefix `args` with `-n NS` when `ns` is given.
fn in_ns<'a>(ns: Option<&'a str>, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = Vec::new();
    if let Some(ns) = ns {
        v.push("-n");
        v.push(ns);
    }
    v.extend_from_slice(args);
    v
}

/// All links of a namespace (None = the test host namespace), with details.
fn links(ns: Option<&str>) -> Vec<Value> {
    ip_json(&in_ns(ns, &["-d", "link", "show"]))
}

/// One link with details (`ip -j -d link show dev NAME`), None if absent.
pub fn link(ns: Option<&str>, name: &str) -> Option<Value> {
    links(ns).into_iter().find(|l| l["ifname"] == name)
}

/// Names of the links in a namespace.
pub fn link_names(ns: Option<&str>) -> BTreeSet<String> {
    links(ns)
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect()
}

/// Assert that `ns` holds nothing but its loopback (a failed ADD left nothing).
pub fn assert_only_lo(ns: &Netns, what: &str) {
    assert_eq!(
        link_names(Some(&ns.name)),
        BTreeSet::from(["lo".to_string()]),
        "{what}: links left in netns {}",
        ns.name
    );
}

/// `linkinfo.info_kind` of a link ("veth", "bridge", "macvlan", …).
pub fn link_kind(l: &Value) -> Option<&str> {
    l["linkinfo"]["info_kind"].as_str()
}

/// Whether a link's flags include `flag` ("UP", "PROMISC", …).
pub fn has_flag(l: &Value, flag: &str) -> bool {
    l["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == flag))
}

/// Names of the host links enslaved to `bridge`.
pub fn bridge_ports(bridge: &str) -> BTreeSet<String> {
    links(None)
        .iter()
        .filter(|l| l["master"] == bridge)
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect()
}

/// Addresses on `dev` as "addr/prefix", all scopes except link-local ones.
pub fn addrs(ns: Option<&str>, dev: &str) -> BTreeSet<String> {
    let list = ip_json(&in_ns(ns, &["addr", "show", "dev", dev]));
    let mut out = BTreeSet::new();
    for l in list {
        for a in l["addr_info"].as_array().cloned().unwrap_or_default() {
            if a["scope"] == "link" {
                continue;
            }
            out.insert(format!(
                "{}/{}",
                a["local"].as_str().unwrap_or("?"),
                a["prefixlen"].as_u64().unwrap_or(999)
            ));
        }
    }
    out
}

/// The routes of a family (`"-4"` or `"-6"`) in the main table, normalized to
/// "dst via gw dev dev" strings, without IPv6 link-local and multicast routes.
pub fn routes(ns: Option<&str>, family: &str) -> BTreeSet<String> {
    let list = ip_json(&in_ns(ns, &[family, "route", "show"]));
    list.iter()
        .filter(|r| {
            let dst = r["dst"].as_str().unwrap_or("");
            !dst.starts_with("fe80:") && !dst.starts_with("ff00:") && r["type"] != "multicast"
        })
        .map(route_string)
        .collect()
}

fn route_string(r: &Value) -> String {
    let mut s = r["dst"].as_str().unwrap_or("?").to_string();
    if let Some(gw) = r["gateway"].as_str() {
        s += &format!(" via {gw}");
    }
    if let Some(dev) = r["dev"].as_str() {
        s += &format!(" dev {dev}");
    }
    s
}

/// Ping `addr` from inside netns `ns` (one echo, 2 s wait), retried a few
/// times so a neighbour discovery in progress does not make the test flaky.
pub fn ping(ns: &str, addr: &str) -> bool {
    for _ in 0..4 {
        let (ok, _, _) = sh("ip", &["netns", "exec", ns, "ping", "-c1", "-W2", addr]);
        if ok {
            return true;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    false
}

pub fn assert_ping(ns: &str, addr: &str) {
    if !ping(ns, addr) {
        let state =
            ip(&["-n", ns, "addr"]) + &ip(&["-n", ns, "route"]) + &ip(&["-n", ns, "-6", "route"]);
        panic!("netns {ns} cannot ping {addr}; its state:\n{state}");
    }
}

/// Wait until IPv6 addresses in `ns` are no longer tentative (DAD), max ~3 s.
pub fn wait_ipv6_ready(ns: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let (_, out, _) = sh("ip", &in_ns(ns, &["-6", "addr", "show", "tentative"]));
        if out.trim().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait (up to 5 s) until `cond` holds; the kernel tears a netns down asynchronously.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
