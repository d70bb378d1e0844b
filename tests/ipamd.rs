//! The `ipamd` IPAM plugin end to end: the real binary run exactly as a
//! runtime runs an IPAM plugin (CNI_* environment, config on stdin), with the
//! lease daemon `cnikit ipamd daemon` as a child process or with no daemon at
//! all (the plugin then works on the store in-process).
//!
//! The plugin alone never enters a netns, so CNI_NETNS is just a path string
//! here. Every test has its own dataDir and socket under the test's temp dir;
//! most semantic tests run twice, `<test>::daemon` and `<test>::in_process`.

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// The network name of every test configuration.
const NET: &str = "ipamd-it";
/// CNI_NETNS of IPAM-only calls: the ipamd plugin never opens it.
const NO_NETNS: &str = "/var/run/netns/ipam-only";
/// The daemon's test hook for a fake boot ID (see ipamd/README.md).
const BOOT_ID_FILE_ENV: &str = "CNIKIT_IPAMD_BOOT_ID_FILE";

// ------------------------------------------------------------------ daemon process

/// `cnikit ipamd daemon` as a child process; SIGKILLed on drop.
struct Daemon {
    child: Option<Child>,
    sock: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Start it without waiting for the socket.
    fn spawn(sock: &Path, data: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Daemon {
        let log = sock.with_file_name(format!("daemon-{}.log", next_id()));
        let out = std::fs::File::create(&log).expect("create daemon log");
        let err = out.try_clone().expect("dup daemon log");
        let mut cmd = Command::new(cnikit_exe());
        cmd.args(["ipamd", "daemon", "--socket"])
            .arg(sock)
            .arg("--data-dir")
            .arg(data)
            .args(["--log-level", "warn"])
            .args(extra)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn cnikit ipamd daemon");
        Daemon {
            child: Some(child),
            sock: sock.to_path_buf(),
            log,
        }
    }

    /// Start it and wait until it answers `/healthz`.
    fn start(sock: &Path, data: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Daemon {
        let mut d = Daemon::spawn(sock, data, extra, env);
        d.wait_ready();
        d
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!(
                        "ipamd daemon exited ({st}) before serving; its log:\n{}",
                        self.log_text()
                    );
                }
            }
            if matches!(http(&self.sock, "GET", "/healthz", None), Some((200, _))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ipamd daemon did not answer on {} within 20 s; its log:\n{}",
                self.sock.display(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL and reap.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; it must exit 0 within 20 s.
    fn stop(mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = libc::pid_t::try_from(c.id()).expect("pid fits");
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        let st = loop {
            match c.try_wait().expect("wait for daemon") {
                Some(st) => break st,
                None if Instant::now() > deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("daemon ignored SIGTERM for 20 s; log:\n{}", self.log_text());
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        assert!(
            st.success(),
            "daemon exited with {st} after SIGTERM; log:\n{}",
            self.log_text()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One HTTP/1.1 request over a unix socket: (status, body), None if nothing answers.
fn http(sock: &Path, method: &str, target: &str, body: Option<&str>) -> Option<(u16, String)> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: ipamd\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, rest) = out.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, rest.to_string()))
}

/// A counter of the daemon's /metrics (0 when absent).
fn metric(sock: &Path, line_prefix: &str) -> u64 {
    let (code, text) = http(sock, "GET", "/metrics", None).expect("GET /metrics");
    assert_eq!(code, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

const ALLOCATE_OK: &str = "ipamd_requests_total{verb=\"allocate\",outcome=\"ok\"}";

// ------------------------------------------------------------------ fixture

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A daemon serves the socket.
    Daemon,
    /// Nothing listens: every call works on the store in-process.
    InProcess,
}

/// One test's ipamd world: the plugin bin dir, a dataDir, a socket path and
/// (in `Mode::Daemon`) the daemon.
struct Fix {
    env: TestEnv,
    data: PathBuf,
    sock: PathBuf,
    daemon: Option<Daemon>,
}

/// A lease as `cnikit ipamd leases --json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Lease {
    cid: String,
    ifname: String,
    addr: IpAddr,
}

impl Fix {
    fn new(test: &str, mode: Mode) -> Fix {
        let env = TestEnv::new(test);
        let dir = env.dir("ipamd");
        let data = dir.join("data");
        let sock = dir.join("d.sock");
        let mut f = Fix {
            env,
            data,
            sock,
            daemon: None,
        };
        if mode == Mode::Daemon {
            f.start_daemon(&[], &[]);
        }
        f
    }

    fn start_daemon(&mut self, extra: &[&str], env: &[(&str, &Path)]) {
        self.daemon = Some(Daemon::start(&self.sock, &self.data, extra, env));
    }

    fn stop_daemon(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
    }

    fn ipam(&self, ranges: Value) -> Value {
        json!({
            "type": "ipamd",
            "dataDir": self.data,
            "socket": self.sock,
            "ranges": ranges,
        })
    }

    fn conf(&self, version: &str, ipam: Value) -> Value {
        json!({
            "cniVersion": version,
            "name": NET,
            "type": "ipamd",
            "ipam": ipam,
        })
    }

    /// A 1.0.0 config over one v4 subnet.
    fn conf_v4(&self, subnet: &str) -> Value {
        self.conf("1.0.0", self.ipam(json!([[{ "subnet": subnet }]])))
    }

    fn call(&self, cmd: &str, cid: &str, ifname: &str, conf: &Value) -> Call {
        self.env
            .plugin("ipamd")
            .command(cmd)
            .container(cid)
            .netns_path(NO_NETNS)
            .ifname(ifname)
            .conf(conf)
    }

    fn add(&self, cid: &str, conf: &Value) -> Outcome {
        self.call("ADD", cid, "eth0", conf).run()
    }

    fn del(&self, cid: &str, conf: &Value) -> Outcome {
        self.call("DEL", cid, "eth0", conf).run()
    }

    /// STATUS / GC: no container, no interface, no netns.
    fn net_call(&self, cmd: &str, conf: &Value) -> Outcome {
        self.env.plugin("ipamd").command(cmd).conf(conf).run()
    }

    /// Leases of network NET, from the daemon if one runs, else from the files.
    fn leases(&self) -> Vec<Lease> {
        list_leases(&self.data, &self.sock, NET)
    }
}

/// `cnikit ipamd leases --json --network N`, checked: no address held twice.
fn list_leases(data: &Path, sock: &Path, network: &str) -> Vec<Lease> {
    let out = Command::new(cnikit_exe())
        .args([
            "ipamd",
            "leases",
            "--json",
            "--network",
            network,
            "--data-dir",
        ])
        .arg(data)
        .arg("--socket")
        .arg(sock)
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
    let mut leases: Vec<Lease> = v
        .as_array()
        .expect("leases --json prints a list")
        .iter()
        .map(|l| {
            assert_eq!(l["network"], network, "{l}");
            Lease {
                cid: l["containerId"].as_str().expect("containerId").to_string(),
                ifname: l["ifname"].as_str().expect("ifname").to_string(),
                addr: l["address"]
                    .as_str()
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("bad lease address in {l}")),
            }
        })
        .collect();
    leases.sort();
    let mut seen = BTreeMap::new();
    for l in &leases {
        if let Some(other) = seen.insert(l.addr, l) {
            panic!("address {} is held twice: {other:?} and {l:?}", l.addr);
        }
    }
    leases
}

/// The bare address of the single IP of an ADD result.
fn only_addr(r: &Value) -> IpAddr {
    let a = result_addresses(r);
    assert_eq!(a.len(), 1, "expected one address: {r}");
    bare(&a[0])
}

fn bare(cidr: &str) -> IpAddr {
    cidr.split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{cidr:?} is not an address"))
}

/// `10.P.N.0/24` → `10.P.N.0/29` (the first 8 addresses: .2–.6 allocatable).
fn slash29(v4_24: &str) -> String {
    v4_24.replace("/24", "/29")
}

/// Run the same test in both modes: `name::daemon` and `name::in_process`.
macro_rules! both_modes {
    ($name:ident) => {
        mod $name {
            #[test]
            fn daemon() {
                super::$name(super::Mode::Daemon, concat!(stringify!($name), "_d"));
            }
            #[test]
            fn in_process() {
                super::$name(super::Mode::InProcess, concat!(stringify!($name), "_p"));
            }
        }
    };
}

// ------------------------------------------------------------------ concurrency

/// Launch ADDs for containers `c{range}` in threads that all start at once.
fn launch(
    fix: &Arc<Fix>,
    conf: &Value,
    ids: std::ops::Range<usize>,
    done: &Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<(String, Outcome)>> {
    let barrier = Arc::new(Barrier::new(ids.len()));
    ids.map(|i| {
        let (fix, conf, barrier, done) = (
            Arc::clone(fix),
            conf.clone(),
            Arc::clone(&barrier),
            Arc::clone(done),
        );
        std::thread::spawn(move || {
            let cid = format!("conc-{i:02}");
            barrier.wait();
            let o = fix.add(&cid, &conf);
            done.fetch_add(1, Ordering::SeqCst);
            (cid, o)
        })
    })
    .collect()
}

/// Every ADD succeeded with a distinct allocatable address of `subnet`, and
/// the store lists exactly those leases.
fn check_all_distinct(fix: &Fix, nets: &Subnets, results: Vec<(String, Outcome)>) {
    let subnet: ipnet::IpNet = nets.v4.parse().expect("subnet");
    let mut by_cid = BTreeMap::new();
    let mut addrs = BTreeSet::new();
    for (cid, o) in results {
        let a = only_addr(&o.result());
        assert!(subnet.contains(&a), "{a} is not in {subnet}");
        assert!(
            a != bare(&nets.v4_addr(0))
                && a != bare(&nets.v4_addr(1))
                && a != bare(&nets.v4_addr(255)),
            "{cid} got the network, gateway or broadcast address {a}"
        );
        assert!(addrs.insert(a), "address {a} handed out twice");
        by_cid.insert(cid, a);
    }
    assert_eq!(by_cid.len(), 64);
    let leases = fix.leases();
    let listed: BTreeMap<String, IpAddr> = leases
        .iter()
        .map(|l| {
            assert_eq!(l.ifname, "eth0");
            (l.cid.clone(), l.addr)
        })
        .collect();
    assert_eq!(
        leases.len(),
        64,
        "the store must hold the 64 leases: {leases:?}"
    );
    assert_eq!(
        listed, by_cid,
        "the store's leases differ from the ADD results"
    );
}

fn concurrent_64(mode: Mode, test: &str) {
    let fix = Arc::new(Fix::new(test, mode));
    let nets = fix.env.subnets();
    let conf = fix.conf_v4(&nets.v4);
    let done = Arc::new(AtomicUsize::new(0));
    let results: Vec<_> = launch(&fix, &conf, 0..64, &done)
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    check_all_distinct(&fix, &nets, results);
    if mode == Mode::Daemon {
        assert_eq!(
            metric(&fix.sock, ALLOCATE_OK),
            64,
            "the daemon should have served every ADD"
        );
    }
    // The files say the same once the daemon is gone.
    let mut fix = Arc::into_inner(fix).expect("threads joined");
    fix.stop_daemon();
    assert_eq!(fix.leases().len(), 64);
}

/// Proves: 64 plugin processes started at once against one /24 get 64
/// distinct addresses, all leased — with the daemon serving them all
/// (`concurrent_64::daemon`) and with no daemon, all in-process
/// (`concurrent_64::in_process`).
mod concurrent_64 {
    #[test]
    fn daemon() {
        super::concurrent_64(super::Mode::Daemon, "conc64_d");
    }
    #[test]
    fn in_process() {
        super::concurrent_64(super::Mode::InProcess, "conc64_p");
    }
}

/// Proves: 64 plugin processes against one /24 while the daemon comes up
/// halfway through the launches (some work in-process, some through the
/// daemon, some of each at the same moment): still 64 distinct addresses, all
/// leased, whichever process wrote them.
#[test]
fn concurrent_64_mixed() {
    let fix = Arc::new(Fix::new("conc64_mixed", Mode::InProcess));
    let nets = fix.env.subnets();
    let conf = fix.conf_v4(&nets.v4);
    let done = Arc::new(AtomicUsize::new(0));
    // 32 at once with no daemon...
    let mut handles = launch(&fix, &conf, 0..32, &done);
    // ...the daemon starts as soon as the first of them has finished...
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no ADD finished within 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut daemon = Daemon::spawn(&fix.sock, &fix.data, &[], &[]);
    // ...16 more while it is starting, 16 once it serves.
    handles.extend(launch(&fix, &conf, 32..48, &done));
    daemon.wait_ready();
    handles.extend(launch(&fix, &conf, 48..64, &done));
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    let served = metric(&fix.sock, ALLOCATE_OK);
    eprintln!("concurrent_64_mixed: the daemon served {served} of 64 ADDs");
    assert!(
        (16..64).contains(&served),
        "the daemon should have served between 16 and 63 of the ADDs, served {served}"
    );
    check_all_distinct(&fix, &nets, results);
    daemon.stop();
    assert_eq!(fix.leases().len(), 64);
}

// ------------------------------------------------------------------ crash safety

/// xorshift64*: the tests need no rand crate.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Rng((t ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the client loops saw.
#[derive(Default)]
struct Ledger {
    /// ADD succeeded and no DEL succeeded since: must be leased with this address.
    held: BTreeMap<String, IpAddr>,
    /// DEL succeeded: must not be leased.
    deleted: BTreeSet<String>,
    /// Failed calls (there should be none: the client falls back in-process).
    failures: Vec<String>,
    adds: usize,
    /// Calls whose daemon died under them and that were redone in-process.
    redone: usize,
}

/// Proves: with the daemon SIGKILLed every 100–300 ms (and restarted) while 8
/// client loops ADD and DEL, every ADD that succeeded and was not deleted is
/// still leased with the address it returned, every successful DEL stuck, no
/// address is held twice, and no call failed (clients fall back in-process
/// when the daemon dies under them). Checked through the last daemon and
/// again from the files alone.
#[test]
fn crash_safety_sigkill() {
    const CLIENTS: usize = 8;
    const MAX_ITERS: usize = 200;
    const RUN_FOR: Duration = Duration::from_secs(8);
    let fix = Arc::new(Fix::new("crash_sigkill", Mode::InProcess));
    let mut daemon = Daemon::start(&fix.sock, &fix.data, &[], &[]);
    // Room for every ADD without exhaustion: the test is about durability.
    let conf = fix.conf_v4("10.251.0.0/20");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let running = Arc::new(AtomicUsize::new(CLIENTS));
    let deadline = Instant::now() + RUN_FOR;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (fix, conf, ledger, running) = (
                Arc::clone(&fix),
                conf.clone(),
                Arc::clone(&ledger),
                Arc::clone(&running),
            );
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 1);
                for i in 0..MAX_ITERS {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let cid = format!("crash-{t}-{i}");
                    let o = fix.add(&cid, &conf);
                    let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
                    l.adds += 1;
                    l.redone += usize::from(o.stderr.contains("retrying in-process"));
                    if !o.success() {
                        l.failures.push(format!("ADD {cid}: {}", o.stdout.trim()));
                        drop(l);
                        // What a runtime does after a failed ADD.
                        if !fix.del(&cid, &conf).success() {
                            ledger
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .failures
                                .push(format!("DEL after failed ADD {cid}"));
                        }
                        continue;
                    }
                    l.held.insert(cid.clone(), only_addr(&o.result()));
                    drop(l);
                    if rng.below(2) == 0 {
                        let d = fix.del(&cid, &conf);
                        let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
                        l.redone += usize::from(d.stderr.contains("retrying in-process"));
                        if d.success() {
                            l.held.remove(&cid);
                            l.deleted.insert(cid);
                        } else {
                            l.failures.push(format!("DEL {cid}: {}", d.stdout.trim()));
                        }
                    }
                }
                running.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect();

    let mut rng = Rng::new(99);
    let mut kills = 0;
    while running.load(Ordering::SeqCst) > 0 {
        std::thread::sleep(Duration::from_millis(100 + rng.below(201)));
        if running.load(Ordering::SeqCst) == 0 {
            break;
        }
        daemon.kill();
        kills += 1;
        // Restart at once, without waiting: clients meanwhile find a stale
        // socket (connection refused) and work in-process.
        daemon = Daemon::spawn(&fix.sock, &fix.data, &[], &[]);
    }
    for c in clients {
        c.join().expect("client thread");
    }
    daemon.wait_ready();
    let ledger = Arc::into_inner(ledger)
        .expect("clients joined")
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "crash_safety_sigkill: {} ADDs, {} kept, {} deleted, {kills} daemon kills, {} calls redone in-process after the daemon died under them",
        ledger.adds,
        ledger.held.len(),
        ledger.deleted.len(),
        ledger.redone
    );
    assert!(kills >= 5, "the daemon was killed only {kills} times");
    assert!(
        ledger.redone > 0,
        "no call was caught by a kill mid-request: the test did not test that"
    );
    assert!(
        ledger.failures.is_empty(),
        "calls failed while the daemon was being killed:\n{}",
        ledger.failures.join("\n")
    );

    let check = |leases: Vec<Lease>, from: &str| {
        let listed: BTreeMap<String, IpAddr> =
            leases.iter().map(|l| (l.cid.clone(), l.addr)).collect();
        assert_eq!(
            listed.len(),
            leases.len(),
            "a container holds two leases ({from})"
        );
        for (cid, addr) in &ledger.held {
            assert_eq!(
                listed.get(cid),
                Some(addr),
                "acknowledged ADD of {cid} ({addr}) lost or changed ({from})"
            );
        }
        for cid in &ledger.deleted {
            assert!(!listed.contains_key(cid), "DEL of {cid} was lost ({from})");
        }
        assert_eq!(
            listed.len(),
            ledger.held.len(),
            "leases nobody acknowledged ({from})"
        );
    };
    check(fix.leases(), "through the daemon");
    daemon.stop();
    check(fix.leases(), "from the files");
}

// ------------------------------------------------------------------ semantics

/// Proves: on a full pool ADD fails with code 103 and a message naming the
/// subnet and the count in use, allocates nothing, and a freed address can be
/// had again.
fn exhaustion(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let subnet = slash29(&nets.v4);
    let conf = fix.conf_v4(&subnet);
    let mut got = BTreeSet::new();
    for i in 0..5 {
        got.insert(only_addr(&fix.add(&format!("ex-{i}"), &conf).result()));
    }
    let want: BTreeSet<IpAddr> = (2..=6).map(|h| bare(&nets.v4_addr(h))).collect();
    assert_eq!(got, want, "a /29 has .2–.6 to give (.1 is the gateway)");
    fix.add("ex-full", &conf)
        .expect_err(103, &[&format!("no free address in {subnet} (5 in use)")]);
    assert_eq!(fix.leases().len(), 5, "a failed ADD must allocate nothing");
    fix.call("CHECK", "ex-full", "eth0", &conf).run().err();
    fix.del("ex-3", &conf).ok_silent();
    let again = only_addr(&fix.add("ex-new", &conf).result());
    assert!(want.contains(&again), "{again}");
    assert_eq!(fix.leases().len(), 5);
}
both_modes!(exhaustion);

/// Proves: ADD of a key that holds a lease returns the same address (no
/// second lease); another ifname of the same container is another key.
fn idempotent_add(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let conf = fix.conf_v4(&nets.v4);
    let first = fix.add("idem", &conf).result();
    let second = fix.add("idem", &conf).result();
    assert_eq!(first, second, "repeated ADD must return the same result");
    let other = fix.call("ADD", "idem", "eth1", &conf).run().result();
    assert_ne!(only_addr(&other), only_addr(&first));
    let leases = fix.leases();
    assert_eq!(leases.len(), 2, "{leases:?}");
}
both_modes!(idempotent_add);

/// Proves: DEL of a key that holds nothing (twice, and in a network that has
/// no store yet) succeeds silently and changes nothing.
fn del_unknown_key(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let conf = fix.conf_v4(&nets.v4);
    fix.del("never-added", &conf).ok_silent();
    fix.add("kept", &conf).result();
    fix.del("never-added", &conf).ok_silent();
    fix.del("never-added", &conf).ok_silent();
    let mut other = conf.clone();
    other["name"] = json!("no-such-network");
    fix.del("never-added", &other).ok_silent();
    let leases = fix.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].cid, "kept");
}
both_modes!(del_unknown_key);

/// Proves: GC (1.1.0, `cni.dev/valid-attachments`) frees every lease of the
/// network not in the list, keeps the listed ones, prints nothing; the older
/// `cni.dev/attachments` key works too; another network is untouched.
fn gc_valid_list(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let conf = fix.conf("1.1.0", fix.ipam(nets.v4_ranges()));
    for (cid, ifname) in [
        ("g1", "eth0"),
        ("g2", "eth0"),
        ("g3", "eth0"),
        ("g3", "eth1"),
    ] {
        fix.call("ADD", cid, ifname, &conf).run().result();
    }
    let mut other = conf.clone();
    other["name"] = json!("ipamd-other");
    fix.call("ADD", "g2", "eth0", &other).run().result();

    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "g1", "ifname": "eth0"},
        {"containerID": "g3", "ifname": "eth1"},
    ]);
    fix.net_call("GC", &gc).ok_silent();
    let keys: Vec<(String, String)> = fix
        .leases()
        .into_iter()
        .map(|l| (l.cid, l.ifname))
        .collect();
    assert_eq!(
        keys,
        vec![("g1".into(), "eth0".into()), ("g3".into(), "eth1".into())]
    );
    // Idempotent.
    fix.net_call("GC", &gc).ok_silent();
    assert_eq!(fix.leases().len(), 2);

    let mut old = conf.clone();
    old["cni.dev/attachments"] = json!([{"containerID": "g1", "ifname": "eth0"}]);
    fix.net_call("GC", &old).ok_silent();
    let left = fix.leases();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].cid, "g1");

    let others = list_leases(&fix.data, &fix.sock, "ipamd-other");
    assert_eq!(
        others.len(),
        1,
        "GC of {NET} touched another network: {others:?}"
    );
}
both_modes!(gc_valid_list);

/// Proves: STATUS succeeds silently while an ADD could succeed, fails with
/// code 50 on a full pool, and succeeds again once an address is freed.
fn status_full_pool(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let subnet = slash29(&nets.v4);
    let conf = fix.conf("1.1.0", fix.ipam(json!([[{ "subnet": subnet }]])));
    fix.net_call("STATUS", &conf).ok_silent();
    for i in 0..4 {
        fix.add(&format!("st-{i}"), &conf).result();
        fix.net_call("STATUS", &conf).ok_silent();
    }
    fix.add("st-4", &conf).result();
    fix.net_call("STATUS", &conf)
        .expect_err(50, &["no free address", &subnet]);
    fix.del("st-2", &conf).ok_silent();
    fix.net_call("STATUS", &conf).ok_silent();
    if mode == Mode::InProcess {
        // An unusable store (dataDir is a file) cannot serve ADD either.
        let file = fix.env.dir("notadir").join("file");
        std::fs::write(&file, "x").expect("write file");
        let mut ipam = fix.ipam(json!([[{ "subnet": subnet }]]));
        ipam["dataDir"] = json!(file);
        fix.net_call("STATUS", &fix.conf("1.1.0", ipam))
            .expect_err(50, &[]);
    }
}
both_modes!(status_full_pool);

/// Proves: CHECK passes with the ADD's own result as prevResult, fails when
/// prevResult carries another address, when the key holds nothing, and after DEL.
fn check_prev_result(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let conf = fix.conf_v4(&nets.v4);
    let r = fix.add("chk", &conf).result();
    fix.call("CHECK", "chk", "eth0", &with_prev(&conf, &r))
        .run()
        .ok_silent();

    let mut wrong = r.clone();
    wrong["ips"][0]["address"] = json!(format!("{}/24", nets.v4_addr(200)));
    fix.call("CHECK", "chk", "eth0", &with_prev(&conf, &wrong))
        .run()
        .expect_err(103, &["prevResult"]);

    fix.call("CHECK", "nobody", "eth0", &with_prev(&conf, &r))
        .run()
        .expect_err(103, &["no lease"]);
    fix.del("chk", &conf).ok_silent();
    fix.call("CHECK", "chk", "eth0", &with_prev(&conf, &r))
        .run()
        .expect_err(103, &["no lease"]);
}
both_modes!(check_prev_result);

/// Proves: a requested address (`CNI_ARGS IP=`, also v4+v6 comma separated,
/// and `runtimeConfig.ips`) is honoured, and refused with code 103 when
/// another attachment holds it or it is outside the ranges — nothing allocated.
fn requested_ip(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let conf = fix.conf("1.0.0", fix.ipam(nets.dual_ranges()));
    let v4 = nets.v4_addr(7);
    // Canonical text (the harness writes `fdcb:P:0::x` for N = 0).
    let v6 = bare(&nets.v6_addr(0x77)).to_string();

    let r = fix
        .call("ADD", "req-a", "eth0", &conf)
        .cni_args(&format!("IgnoreUnknown=1;IP={v4},{v6}"))
        .run()
        .result();
    assert_eq!(
        result_addresses(&r),
        vec![format!("{v4}/24"), format!("{v6}/64")],
        "{r}"
    );
    fix.call("ADD", "req-b", "eth0", &conf)
        .cni_args(&format!("IP={v4}"))
        .run()
        .expect_err(103, &[&v4, "held by"]);
    fix.call("ADD", "req-b", "eth0", &conf)
        .cni_args("IP=192.0.2.9")
        .run()
        .expect_err(103, &["192.0.2.9", "not in any range set"]);

    // runtimeConfig.ips (capability "ips"), with a prefix as CONVENTIONS allows.
    let v4b = nets.v4_addr(9);
    let mut rc = conf.clone();
    rc["runtimeConfig"] = json!({ "ips": [format!("{v4b}/24")] });
    let r = fix.call("ADD", "req-c", "eth0", &rc).run().result();
    assert_eq!(first_addr(&r, false), v4b, "{r}");
    fix.call("ADD", "req-d", "eth0", &rc)
        .run()
        .expect_err(103, &[&v4b, "held by"]);

    // args.cni.ips (CONVENTIONS), v6 this time.
    let v6b = bare(&nets.v6_addr(0x99)).to_string();
    let mut ac = conf.clone();
    ac["args"] = json!({ "cni": { "ips": [v6b] } });
    let r = fix.call("ADD", "req-e", "eth0", &ac).run().result();
    assert_eq!(first_addr(&r, true), v6b, "{r}");

    let keys: BTreeSet<String> = fix.leases().into_iter().map(|l| l.cid).collect();
    assert_eq!(
        keys,
        ["req-a", "req-c", "req-e"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        "refused ADDs must allocate nothing"
    );
    // Two leases per dual-stack attachment.
    assert_eq!(fix.leases().len(), 6);
}
both_modes!(requested_ip);

/// Proves: `runtimeConfig.ipRanges` (capability `ipRanges`) replaces the
/// configured range sets.
fn ip_ranges_capability(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let other = fix.env.subnets();
    let mut conf = fix.conf_v4(&nets.v4);
    conf["runtimeConfig"] = json!({ "ipRanges": [[{
        "subnet": other.v4,
        "rangeStart": other.v4_addr(50),
        "rangeEnd": other.v4_addr(60),
    }]] });
    let r = fix.add("rng", &conf).result();
    assert_eq!(
        result_addresses(&r),
        vec![format!("{}/24", other.v4_addr(50))]
    );
    assert_eq!(r["ips"][0]["gateway"], json!(other.v4_addr(1)));
}
both_modes!(ip_ranges_capability);

/// Proves: a network name with `../` is refused with code 7 and nothing is
/// created outside dataDir; the daemon itself refuses such a name with 400.
fn traversal_name(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let base = fix.data.parent().expect("data has a parent").to_path_buf();
    for name in ["../evil", "a/../../evil", "/tmp/evil"] {
        let mut conf = fix.conf_v4(&nets.v4);
        conf["name"] = json!(name);
        for cmd in ["ADD", "DEL"] {
            fix.call(cmd, "trav", "eth0", &conf)
                .run()
                .expect_err(7, &[]);
        }
        let mut status = conf.clone();
        status["cniVersion"] = json!("1.1.0");
        fix.net_call("STATUS", &status).expect_err(7, &[]);
    }
    assert!(!base.join("evil").exists());
    let listing: Vec<_> = std::fs::read_dir(&base)
        .expect("list test dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(
        listing
            .iter()
            .all(|n| n == "data" || n == "d.sock" || n.to_string_lossy().starts_with("daemon-")),
        "unexpected files next to dataDir: {listing:?}"
    );
    if mode == Mode::Daemon {
        let body = json!({
            "key": {"network": "../evil", "containerId": "c", "ifname": "eth0"},
            "rangeSets": [[{"subnet": nets.v4}]],
        })
        .to_string();
        let (code, text) =
            http(&fix.sock, "POST", "/v1/allocate", Some(&body)).expect("daemon answers");
        assert_eq!(code, 400, "{text}");
        assert!(text.contains("invalid_config"), "{text}");
        let (code, text) =
            http(&fix.sock, "GET", "/v1/leases?network=../evil", None).expect("daemon answers");
        assert_eq!(code, 400, "{text}");
        assert!(!base.join("evil").exists() && !fix.data.join("..").join("evil").exists());
    }
}
both_modes!(traversal_name);

/// Run `argv` as uid/gid 65534 with no supplementary groups.
fn as_nobody(argv: &[&str], env: &[(&str, String)], stdin: &[u8]) -> std::process::Output {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--",
    ])
    .args(argv)
    .env_clear()
    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run setpriv");
    let mut input = child.stdin.take().expect("stdin");
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().expect("wait for setpriv")
}

/// Proves: the daemon refuses a non-root peer with 403 even when the socket
/// file lets it connect; the plugin run as that user fails with a clear error
/// (no in-process fallback behind the daemon's back) and leases nothing;
/// with the default 0600 socket it cannot even connect.
#[test]
fn non_root_peer_refused() {
    let fix = Fix::new("nonroot", Mode::Daemon);
    let nets = fix.env.subnets();
    let conf = fix.conf_v4(&nets.v4);
    let sock = fix.sock.to_string_lossy().into_owned();
    let mode = std::fs::metadata(&fix.sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let has_curl = Command::new("curl").arg("--version").output().is_ok();
    let curl = |as_root: bool, method: &str, path: &str| -> (bool, String) {
        let url = format!("http://ipamd{path}");
        let mut argv = vec![
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            method,
            "--unix-socket",
            &sock,
            &url,
        ];
        if method == "POST" {
            argv.extend(["-H", "Content-Type: application/json", "-d", "{}"]);
        }
        let out = if as_root {
            Command::new(argv[0])
                .args(&argv[1..])
                .output()
                .expect("run curl")
        } else {
            as_nobody(&argv, &[], b"")
        };
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    if has_curl {
        let (ok, code) = curl(false, "GET", "/healthz");
        assert!(
            !ok && code == "000",
            "nobody connected to a 0600 socket: {code}"
        );
    }

    let plugin_env = |cmd: &str| -> Vec<(&str, String)> {
        vec![
            ("CNI_COMMAND", cmd.to_string()),
            ("CNI_CONTAINERID", "nobody-ctr".to_string()),
            ("CNI_NETNS", NO_NETNS.to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", fix.env.bin.to_string_lossy().into_owned()),
        ]
    };
    let plugin = fix.env.bin.join("ipamd").to_string_lossy().into_owned();
    let stdin = serde_json::to_vec(&conf).expect("conf");
    let run_plugin = || {
        let out = as_nobody(&[&plugin], &plugin_env("ADD"), &stdin);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(1),
            "ADD as nobody must fail: {stdout}"
        );
        parse_error_object(&stdout, false)
            .unwrap_or_else(|e| panic!("not an error object ({e}): {stdout}"))
    };
    let e = run_plugin();
    assert_eq!(e.code, 11, "{e:?}");

    // Make the socket connectable for everyone: SO_PEERCRED still says no.
    std::fs::set_permissions(&fix.sock, std::fs::Permissions::from_mode(0o666))
        .expect("chmod socket");
    if has_curl {
        assert_eq!(curl(false, "GET", "/healthz").1, "403");
        assert_eq!(curl(false, "GET", "/v1/leases").1, "403");
        assert_eq!(curl(false, "POST", "/v1/release").1, "403");
        assert_eq!(curl(true, "GET", "/healthz").1, "200");
    }
    let e = run_plugin();
    assert_eq!(e.code, 11, "{e:?}");
    assert!(e.msg.contains("refuses uid 65534"), "{e:?}");
    assert!(fix.leases().is_empty(), "a refused peer got a lease");
}

/// Proves: the result has the layout of the requested version — 0.2.0
/// `ip4`/`ip6` blocks with their routes, 0.4.0 `ips[]` tagged with `version`,
/// 1.0.0 `ips[]` without it — with the gateways and routes of the config.
fn result_layouts(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let mut ipam = fix.ipam(nets.dual_ranges());
    ipam["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "192.0.2.0/24", "gw": nets.v4_addr(254)}]);
    let (gw4, gw6) = (nets.v4_addr(1), bare(&nets.v6_addr(1)).to_string());
    for (i, version) in ["0.2.0", "0.4.0", "1.0.0"].into_iter().enumerate() {
        let conf = fix.conf(version, ipam.clone());
        let r = fix.add(&format!("lay-{i}"), &conf).result();
        assert_eq!(r["cniVersion"], version, "{r}");
        match version {
            "0.2.0" => {
                assert_eq!(keys(&r), ["cniVersion", "dns", "ip4", "ip6"], "{r}");
                let ip4 = bare(r["ip4"]["ip"].as_str().expect("ip4.ip"));
                assert!(
                    r["ip4"]["ip"].as_str().is_some_and(|s| s.ends_with("/24")),
                    "{r}"
                );
                assert!(ip4.is_ipv4());
                assert_eq!(r["ip4"]["gateway"], json!(gw4), "{r}");
                assert_eq!(
                    r["ip4"]["routes"],
                    json!([{"dst": "0.0.0.0/0"}, {"dst": "192.0.2.0/24", "gw": nets.v4_addr(254)}]),
                    "{r}"
                );
                assert!(
                    r["ip6"]["ip"].as_str().is_some_and(|s| s.ends_with("/64")),
                    "{r}"
                );
                assert_eq!(r["ip6"]["gateway"], json!(gw6), "{r}");
                assert_eq!(r["ip6"]["routes"], json!([{"dst": "::/0"}]), "{r}");
            }
            _ => {
                assert_eq!(keys(&r), ["cniVersion", "dns", "ips", "routes"], "{r}");
                let ips = r["ips"].as_array().expect("ips");
                assert_eq!(ips.len(), 2, "{r}");
                for (ip, (v, gw)) in ips.iter().zip([("4", &gw4), ("6", &gw6)]) {
                    let mut want = vec!["address", "gateway"];
                    if version == "0.4.0" {
                        assert_eq!(ip["version"], v, "{r}");
                        want.push("version");
                    }
                    assert_eq!(keys(ip), want, "{r}");
                    assert_eq!(ip["gateway"], json!(gw), "{r}");
                    assert!(ip.get("interface").is_none(), "IPAM sets no interface: {r}");
                }
                assert_eq!(
                    r["routes"],
                    json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "192.0.2.0/24", "gw": nets.v4_addr(254)}]),
                    "{r}"
                );
            }
        }
        assert_eq!(r["dns"], json!({}), "{r}");
    }
}
both_modes!(result_layouts);

/// Proves: `resolvConf` is parsed into the result's `dns` (nameservers,
/// domain, search, options; comments ignored); a missing file is error 7.
fn resolv_conf_dns(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let path = fix.env.dir("resolv").join("resolv.conf");
    std::fs::write(
        &path,
        "# generated\nnameserver 192.0.2.53\nnameserver 2001:db8::53\n; comment\n\
         domain example.test\nsearch a.example.test b.example.test\noptions ndots:2 timeout:1\n",
    )
    .expect("write resolv.conf");
    let mut ipam = fix.ipam(nets.v4_ranges());
    ipam["resolvConf"] = json!(path);
    let r = fix.add("dns", &fix.conf("1.0.0", ipam.clone())).result();
    assert_eq!(
        r["dns"],
        json!({
            "nameservers": ["192.0.2.53", "2001:db8::53"],
            "domain": "example.test",
            "search": ["a.example.test", "b.example.test"],
            "options": ["ndots:2", "timeout:1"],
        }),
        "{r}"
    );
    let r = fix.add("dns", &fix.conf("0.2.0", ipam.clone())).result();
    assert_eq!(
        r["dns"]["nameservers"],
        json!(["192.0.2.53", "2001:db8::53"]),
        "{r}"
    );

    ipam["resolvConf"] = json!(fix.data.join("no-such-resolv.conf"));
    fix.add("dns2", &fix.conf("1.0.0", ipam))
        .expect_err(7, &["resolvConf"]);
}
both_modes!(resolv_conf_dns);

/// Proves: invalid `ipam` keys are error 7 naming the key and value.
fn invalid_config(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = fix.env.subnets();
    let bad = [
        (json!([[{"subnet": "10.9.9.1/24"}]]), "10.9.9.1/24"),
        (json!([[{"subnet": "10.9.9.0/31"}]]), "/31"),
        (
            json!([[{"subnet": nets.v4, "gateway": "192.0.2.1"}]]),
            "192.0.2.1",
        ),
        (
            json!([[{"subnet": nets.v4, "rangeStart": "192.0.2.1"}]]),
            "rangeStart",
        ),
        (
            json!([[{"subnet": nets.v4}], [{"subnet": nets.v4}]]),
            "overlap",
        ),
    ];
    for (ranges, needle) in bad {
        let conf = fix.conf("1.0.0", fix.ipam(ranges));
        fix.add("bad", &conf).expect_err(7, &[needle]);
    }
    assert!(fix.leases().is_empty());
}
both_modes!(invalid_config);

/// Proves: leases of a previous boot are reclaimed when the daemon starts
/// (simulated with the daemon's boot-ID test hook), but kept with
/// `--reclaim-previous-boot=false`; meanwhile a full pool's error says why.
#[test]
fn reboot_reclaim() {
    let mut fix = Fix::new("reboot", Mode::InProcess);
    let nets = fix.env.subnets();
    let subnet = slash29(&nets.v4);
    let conf = fix.conf_v4(&subnet);
    // Leases of "the previous boot": made in-process with the real boot ID.
    for i in 0..5 {
        fix.add(&format!("old-{i}"), &conf).result();
    }
    let boot = fix.env.dir("boot").join("boot_id");
    std::fs::write(&boot, "11111111-2222-3333-4444-555555555555\n").expect("write boot id");

    fix.start_daemon(
        &["--reclaim-previous-boot=false"],
        &[(BOOT_ID_FILE_ENV, &boot)],
    );
    assert_eq!(
        fix.leases().len(),
        5,
        "reclaim is off: nothing may be freed"
    );
    fix.add("new-0", &conf)
        .expect_err(103, &["no free address", "before the last reboot"]);
    fix.stop_daemon();

    fix.start_daemon(&[], &[(BOOT_ID_FILE_ENV, &boot)]);
    assert!(
        fix.leases().is_empty(),
        "the previous boot's leases must be reclaimed"
    );
    fix.add("new-0", &conf).result();
    fix.stop_daemon();
    // Same boot again: the new lease is kept.
    fix.start_daemon(&[], &[(BOOT_ID_FILE_ENV, &boot)]);
    let leases = fix.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].cid, "new-0");
}

/// Proves: with no daemon, a full pool whose leases were made under another
/// boot makes room by freeing those (their netns died with that boot), so
/// host-local's "no IP addresses available" after a reboot cannot happen.
#[test]
fn in_process_full_pool_reclaims_previous_boot() {
    let mut fix = Fix::new("reboot_inproc", Mode::InProcess);
    let nets = fix.env.subnets();
    let subnet = slash29(&nets.v4);
    let conf = fix.conf_v4(&subnet);
    // Fill the pool "in the previous boot": a daemon with a fake boot ID that
    // does not reclaim.
    let boot = fix.env.dir("boot").join("boot_id");
    std::fs::write(&boot, "11111111-2222-3333-4444-555555555555\n").expect("write boot id");
    fix.start_daemon(
        &["--reclaim-previous-boot=false"],
        &[(BOOT_ID_FILE_ENV, &boot)],
    );
    for i in 0..5 {
        fix.add(&format!("old-{i}"), &conf).result();
    }
    fix.stop_daemon();
    // This boot, no daemon: the ADD succeeds by reclaiming.
    fix.add("new-0", &conf).result();
    let leases = fix.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].cid, "new-0");
}

/// Proves: a daemon that accepts the connection and dies before answering
/// does not hang the plugin or half-make the lease: the plugin redoes the
/// operation in-process and the lease is in the files.
#[test]
fn daemon_dies_mid_request() {
    let fix = Fix::new("dies_mid", Mode::InProcess);
    let nets = fix.env.subnets();
    let conf = fix.conf_v4(&nets.v4);
    let listener = UnixListener::bind(&fix.sock).expect("bind fake daemon");
    let accepted = Arc::new(AtomicUsize::new(0));
    let acc = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { break };
            // Read part of the request, then "crash".
            let mut buf = [0u8; 16];
            let _ = s.read(&mut buf);
            acc.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    let started = Instant::now();
    let r = fix.add("mid", &conf).result();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the plugin hung"
    );
    assert!(
        accepted.load(Ordering::SeqCst) >= 1,
        "the fake daemon was not asked"
    );
    std::fs::remove_file(&fix.sock).expect("remove fake socket");
    let leases = fix.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].addr, only_addr(&r));
}

/// Proves: a config whose `dataDir` is not the daemon's `--data-dir` is
/// refused by the daemon (error 7 naming both) instead of being served from
/// the daemon's store — otherwise the in-process fallback (daemon down) would
/// allocate from another store and hand out the same address twice.
#[test]
fn data_dir_must_match_the_daemon() {
    let fix = Fix::new("datadir_mismatch", Mode::Daemon);
    let nets = fix.env.subnets();
    let other = fix.env.dir("other-data");
    let mut ipam = fix.ipam(nets.v4_ranges());
    ipam["dataDir"] = json!(other);
    let conf = fix.conf("1.0.0", ipam);
    let e = fix.add("mm-1", &conf).expect_err(7, &["dataDir"]);
    assert!(
        e.msg.contains(&*other.to_string_lossy()) && e.msg.contains(&*fix.data.to_string_lossy()),
        "the error should name both directories: {e:?}"
    );
    assert!(
        fix.leases().is_empty(),
        "nothing may be allocated in the daemon's store"
    );
    assert!(
        list_leases(&other, &fix.sock.with_file_name("none.sock"), NET).is_empty(),
        "nothing may be allocated in the config's store"
    );
    // The same directory under another name (a symlink) is the same store.
    let link = fix.env.dir("links").join("data-link");
    std::os::unix::fs::symlink(&fix.data, &link).expect("symlink");
    let mut ipam = fix.ipam(nets.v4_ranges());
    ipam["dataDir"] = json!(link);
    let r = fix.add("mm-2", &fix.conf("1.0.0", ipam)).result();
    assert_eq!(fix.leases().len(), 1);
    let _ = only_addr(&r);
}
