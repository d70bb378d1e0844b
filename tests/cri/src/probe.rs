//! TCP/UDP echo server and probe, std only: shared by the suite (probes from the node) and
//! `cri-echo` (server and probes inside pods).
//!
//! The server answers every TCP connection and every UDP datagram with its reply (the pod's
//! hostname) and a newline, so a probe tells which pod answered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

/// Serve `reply` on the TCP and UDP ports (all addresses, v4 and v6) until killed.
pub fn serve(tcp: &[u16], udp: &[u16], reply: &str) -> std::io::Result<()> {
    let mut threads = Vec::new();
    for &port in tcp {
        let l =
            TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))?;
        let r = format!("{reply}\n");
        threads.push(std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let _ = s.write_all(r.as_bytes());
            }
        }));
    }
    for &port in udp {
        let s = UdpSocket::bind(("::", port)).or_else(|_| UdpSocket::bind(("0.0.0.0", port)))?;
        let r = format!("{reply}\n");
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((_, peer)) = s.recv_from(&mut buf) {
                let _ = s.send_to(r.as_bytes(), peer);
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// One probe: the reply's first line, or why there is none. `proto` is "tcp" or "udp".
pub fn probe(proto: &str, addr: &str) -> Result<String, String> {
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| format!("bad address {addr}: {e}"))?;
    let raw = match proto {
        "tcp" => {
            let mut s =
                TcpStream::connect_timeout(&sa, TIMEOUT).map_err(|e| format!("tcp {addr}: {e}"))?;
            s.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
            let mut out = String::new();
            s.read_to_string(&mut out)
                .map_err(|e| format!("tcp {addr}: read: {e}"))?;
            out
        }
        "udp" => {
            let local = if sa.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
            let s = UdpSocket::bind(local).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_millis(700)))
                .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 1500];
            let mut last = String::from("no answer");
            let mut got = None;
            for _ in 0..3 {
                if let Err(e) = s.send_to(b"ping\n", sa) {
                    last = e.to_string();
                    continue;
                }
                match s.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        got = Some(String::from_utf8_lossy(&buf[..n]).into_owned());
                        break;
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            got.ok_or_else(|| format!("udp {addr}: {last}"))?
        }
        _ => return Err(format!("unknown protocol {proto}")),
    };
    Ok(raw.lines().next().unwrap_or("").to_string())
}

/// `ip:port` for v4 and `[ip]:port` for v6.
pub fn hostport(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}
