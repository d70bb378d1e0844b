//! Traffic for the firewall tests (portmap, ipMasq): tiny TCP and UDP
//! servers inside a netns that answer with their name and the peer address
//! they saw, and clients that run in any netns. Threads enter a netns with
//! setns(2) (per thread for network namespaces), so no external tools. Also
//! the nftables ruleset, read back with `nft`.

use serde_json::Value;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(2);

/// Run `f` in the network namespace at `ns` (None: the test's own).
pub fn in_netns<T: Send + 'static>(ns: Option<&str>, f: impl FnOnce() -> T + Send + 'static) -> T {
    match ns {
        None => f(),
        Some(path) => spawn_in(path, f).join().expect("netns thread panicked"),
    }
}

/// A thread that enters the network namespace at `path`, then runs `f`.
fn spawn_in<T: Send + 'static>(
    path: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = path.to_string();
    std::thread::spawn(move || {
        let ns = File::open(&path).unwrap_or_else(|e| panic!("open netns {path}: {e}"));
        // SAFETY: setns on an fd we own; affects only this thread.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
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
    in_netns(ns, move || {
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
    in_netns(ns, move || {
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

/// `host:port` with IPv6 in brackets.
pub fn sock(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn nft_output(args: &[&str]) -> std::process::Output {
    std::process::Command::new("nft")
        .args(args)
        .output()
        .expect("run nft")
}

/// `nft ARGS` (the tests may read and poke the ruleset; the plugins never
/// exec nft): success and stdout + stderr.
pub fn nft(args: &[&str]) -> (bool, String) {
    let out = nft_output(args);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `nft -j list ruleset` as text (for "no trace of X" checks).
pub fn ruleset_json() -> String {
    let out = nft_output(&["-j", "list", "ruleset"]);
    assert!(
        out.status.success(),
        "nft -j list ruleset: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What identifies an attachment in the ruleset: its container ID and the
/// first address of each family its result has.
pub fn traces(id: &str, result: &Value) -> Vec<String> {
    let mut needles = vec![id.to_string()];
    for v6 in [false, true] {
        if super::result_addresses(result)
            .iter()
            .any(|a| a.contains(':') == v6)
        {
            needles.push(format!("\"{}\"", super::first_addr(result, v6)));
        }
    }
    needles
}

/// The ruleset mentions none of `needles`.
pub fn assert_no_trace(what: &str, needles: &[String]) {
    let rules = ruleset_json();
    for n in needles {
        assert!(
            !rules.contains(n.as_str()),
            "{what}: the ruleset still mentions {n}:\n{rules}"
        );
    }
}

/// Sends `bytes` bytes over TCP from netns `from` (None: the test's own) to
/// `addr` ("ip:port"), where a receiver this starts in netns `to` (None: the
/// test's own) listens; returns how long it took from connect until the
/// receiver had read them all (the bandwidth tests time shaped transfers).
pub fn timed_transfer(from: Option<&str>, to: Option<&str>, addr: &str, bytes: usize) -> Duration {
    let addr: SocketAddr = addr.parse().expect("socket address");
    let listener = in_netns(to, move || {
        let unspecified = if addr.is_ipv4() { "0.0.0.0" } else { "::" };
        TcpListener::bind((unspecified, addr.port())).expect("bind transfer receiver")
    });
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept transfer");
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    });
    let started = Instant::now();
    in_netns(from, move || {
        let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).expect("connect for transfer");
        let chunk = vec![0x5au8; 64 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            s.write_all(&chunk[..n]).expect("send transfer");
            left -= n;
        }
    });
    let got = receiver.join().expect("transfer receiver");
    assert_eq!(
        got, bytes,
        "the receiver at {addr} got {got} of {bytes} bytes"
    );
    started.elapsed()
}
