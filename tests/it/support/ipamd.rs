//! The ipamd daemon (`cnikit ipamd daemon`) as a child process, its HTTP API
//! over the unix socket, its metrics, and the leases of a store.

use super::call::wait_for;
use super::names::next_id;
use super::process::{cnikit_exe, stdout_ok};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `cnikit ipamd daemon` as a child process; SIGKILLed on drop.
pub struct Daemon {
    child: Option<Child>,
    sock: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Start it without waiting for the socket; it logs next to the socket.
    pub fn spawn(sock: &Path, data: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Daemon {
        let log = sock.with_file_name(format!("daemon-{}.log", next_id()));
        Daemon::spawn_logging_to(sock, data, extra, env, log)
    }

    /// Start it without waiting for the socket, logging to `log`.
    pub fn spawn_logging_to(
        sock: &Path,
        data: &Path,
        extra: &[&str],
        env: &[(&str, &Path)],
        log: PathBuf,
    ) -> Daemon {
        Daemon::spawn_with(Command::new(cnikit_exe()), (sock, data), extra, env, log)
    }

    /// Start it inside netns `ns` (a node of the test's own) and wait until it
    /// answers; it logs next to the socket.
    pub fn start_in(ns: &str, sock: &Path, data: &Path) -> Daemon {
        Daemon::start_in_with(ns, sock, data, &["--log-level", "debug"])
    }

    /// [`Daemon::start_in`] with the daemon arguments `extra`. `ip netns exec` execs the
    /// daemon, so the child's pid is the daemon's (for [`Daemon::signal`]).
    pub fn start_in_with(ns: &str, sock: &Path, data: &Path, extra: &[&str]) -> Daemon {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(cnikit_exe());
        Daemon::start_by(cmd, sock, data, extra)
    }

    /// Start it by `cmd` (a program and its first arguments: `cnikit`, or what runs it),
    /// to which the daemon's arguments are added, and wait until it answers; it logs next
    /// to the socket.
    pub fn start_by(cmd: Command, sock: &Path, data: &Path, extra: &[&str]) -> Daemon {
        let log = sock.with_file_name(format!("daemon-{}.log", next_id()));
        let mut d = Daemon::spawn_with(cmd, (sock, data), extra, &[], log);
        d.wait_ready();
        d
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.log_text()
    }

    fn spawn_with(
        mut cmd: Command,
        (sock, data): (&Path, &Path),
        extra: &[&str],
        env: &[(&str, &Path)],
        log: PathBuf,
    ) -> Daemon {
        let out = std::fs::File::create(&log).expect("create daemon log");
        let err = out.try_clone().expect("dup daemon log");
        let level: &[&str] = if extra.contains(&"--log-level") {
            &[]
        } else {
            &["--log-level", "warn"]
        };
        cmd.args(["ipamd", "daemon", "--socket"])
            .arg(sock)
            .arg("--data-dir")
            .arg(data)
            .args(level)
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
    pub fn start(sock: &Path, data: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Daemon {
        let mut d = Daemon::spawn(sock, data, extra, env);
        d.wait_ready();
        d
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn wait_ready(&mut self) {
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
            if ipamd_get(&self.sock, "/healthz").is_some() {
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

    /// Send `sig` (SIGSTOP, SIGCONT) to the daemon.
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(c) = self.child.as_ref() {
            let pid = libc::pid_t::try_from(c.id()).expect("pid fits");
            // SAFETY: kill(2) on our own child, which has not been reaped yet.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; it must exit 0 within 20 s.
    pub fn stop(mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = libc::pid_t::try_from(c.id()).expect("pid fits");
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let st = wait_for(&mut c, Duration::from_secs(20)).unwrap_or_else(|| {
            panic!("daemon ignored SIGTERM for 20 s; log:\n{}", self.log_text())
        });
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
pub fn http(sock: &Path, method: &str, target: &str, body: Option<&str>) -> Option<(u16, String)> {
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

/// The body of GET `path` from the daemon on `socket`; None unless it answers 200.
pub fn ipamd_get(socket: &Path, path: &str) -> Option<String> {
    match http(socket, "GET", path, None)? {
        (200, body) => Some(body),
        _ => None,
    }
}

/// The daemon's /metrics (it must answer).
fn metrics(socket: &Path) -> String {
    ipamd_get(socket, "/metrics").expect("the ipamd daemon answers /metrics")
}

/// The value of the series that starts with `series` in the daemon's
/// /metrics (0 when absent).
pub fn metric(socket: &Path, series: &str) -> u64 {
    metrics(socket)
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Allocations the daemon served successfully.
pub const ALLOCATE_OK: &str = "ipamd_requests_total{verb=\"allocate\",outcome=\"ok\"}";

/// How many allocate requests (any outcome) the daemon behind `ipam` served.
pub fn ipamd_daemon_allocations(ipam: &Value) -> u64 {
    let socket = Path::new(ipam["socket"].as_str().expect("ipam.socket"));
    metrics(socket)
        .lines()
        .filter(|l| l.starts_with("ipamd_requests_total") && l.contains("verb=\"allocate\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// How many firewall operations `op` (e.g. "portmap-add") the ipamd daemon on
/// `socket` applied successfully: proof that the plugins used it.
pub fn daemon_fw_ops(socket: &Value, op: &str) -> u64 {
    let socket = Path::new(socket.as_str().expect("daemon socket path"));
    metric(
        socket,
        &format!("ipamd_ext_requests_total{{op=\"firewall.{op}\",outcome=\"ok\"}} "),
    )
}

/// Assert how many times the daemon on `socket` applied each firewall
/// operation (no daemon, no assertion).
pub fn assert_fw_ops(socket: Option<&Value>, expected: &[(&str, u64)]) {
    let Some(socket) = socket else {
        return;
    };
    for (op, n) in expected {
        assert_eq!(daemon_fw_ops(socket, op), *n, "{op} by the daemon");
    }
}

/// Make `conf` send its firewall operations to the daemon of `ipam` (a
/// `Ipam::IpamdDaemon` object); returns the socket.
pub fn use_daemon(conf: &mut Value, ipam: &Value) -> Value {
    let socket = ipam["socket"].clone();
    conf["daemonSocket"] = socket.clone();
    socket
}

/// A lease as `cnikit ipamd leases --json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lease {
    pub cid: String,
    pub ifname: String,
    pub addr: IpAddr,
}

/// `cnikit ipamd leases --json`, of network `network` or of all (from the daemon
/// on `sock` if one answers, else from the files under `data`): the listed objects.
pub fn leases_json(data: &Path, sock: &Path, network: Option<&str>) -> Vec<Value> {
    let mut cmd = Command::new(cnikit_exe());
    cmd.args(["ipamd", "leases", "--json"]);
    if let Some(network) = network {
        cmd.args(["--network", network]);
    }
    let out = cmd
        .arg("--data-dir")
        .arg(data)
        .arg("--socket")
        .arg(sock)
        .output()
        .expect("run cnikit ipamd leases");
    let stdout = stdout_ok("cnikit ipamd leases", &out);
    match serde_json::from_str(&stdout) {
        Ok(Value::Array(leases)) => leases,
        other => panic!("cnikit ipamd leases --json printed no list ({other:?}): {stdout}"),
    }
}

/// `cnikit ipamd leases --json --network N` ([`leases_json`]), checked: no
/// address held twice.
pub fn list_leases(data: &Path, sock: &Path, network: &str) -> Vec<Lease> {
    let mut leases: Vec<Lease> = leases_json(data, sock, Some(network))
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
