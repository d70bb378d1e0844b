//! The `dhcp` IPAM plugin and its lease daemon (`dhcp daemon`) end to end: pods made by
//! macvlan (or bridge) whose addresses come from a real DHCP server on a "LAN".
//!
//! The LAN is a network namespace holding one end of a veth pair at 10.99.0.1/24 with
//! the server on it (dnsmasq, or ISC dhcpd where a lease shorter than dnsmasq's two
//! minutes is needed); the other end, in the test host namespace, is the pods' macvlan
//! master (or a port of their bridge). Every test runs its own lease daemon (socket and
//! data dir in its temp dir) with short timers, and reads the server's lease file or log
//! to see what the server made of the daemon's messages.
//!
//! - [`lan`]: the LAN namespace and its servers (dnsmasq, ISC dhcpd);
//! - [`macvlan`]: the version matrix, no router, no server, no daemon;
//! - [`bridge`]: a bridge pod on the LAN;
//! - [`reference`]: the result next to the reference plugin's;
//! - [`lifecycle`]: renewal, a daemon killed and restarted, a NAK, a pod gone without DEL;
//! - [`scale`]: 32 pods at once;
//! - [`v6`]: DHCPv6 beside DHCPv4 and alone, against dnsmasq;
//! - [`v6_isc`]: DHCPv6 against ISC `dhcpd -6`: renewal, rebinding, restart, pod gone;
//! - [`verbs`]: STATUS, GC, and callers the daemon must refuse.

mod bridge;
mod lan;
mod lifecycle;
mod macvlan;
mod reference;
mod scale;
mod v6;
mod v6_isc;
mod verbs;

use crate::support::*;
use lan::Lan;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The network name of every test's config (part of the client identifier).
const NET: &str = "lan";
/// The server's address on the LAN.
const SERVER: &str = "10.99.0.1";
/// The name servers dnsmasq hands out (option 6).
const DNS: [&str; 2] = ["10.99.0.53", "10.99.0.54"];

/// The daemon's timers in the tests: quick, and still patient enough for a loaded host.
const TIMERS: [&str; 6] = ["-timeout", "2s", "-resendmax", "4s", "-resendtimeout", "8s"];

/// `dhcp daemon` as a child process (through the `dhcp` link, as a node runs it),
/// SIGKILLed on drop; it can be killed and started again on the same data dir.
struct DhcpDaemon {
    child: Option<Child>,
    exe: PathBuf,
    socket: PathBuf,
    data: PathBuf,
    log: PathBuf,
    flags: Vec<String>,
}

impl DhcpDaemon {
    /// A daemon with the test timers.
    fn start(env: &TestEnv) -> DhcpDaemon {
        DhcpDaemon::start_with(env, &TIMERS)
    }

    /// A daemon with `flags` besides `-socketpath` and `-datadir`.
    fn start_with(env: &TestEnv, flags: &[&str]) -> DhcpDaemon {
        let dir = env.dir("dhcp-daemon");
        let mut d = DhcpDaemon {
            child: None,
            exe: env.bin_dir().join("dhcp"),
            socket: dir.join("dhcp.sock"),
            data: dir.join("data"),
            log: dir.join("daemon.log"),
            flags: flags.iter().map(|s| s.to_string()).collect(),
        };
        d.spawn();
        d
    }

    /// Starts the process (appending to the log) and waits until it answers.
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the daemon log");
        let child = Command::new(&self.exe)
            .arg("daemon")
            .arg("-socketpath")
            .arg(&self.socket)
            .arg("-datadir")
            .arg(&self.data)
            .args(&self.flags)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup the daemon log"))
            .stderr(log)
            .spawn()
            .expect("start dhcp daemon");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while ipamd_get(&self.socket, "/healthz").is_none() {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("dhcp daemon exited ({st}); its log:\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "dhcp daemon not answering after 20 s; its log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, as a crash or an OOM kill would.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The lease records in the data dir.
    fn records(&self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(self.data.join(".dhcp-leases")) else {
            return Vec::new();
        };
        dir.flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "json6"))
            .collect()
    }

    fn assert_no_records(&self) {
        let left = self.records();
        assert!(
            left.is_empty(),
            "lease records left: {left:?}\n{}",
            self.log_text()
        );
    }
}

impl Drop for DhcpDaemon {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("dhcp daemon log:\n{}", self.log_text());
        }
    }
}

/// The `ipam` section for the daemon at `socket`.
fn dhcp_ipam(socket: &Path) -> Value {
    json!({"type": "dhcp", "daemonSocketPath": socket})
}

/// A macvlan network on `master` whose IPAM is `dhcp` through the daemon at `socket`.
fn macvlan_conf(version: &str, master: &str, socket: &Path) -> Value {
    json!({
        "cniVersion": version,
        "name": NET,
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": dhcp_ipam(socket),
    })
}

/// Waits up to `limit` until `cond` holds, else panics naming `what` and `context()`.
fn wait_until(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
    context: impl Fn() -> String,
) -> Duration {
    let started = Instant::now();
    while !cond() {
        assert!(
            started.elapsed() < limit,
            "{what}: not within {limit:?}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

/// The pod's IPv4 address of a result ("10.99.0.57/24") and its bare address.
fn result_v4(r: &Value) -> (String, String) {
    let cidr = r["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {r}"))
        .to_string();
    let bare = bare(&cidr).to_string();
    (cidr, bare)
}

/// Asserts the result's address is in the server's range as a /24, and is on the pod's
/// eth0; the bare address.
fn assert_leased(r: &Value, ns: &Netns) -> String {
    let (cidr, addr) = result_v4(r);
    assert!(cidr.ends_with("/24"), "{r}");
    let last: u8 = addr
        .strip_prefix("10.99.0.")
        .and_then(|h| h.parse().ok())
        .unwrap_or_else(|| panic!("{addr} is not in 10.99.0.0/24: {r}"));
    assert!((50..=99).contains(&last), "{addr} out of the range: {r}");
    assert!(
        addrs(Some(&ns.name), "eth0").contains(&cidr),
        "{cidr} is not on eth0 of {}",
        ns.name
    );
    addr
}

/// The default route via the server, and nothing else, as the reference makes it.
fn assert_default_route(r: &Value) {
    assert_eq!(r["ips"][0]["gateway"], SERVER, "{r}");
    let routes = r["routes"].as_array().cloned().unwrap_or_default();
    assert_eq!(routes.len(), 1, "{r}");
    assert_eq!(routes[0]["dst"], "0.0.0.0/0", "{r}");
    assert_eq!(routes[0]["gw"], SERVER, "{r}");
}

/// The pod's eth0 is up (or not).
fn link_up(ns: &Netns) -> bool {
    link(Some(&ns.name), "eth0").is_some_and(|l| has_flag(&l, "UP"))
}
