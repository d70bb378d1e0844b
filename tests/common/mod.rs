//! Shared harness of the integration tests.
//!
//! Every test runs the built `cnikit` binary exactly as a container runtime
//! does: a clean environment with the CNI_* variables, the network
//! configuration on stdin, the result (or error object) on stdout. Kernel state
//! is read back with `ip -j`, and connectivity is proven with real pings
//! between namespaces the test created.
//!
//! The suite must run inside the throwaway "host" namespace that `tests/run`
//! sets up (new network + mount namespace, tmpfs on /run/netns, /var/lib/cni
//! and /run/cnikit). [`TestEnv::new`] refuses to run anywhere else, so a plain
//! `cargo test` on a developer machine never touches the real network.
//!
//! Everything a test creates (netns, links, temp dirs with IPAM state) is
//! named uniquely — tests run in parallel threads of one process — and removed
//! in `Drop`, also when the test panics.

#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where Debian's containernetworking-plugins put the reference plugins.
pub const REF_DIR: &str = "/usr/lib/cni";

/// Every spec version, in order; VERSION must answer with exactly these.
pub const ALL_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The names `cnikit install` links.
pub const PLUGINS: [&str; 6] = [
    "bridge", "macvlan", "ipvlan", "portmap", "ipamd", "loopback",
];

/// How long one plugin call may take before the harness kills it.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

pub fn cnikit_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cnikit"))
}

// ------------------------------------------------------------------ isolation

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
             (optionally `tests/run --test bridge`), not with a bare `cargo test` \
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

// ------------------------------------------------------------------ unique names

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A number unique within this test process.
pub fn next_id() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// 6 hex digits derived from the pid and a counter: unique within a run and
/// unlikely to meet leftovers of an earlier (killed) run.
pub fn short_hash() -> String {
    let n = next_id() as u64;
    let pid = std::process::id() as u64;
    // splitmix64 of (pid, n)
    let mut z = (pid << 32 | n).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    format!("{:06x}", z & 0xff_ffff)
}

/// A unique interface name `prefix` + 6 hex digits (prefix ≤ 9 bytes, so < 16).
pub fn ifname_with(prefix: &str) -> String {
    assert!(prefix.len() <= 9, "interface prefix {prefix:?} too long");
    format!("{prefix}{}", short_hash())
}

/// A unique IPv4 /24 and IPv6 /64 per call: 10.P.N.0/24 and fdcb:P:N::/64
/// where P derives from the pid and N counts up.
#[derive(Debug, Clone)]
pub struct Subnets {
    pub v4: String,
    pub v6: String,
    p: u32,
    n: u32,
}

static SUBNET_COUNTER: AtomicU32 = AtomicU32::new(0);

impl Subnets {
    fn next() -> Subnets {
        let n = SUBNET_COUNTER.fetch_add(1, Ordering::Relaxed);
        assert!(n < 250 * 16, "too many subnets in one test process");
        let p = 100 + (std::process::id() % 16) * 8 + n / 250;
        let n = n % 250;
        Subnets {
            v4: format!("10.{p}.{n}.0/24"),
            v6: format!("fdcb:{p}:{n}::/64"),
            p,
            n,
        }
    }

    /// The IPv4 address with host part `host` in the /24.
    pub fn v4_addr(&self, host: u8) -> String {
        format!("10.{}.{}.{host}", self.p, self.n)
    }

    /// The IPv6 address `fdcb:p:n::host`, in canonical form (as plugins print it).
    pub fn v6_addr(&self, host: u16) -> String {
        let text = format!("fdcb:{}:{}::{host:x}", self.p, self.n);
        text.parse::<std::net::Ipv6Addr>()
            .map(|a| a.to_string())
            .unwrap_or(text)
    }

    /// A /30 inside the /24 (hosts .{4k+1} and .{4k+2}).
    pub fn v4_slash30(&self, k: u8) -> String {
        format!("10.{}.{}.{}/30", self.p, self.n, k * 4)
    }

    /// `[[{subnet v4}],[{subnet v6}]]` — one address of each family.
    pub fn dual_ranges(&self) -> Value {
        json!([[{"subnet": self.v4}], [{"subnet": self.v6}]])
    }

    pub fn v4_ranges(&self) -> Value {
        json!([[{"subnet": self.v4}]])
    }
}

// ------------------------------------------------------------------ processes

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
pub fn ip_json(args: &[&str]) -> Vec<Value> {
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

// ------------------------------------------------------------------ kernel state

/// All links of a namespace (None = the test host namespace), with details.
pub fn links(ns: Option<&str>) -> Vec<Value> {
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

/// `linkinfo.info_kind` of a link ("veth", "bridge", "macvlan", …).
pub fn link_kind(l: &Value) -> Option<&str> {
    l["linkinfo"]["info_kind"].as_str()
}

/// Names of the host links enslaved to `bridge`.
pub fn bridge_ports(bridge: &str) -> BTreeSet<String> {
    links(None)
        .iter()
        .filter(|l| l["master"] == bridge)
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect()
}

/// Host veths (in the test host namespace).
pub fn host_veths() -> BTreeSet<String> {
    links(None)
        .iter()
        .filter(|l| link_kind(l) == Some("veth"))
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

pub fn route_string(r: &Value) -> String {
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

// ------------------------------------------------------------------ netns

/// A named network namespace (`ip netns add`); `path` is what CNI_NETNS gets.
#[derive(Debug, Clone)]
pub struct Netns {
    pub name: String,
    pub path: String,
}

// ------------------------------------------------------------------ IPAM

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipam {
    /// The reference /usr/lib/cni/host-local.
    HostLocal,
    /// Our ipamd (no daemon socket → in-process store).
    Ipamd,
    /// Our ipamd with `cnikit ipamd daemon` serving the store (started by
    /// `TestEnv::ipam`, stopped on drop).
    IpamdDaemon,
}

impl Ipam {
    pub const BOTH: [Ipam; 2] = [Ipam::HostLocal, Ipam::Ipamd];

    pub fn type_name(self) -> &'static str {
        match self {
            Ipam::HostLocal => "host-local",
            Ipam::Ipamd | Ipam::IpamdDaemon => "ipamd",
        }
    }
}

// ------------------------------------------------------------------ the test host's uplink

/// The test host's own interface and addresses (as `host_uplink` sets them).
pub const HOST_IF: &str = "eth0";
pub const HOST_V4: &str = "192.0.2.10";
pub const HOST_V6: &str = "2001:db8::10";

/// Give the test host namespace what a node has: an `eth0` (a veth to
/// `uplink0`, both up for carrier; this kernel has no dummy links) with an
/// address per family and the default routes. Pods get `CNI_IFNAME=eth0` too,
/// so a plugin whose pod link ever passes through the host's names meets the
/// host's `eth0` here, and "no master" resolves to it as on a node. Every step
/// is idempotent: the first test of each test binary runs it.
fn host_uplink() {
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

// ------------------------------------------------------------------ the fixture

/// Lock a resource list, surviving a poisoned lock (a panicking test thread).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One test's world: a CNI bin dir with our links, a temp dir for IPAM state,
/// and the namespaces/links it made (removed on drop). `Sync`: a test may
/// share it with threads (concurrent ADDs).
pub struct TestEnv {
    pub test: String,
    pub tmp: PathBuf,
    /// `cnikit install --dir` output: bridge, macvlan, ipvlan, portmap, ipamd links.
    pub bin: PathBuf,
    /// The reference plugins.
    pub ref_bin: PathBuf,
    netns: Mutex<Vec<String>>,
    links: Mutex<Vec<String>>,
    daemons: Mutex<Vec<std::process::Child>>,
}

impl TestEnv {
    /// Check isolation, make the temp dir and install our links into it.
    pub fn new(test: &str) -> TestEnv {
        require_isolation();
        host_uplink();
        let tmp = std::env::temp_dir().join(format!(
            "cnikit-it-{}-{}-{}",
            std::process::id(),
            next_id(),
            test.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("create test temp dir");
        let env = TestEnv {
            test: test.to_string(),
            bin: tmp.join("bin"),
            ref_bin: PathBuf::from(REF_DIR),
            tmp,
            netns: Mutex::new(Vec::new()),
            links: Mutex::new(Vec::new()),
            daemons: Mutex::new(Vec::new()),
        };
        let out = Command::new(cnikit_exe())
            .args(["install", "--dir"])
            .arg(&env.bin)
            .output()
            .expect("run cnikit install");
        assert!(
            out.status.success(),
            "cnikit install --dir {} failed: {}{}",
            env.bin.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            Path::new(REF_DIR).join("host-local").is_file(),
            "the reference plugins are missing: apt install containernetworking-plugins"
        );
        env
    }

    /// A fresh directory under the test's temp dir.
    pub fn dir(&self, what: &str) -> PathBuf {
        let d = self.tmp.join(format!("{what}-{}", next_id()));
        std::fs::create_dir_all(&d).expect("create dir");
        d
    }

    /// A unique /24 + /64 pair.
    pub fn subnets(&self) -> Subnets {
        Subnets::next()
    }

    /// Create a network namespace, removed on drop.
    pub fn netns(&self) -> Netns {
        let name = format!("cnk-{}", short_hash());
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        lock(&self.netns).push(name.clone());
        Netns {
            path: format!("/run/netns/{name}"),
            name,
        }
    }

    /// Delete a namespace now (to test DEL after the container is gone).
    pub fn del_netns(&self, ns: &Netns) {
        ip(&["netns", "del", &ns.name]);
        lock(&self.netns).retain(|n| n != &ns.name);
    }

    /// Reserve a unique host link name (a bridge the plugin will create, …);
    /// whatever carries it is deleted on drop.
    pub fn link_name(&self, prefix: &str) -> String {
        let name = ifname_with(prefix);
        lock(&self.links).push(name.clone());
        name
    }

    /// Register a link created by other means for deletion on drop.
    pub fn own_link(&self, name: &str) {
        lock(&self.links).push(name.to_string());
    }

    /// A veth pair in the test host namespace, both ends up.
    pub fn veth_pair(&self) -> (String, String) {
        let a = self.link_name("tva");
        let b = self.link_name("tvb");
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        ip(&["link", "set", &a, "up"]);
        ip(&["link", "set", &b, "up"]);
        (a, b)
    }

    /// An `ipam` object of the given kind with per-test state (dataDir, socket).
    pub fn ipam(&self, kind: Ipam, ranges: Value) -> Value {
        let data = self.dir(kind.type_name());
        match kind {
            Ipam::IpamdDaemon => {
                let socket = data.join("ipamd.sock");
                self.start_ipamd_daemon(&socket, &data);
                json!({"type": "ipamd", "dataDir": data, "socket": socket, "ranges": ranges})
            }
            Ipam::HostLocal => json!({
                "type": "host-local",
                "dataDir": data,
                "ranges": ranges,
            }),
            Ipam::Ipamd => json!({
                "type": "ipamd",
                "dataDir": data,
                // Nothing listens here: the plugin uses the store in-process.
                "socket": data.join("no-daemon.sock"),
                "ranges": ranges,
            }),
        }
    }

    /// Start `cnikit ipamd daemon` on `socket` for `data` and wait until it answers.
    pub fn start_ipamd_daemon(&self, socket: &Path, data: &Path) {
        let log = std::fs::File::create(data.with_extension("daemon.log")).expect("daemon log");
        let child = Command::new(cnikit_exe())
            .args(["ipamd", "daemon", "--log-level", "warn", "--socket"])
            .arg(socket)
            .arg("--data-dir")
            .arg(data)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup daemon log"))
            .stderr(log)
            .spawn()
            .expect("spawn cnikit ipamd daemon");
        lock(&self.daemons).push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while ipamd_get(socket, "/healthz").is_none() {
            assert!(
                Instant::now() < deadline,
                "ipamd daemon on {} never answered",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Number of leases the IPAM state of `ipam` holds for network `network`.
    pub fn lease_count(&self, ipam: &Value, network: &str) -> usize {
        let data = PathBuf::from(ipam["dataDir"].as_str().expect("ipam.dataDir"));
        match ipam["type"].as_str() {
            Some("host-local") => {
                // host-local: one file per address, named after it, plus `lock`
                // and `last_reserved_ip.N`.
                let dir = data.join(network);
                match std::fs::read_dir(&dir) {
                    Err(_) => 0,
                    Ok(rd) => rd
                        .filter_map(Result::ok)
                        .filter(|e| {
                            e.file_name()
                                .to_str()
                                .is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok())
                        })
                        .count(),
                }
            }
            Some("ipamd") => {
                let socket = ipam["socket"].as_str().expect("ipam.socket");
                let out = Command::new(cnikit_exe())
                    .args([
                        "ipamd",
                        "leases",
                        "--json",
                        "--network",
                        network,
                        "--data-dir",
                    ])
                    .arg(&data)
                    .args(["--socket", socket])
                    .output()
                    .expect("run cnikit ipamd leases");
                assert!(
                    out.status.success(),
                    "cnikit ipamd leases failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                    panic!(
                        "cnikit ipamd leases --json printed invalid JSON ({e}): {}",
                        String::from_utf8_lossy(&out.stdout)
                    )
                });
                v.as_array()
                    .map_or(0, |a| a.iter().filter(|l| l["network"] == network).count())
            }
            other => panic!("lease_count: unknown ipam type {other:?}"),
        }
    }

    /// A call of our plugin `name` through its link in the test bin dir, with
    /// CNI_PATH = our dir, then the reference dir.
    pub fn plugin(&self, name: &str) -> Call {
        let path = std::env::join_paths([&self.bin, &self.ref_bin])
            .expect("join CNI_PATH")
            .to_string_lossy()
            .into_owned();
        Call::new(self.bin.join(name)).env("CNI_PATH", &path)
    }

    /// A call of the reference plugin `name`, CNI_PATH = the reference dir only.
    pub fn ref_plugin(&self, name: &str) -> Call {
        Call::new(self.ref_bin.join(name))
            .env("CNI_PATH", REF_DIR)
            .reference()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        for d in lock(&self.daemons).iter_mut() {
            let _ = d.kill();
            let _ = d.wait();
        }
        for ns in lock(&self.netns).iter() {
            let _ = sh("ip", &["netns", "del", ns]);
        }
        for l in lock(&self.links).iter() {
            let _ = sh("ip", &["link", "del", l]);
        }
        if !std::thread::panicking() || std::env::var_os("CNIKIT_KEEP_TMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

// ------------------------------------------------------------------ plugin calls

/// One plugin execution, built like a runtime builds it.
#[derive(Debug, Clone)]
pub struct Call {
    exe: PathBuf,
    args: Vec<String>,
    env: Vec<(String, std::ffi::OsString)>,
    stdin: Vec<u8>,
    reference: bool,
}

/// What a plugin call produced. Construction already checked the protocol
/// invariants: no signal, no panic, and on failure exactly one error object.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// stdout parsed, when it is JSON.
    pub json: Option<Value>,
}

/// A CNI error object.
#[derive(Debug, Clone)]
pub struct CniError {
    pub cni_version: String,
    pub code: u64,
    pub msg: String,
    pub details: String,
}

impl Call {
    pub fn new(exe: PathBuf) -> Call {
        Call {
            exe,
            args: Vec::new(),
            env: Vec::new(),
            stdin: Vec::new(),
            reference: false,
        }
    }

    /// Run `cnikit ARGS…` (multicall by subcommand instead of by link name).
    pub fn cnikit(args: &[&str]) -> Call {
        let mut c = Call::new(cnikit_exe());
        c.args = args.iter().map(|s| s.to_string()).collect();
        c
    }

    fn reference(mut self) -> Call {
        self.reference = true;
        self
    }

    /// Set (or replace) an environment variable.
    pub fn env(self, k: &str, v: &str) -> Call {
        self.env_os(k, v.into())
    }

    /// Set a variable to arbitrary bytes (not necessarily UTF-8).
    pub fn env_os(mut self, k: &str, v: std::ffi::OsString) -> Call {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.to_string(), v));
        self
    }

    /// Remove an environment variable set earlier.
    pub fn unset(mut self, k: &str) -> Call {
        self.env.retain(|(key, _)| key != k);
        self
    }

    pub fn command(self, c: &str) -> Call {
        self.env("CNI_COMMAND", c)
    }
    pub fn container(self, id: &str) -> Call {
        self.env("CNI_CONTAINERID", id)
    }
    pub fn netns(self, ns: &Netns) -> Call {
        self.env("CNI_NETNS", &ns.path)
    }
    pub fn netns_path(self, p: &str) -> Call {
        self.env("CNI_NETNS", p)
    }
    pub fn ifname(self, i: &str) -> Call {
        self.env("CNI_IFNAME", i)
    }
    pub fn cni_args(self, a: &str) -> Call {
        self.env("CNI_ARGS", a)
    }

    /// The usual ADD/CHECK/DEL environment for one attachment.
    pub fn attach(self, command: &str, id: &str, ns: &Netns, ifname: &str) -> Call {
        self.command(command).container(id).netns(ns).ifname(ifname)
    }

    pub fn conf(mut self, conf: &Value) -> Call {
        self.stdin = serde_json::to_vec(conf).expect("serialize config");
        self
    }

    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Call {
        self.stdin = bytes.into();
        self
    }

    /// Execute with a cleared environment (PATH kept), check the invariants.
    pub fn run(self) -> Outcome {
        let what = format!(
            "{} {} [{}]",
            self.exe.display(),
            self.args.join(" "),
            self.env
                .iter()
                .map(|(k, v)| format!("{k}={}", v.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.args)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        let mut stdin = child.stdin.take().expect("stdin");
        let input = self.stdin.clone();
        // The plugin may exit without reading everything (huge input): ignore EPIPE.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let mut out_pipe = child.stdout.take().expect("stdout");
        let mut err_pipe = child.stderr.take().expect("stderr");
        let reader_out = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = out_pipe.read_to_end(&mut b);
            b
        });
        let reader_err = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = err_pipe.read_to_end(&mut b);
            b
        });
        let deadline = Instant::now() + CALL_TIMEOUT;
        let status = loop {
            match child.try_wait().expect("wait for plugin") {
                Some(s) => break s,
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("{what} did not finish within {CALL_TIMEOUT:?}");
                }
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let _ = writer.join();
        let stdout = String::from_utf8_lossy(&reader_out.join().unwrap_or_default()).into_owned();
        let stderr = String::from_utf8_lossy(&reader_err.join().unwrap_or_default()).into_owned();
        let json = serde_json::from_str::<Value>(stdout.trim()).ok();
        let o = Outcome {
            what,
            status,
            stdout,
            stderr,
            json,
        };
        o.check_invariants(self.reference);
        o
    }
}

impl Outcome {
    fn context(&self) -> String {
        format!(
            "{}\n  exit: {:?}\n  stdout: {}\n  stderr: {}",
            self.what,
            self.status,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }

    /// No signal, no panic; a failure prints exactly one error object.
    fn check_invariants(&self, reference: bool) {
        if let Some(sig) = self.status.signal() {
            panic!(
                "plugin was killed by signal {sig} (panic/abort?):\n{}",
                self.context()
            );
        }
        if !reference {
            assert!(
                !self.stderr.contains("panicked at") && self.status.code() != Some(101),
                "plugin panicked:\n{}",
                self.context()
            );
            assert!(
                !self.stdout.contains("internal error (bug in cnikit)"),
                "plugin reported an internal error (a bug):\n{}",
                self.context()
            );
        }
        if !self.status.success() {
            if let Err(why) = parse_error_object(&self.stdout, reference) {
                panic!(
                    "failure without a valid CNI error object on stdout ({why}):\n{}",
                    self.context()
                );
            }
        }
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Assert success and return self.
    pub fn ok(&self) -> &Outcome {
        assert!(
            self.status.success(),
            "plugin call failed:\n{}",
            self.context()
        );
        self
    }

    /// Assert success with an empty stdout (DEL, CHECK).
    pub fn ok_silent(&self) -> &Outcome {
        self.ok();
        assert!(
            self.stdout.trim().is_empty(),
            "expected no output:\n{}",
            self.context()
        );
        self
    }

    /// Assert success and return the printed result.
    pub fn result(&self) -> Value {
        self.ok();
        self.json
            .clone()
            .unwrap_or_else(|| panic!("plugin printed no JSON result:\n{}", self.context()))
    }

    /// Assert failure and return the error object.
    pub fn err(&self) -> CniError {
        assert!(
            !self.status.success(),
            "plugin call unexpectedly succeeded:\n{}",
            self.context()
        );
        assert_eq!(
            self.status.code(),
            Some(1),
            "error exit code should be 1:\n{}",
            self.context()
        );
        parse_error_object(&self.stdout, false).expect("checked in run()")
    }

    /// Assert failure with `code` and a message containing every needle.
    pub fn expect_err(&self, code: u64, needles: &[&str]) -> CniError {
        let e = self.err();
        assert_eq!(e.code, code, "wrong error code:\n{}", self.context());
        for n in needles {
            assert!(
                e.msg.contains(n) || e.details.contains(n),
                "error message should mention {n:?}:\n{}",
                self.context()
            );
        }
        e
    }
}

/// stdout must be exactly one JSON object {cniVersion, code, msg[, details]}.
pub fn parse_error_object(stdout: &str, lenient: bool) -> Result<CniError, String> {
    let mut stream = serde_json::Deserializer::from_str(stdout).into_iter::<Value>();
    let first = match stream.next() {
        None => return Err("stdout is empty".into()),
        Some(Err(e)) => return Err(format!("stdout is not JSON: {e}")),
        Some(Ok(v)) => v,
    };
    if stream.next().is_some() {
        return Err("stdout holds more than one JSON value".into());
    }
    let obj = first.as_object().ok_or("the error is not a JSON object")?;
    let code = obj
        .get("code")
        .and_then(Value::as_u64)
        .ok_or("no unsigned integer `code`")?;
    let msg = obj
        .get("msg")
        .and_then(Value::as_str)
        .ok_or("no string `msg`")?;
    let cni_version = match obj.get("cniVersion").and_then(Value::as_str) {
        Some(v) => v.to_string(),
        None if lenient => String::new(),
        None => return Err("no string `cniVersion`".into()),
    };
    let details = match obj.get("details") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("`details` is not a string: {other}")),
    };
    if !lenient {
        if let Some(k) = obj
            .keys()
            .find(|k| !["cniVersion", "code", "msg", "details"].contains(&k.as_str()))
        {
            return Err(format!("unexpected key {k:?} in the error object"));
        }
        if msg.trim().is_empty() {
            return Err("empty `msg`".into());
        }
    }
    Ok(CniError {
        cni_version,
        code,
        msg: msg.to_string(),
        details,
    })
}

// ------------------------------------------------------------------ result helpers

/// `result.ips[].address` strings.
pub fn result_addresses(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|ip| ip["address"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The bare address (no prefix) of the first result IP of a family.
pub fn first_addr(result: &Value, v6: bool) -> String {
    result_addresses(result)
        .into_iter()
        .find(|a| a.contains(':') == v6)
        .map(|a| a.split('/').next().unwrap_or_default().to_string())
        .unwrap_or_else(|| {
            panic!(
                "result has no {} address: {result}",
                if v6 { "IPv6" } else { "IPv4" }
            )
        })
}

/// The result with `prevResult` set, for CHECK / chained calls.
pub fn with_prev(conf: &Value, prev: &Value) -> Value {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c
}

/// Sorted keys of a JSON object.
pub fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}

/// GET `path` from the ipamd daemon on `socket`; None when nothing answers.
pub fn ipamd_get(socket: &Path, path: &str) -> Option<String> {
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: ipamd\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200").then_some(out)
}

/// How many allocate requests the daemon behind `ipam` served (its /metrics).
pub fn ipamd_daemon_allocations(ipam: &Value) -> u64 {
    let socket = Path::new(ipam["socket"].as_str().expect("ipam.socket"));
    let metrics = ipamd_get(socket, "/metrics").expect("the ipamd daemon answers /metrics");
    metrics
        .lines()
        .filter(|l| l.starts_with("ipamd_requests_total") && l.contains("verb=\"allocate\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
