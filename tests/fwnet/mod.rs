//! Traffic helpers for the firewall tests (portmap, ipMasq): tiny TCP and UDP
//! servers inside a netns that answer with their name and the peer address
//! they saw, and clients that run in any netns. Threads enter a netns with
//! setns(2) (per thread for network namespaces), so no external tools.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(2);

/// Run `f` in the network namespace at `ns` (None: the test's own).
pub fn in_ns<T: Send + 'static>(ns: Option<&str>, f: impl FnOnce() -> T + Send + 'static) -> T {
    match ns {
        None => f(),
        Some(path) => {
            let path = path.to_string();
            std::thread::spawn(move || {
                enter(&path);
                f()
            })
            .join()
            .expect("netns thread panicked")
        }
    }
}

fn enter(path: &str) {
    let f = File::open(path).unwrap_or_else(|e| panic!("open netns {path}: {e}"));
    // SAFETY: setns on an fd we own; affects only this thread.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

/// A TCP and a UDP server on `[::]:port` (dual stack) inside a netns; they
/// answer every connection / datagram with "NAME PEER". Stopped on drop.
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    pub fn start(ns: &str, name: &str, tcp_port: u16, udp_port: u16) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = vec![
            spawn_in(ns, {
                let (stop, name) = (stop.clone(), name.to_string());
                move || serve_tcp(tcp_port, &name, &stop)
            }),
            spawn_in(ns, {
                let (stop, name) = (stop.clone(), name.to_string());
                move || serve_udp(udp_port, &name, &stop)
            }),
        ];
        // The sockets are bound before the threads report ready.
        std::thread::sleep(Duration::from_millis(50));
        Servers { stop, threads }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn spawn_in(ns: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    let path = ns.to_string();
    std::thread::spawn(move || {
        enter(&path);
        f()
    })
}

fn serve_tcp(port: u16, name: &str, stop: &AtomicBool) {
    let l = TcpListener::bind(("::", port)).expect("bind tcp server");
    l.set_nonblocking(true).expect("nonblocking");
    while !stop.load(Ordering::Relaxed) {
        match l.accept() {
            Ok((mut s, peer)) => {
                let _ = s.set_nonblocking(false);
                let _ = writeln!(s, "{name} {}", plain(peer));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn serve_udp(port: u16, name: &str, stop: &AtomicBool) {
    let s = UdpSocket::bind(("::", port)).expect("bind udp server");
    s.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((_, peer)) = s.recv_from(&mut buf) {
            let _ = s.send_to(format!("{name} {}", plain(peer)).as_bytes(), peer);
        }
    }
}

/// The peer address without port, v4-mapped addresses shown as IPv4.
fn plain(peer: SocketAddr) -> String {
    match peer {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => a.ip().to_string(),
        },
        SocketAddr::V4(a) => a.ip().to_string(),
    }
}

/// "NAME PEER" from the TCP server behind `addr` ("1.2.3.4:80", "[::1]:80"),
/// connecting from netns `ns`; None when nothing answers within 2 s.
pub fn tcp_ask(ns: Option<&str>, addr: &str) -> Option<String> {
    let addr: SocketAddr = addr.parse().expect("socket address");
    in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).ok()?;
        s.set_read_timeout(Some(TIMEOUT)).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out.trim().to_string()).filter(|o| !o.is_empty())
    })
}

/// "NAME PEER" from the UDP server behind `addr`, from a fresh socket (a new
/// conntrack flow every time); None on silence or ICMP unreachable.
pub fn udp_ask(ns: Option<&str>, addr: &str) -> Option<String> {
    let addr: SocketAddr = addr.parse().expect("socket address");
    in_ns(ns, move || {
        let local = if addr.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let s = UdpSocket::bind(local).ok()?;
        s.connect(addr).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        let mut buf = [0u8; 512];
        // A few tries: the first datagram may wait for neighbour resolution.
        for _ in 0..4 {
            s.send(b"x").ok()?;
            if let Ok(n) = s.recv(&mut buf) {
                return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        None
    })
}

/// Retry `ask` for up to 5 s until it answers (routes, DAD, ARP settle).
pub fn eventually_answers(mut ask: impl FnMut() -> Option<String>) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(a) = ask() {
            return Some(a);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Host ports unique within this test process (and unlikely to meet another
/// run's leftovers), below the ephemeral range.
pub fn host_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 50) as u16 * 200;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 200
}

/// `host:port` with IPv6 in brackets.
pub fn sock(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `nft -j list ruleset` as text (for "no trace of X" checks).
pub fn ruleset_json() -> String {
    let out = std::process::Command::new("nft")
        .args(["-j", "list", "ruleset"])
        .output()
        .expect("run nft");
    assert!(
        out.status.success(),
        "nft -j list ruleset: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `nft ARGS` (the tests may read and poke the ruleset; the plugins never exec nft).
pub fn nft(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("nft")
        .args(args)
        .output()
        .expect("run nft");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// How many firewall operations `op` (e.g. "portmap-add") the ipamd daemon on
/// `socket` applied successfully (its /metrics): proof that the plugins used it.
pub fn daemon_fw_ops(socket: &serde_json::Value, op: &str) -> u64 {
    let socket = std::path::Path::new(socket.as_str().expect("daemon socket path"));
    let metrics =
        crate::common::ipamd_get(socket, "/metrics").expect("the daemon answers /metrics");
    let series = format!("ipamd_ext_requests_total{{op=\"firewall.{op}\",outcome=\"ok\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
        .unwrap_or(0)
}

/// Make `conf` send its firewall operations to the daemon of `ipam` (a
/// `Ipam::IpamdDaemon` object); returns the socket.
pub fn use_daemon(conf: &mut serde_json::Value, ipam: &serde_json::Value) -> serde_json::Value {
    let socket = ipam["socket"].clone();
    conf["daemonSocket"] = socket.clone();
    socket
}
