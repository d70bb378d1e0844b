//! Do the residents' host ports answer? A connect to 127.0.0.1:hostPort from
//! the node reaches the pod only through portmap's DNAT: without it the
//! node itself answers with a reset (nothing of its own listens on the
//! resident ports), and with it the pod's listener completes the handshake.
//! So only a sample of the pods gets a listener (one per pod costs a socket
//! per pod and says no more than the map's element count does), and a
//! connect that succeeds proves that pod's DNAT is back.

use crate::podns::PodNs;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The container port of a resident's first mapping (`setup::Chain::resident`).
const POD_PORT: u16 = 80;
/// Between sweeps: short against a repair's tens of milliseconds, long
/// enough that the sweeps do not compete with it for the two CPUs.
const PAUSE: Duration = Duration::from_millis(2);

/// Listeners in the sampled pods, and the host ports that reach them.
pub struct Sample {
    /// Kept open: each lives in its pod's namespace until dropped.
    _listeners: Vec<TcpListener>,
    pub host_ports: Vec<u16>,
}

/// `k` residents spread over `0..n`: the first, the last and evenly between.
pub fn spread(n: u32, k: u32) -> Vec<u32> {
    let k = k.min(n);
    if k <= 1 {
        return (0..k).collect();
    }
    (0..k).map(|j| j * (n - 1) / (k - 1)).collect()
}

impl Sample {
    /// A listener on port 80 in each of `pods` (index, netns); the host
    /// port is that resident's first mapping.
    pub fn listen(pods: &[(u32, &PodNs)]) -> Result<Sample, String> {
        let mut listeners = Vec::new();
        let mut host_ports = Vec::new();
        for &(i, ns) in pods {
            listeners.push(listen_in(ns)?);
            let port = crate::setup::RESIDENT_PORT + 2 * i;
            host_ports.push(u16::try_from(port).map_err(|e| e.to_string())?);
        }
        Ok(Sample {
            _listeners: listeners,
            host_ports,
        })
    }

    /// Sweep the ports not answered yet until all have, or `limit` passed;
    /// the moment the last one answered.
    pub fn until_all_answer(&self, limit: Duration) -> Result<Instant, String> {
        let deadline = Instant::now() + limit;
        let mut waiting = self.host_ports.clone();
        loop {
            waiting.retain(|&p| !answers(p));
            if waiting.is_empty() {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "host ports {waiting:?} did not answer within {limit:?}"
                ));
            }
            std::thread::sleep(PAUSE);
        }
    }

    /// How many of the sampled ports answer now.
    pub fn answering(&self) -> usize {
        self.host_ports.iter().filter(|&&p| answers(p)).count()
    }
}

/// A completed handshake on 127.0.0.1:port. A fresh source port each time,
/// so a connect refused before the repair leaves no conntrack entry that a
/// later one would match (without the NAT).
fn answers(port: u16) -> bool {
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// On a short-lived thread in the pod's namespace: the socket stays in the
/// namespace it was made in, and no benchmark thread stays in a pod's.
fn listen_in(ns: &PodNs) -> Result<TcpListener, String> {
    let path = ns.path.clone();
    std::thread::spawn(move || {
        let f = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: setns on an open namespace fd, for this thread only.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns: {}", std::io::Error::last_os_error()));
        }
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, POD_PORT)).map_err(|e| format!("listen: {e}"))
    })
    .join()
    .map_err(|_| "listener thread panicked".to_string())?
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn spread_takes_first_last_and_between() {
        assert_eq!(spread(1000, 10)[0], 0);
        assert_eq!(spread(1000, 10)[9], 999);
        assert_eq!(spread(1000, 10).len(), 10);
        assert_eq!(spread(3, 10), vec![0, 1, 2]);
        assert_eq!(spread(5, 1), vec![0]);
    }
}
