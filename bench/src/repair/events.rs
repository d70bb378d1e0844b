//! When each nftables batch was committed, and by which process: the
//! kernel ends every batch's events with NFT_MSG_NEWGEN carrying the
//! committer's pid (what `nft monitor` prints as "# new generation"). The
//! flush's NEWGEN is the moment the daemon's watch hears of it; the repair's
//! is the moment everything is back, as it comes in one batch. Read on a
//! thread of its own, so each is stamped as it arrives rather than when the
//! benchmark gets round to looking.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NFNLGRP_NFTABLES: libc::c_int = 7;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWGEN: u16 = 15;
const NFTA_GEN_PROC_PID: u16 = 2;
/// A repair of 1,000 attachments sends thousands of events at once: the
/// default buffer would overrun and drop the NEWGEN that ends them.
const RECEIVE_BUFFER: libc::c_int = 64 << 20;

/// One committed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    pub pid: u32,
    pub at: Instant,
}

/// The commits seen since [`Watch::start`], until dropped.
pub struct Watch {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Seen {
    commits: Vec<Commit>,
    /// Times the kernel dropped events (ENOBUFS): a commit may be missing.
    lost: u32,
}

impl Watch {
    /// Listen in the calling thread's network namespace.
    pub fn start() -> Result<Watch, String> {
        let fd = subscribe()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || read_loop(&fd, &s, &st));
        Ok(Watch {
            seen,
            stop,
            thread: Some(thread),
        })
    }

    /// The first commit by process `pid` seen at or after `after` (waiting
    /// at most `limit` for it).
    pub fn commit_of(&self, pid: u32, after: Instant, limit: Duration) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            let found = {
                let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                let mut theirs = seen.commits.iter().filter(|c| of_process(c.pid, pid));
                theirs.find(|c| c.at >= after).map(|c| c.at)
            };
            if found.is_some() || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Events dropped by the kernel so far.
    pub fn lost(&self) -> u32 {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).lost
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The kernel names the committing *thread* (`task_pid_nr`), not its
/// process: a daemon commits from its watch or worker threads, whose ids
/// are not the daemon's pid.
fn of_process(tid: u32, pid: u32) -> bool {
    tid == pid || std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

fn subscribe() -> Result<OwnedFd, String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain socket(2); the fd is owned right away.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if raw < 0 {
        return Err(os("netlink socket"));
    }
    // SAFETY: raw is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_nl is plain data; zeroed is a valid (unbound) value.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    let len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    // The kernel sends multicast only to bound sockets.
    // SAFETY: addr outlives the call; len is its size.
    if unsafe { libc::bind(raw, (&addr as *const libc::sockaddr_nl).cast(), len) } != 0 {
        return Err(os("bind netlink"));
    }
    set_int(
        &fd,
        libc::SOL_NETLINK,
        libc::NETLINK_ADD_MEMBERSHIP,
        NFNLGRP_NFTABLES,
    )
    .map_err(|_| os("join NFNLGRP_NFTABLES"))?;
    set_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RECEIVE_BUFFER)
        .map_err(|_| os("SO_RCVBUFFORCE"))?;
    // A timeout, so the thread sees `stop` while nothing happens.
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: tv outlives the call; its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(os("SO_RCVTIMEO"));
    }
    Ok(fd)
}

fn set_int(fd: &OwnedFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> Result<(), ()> {
    // SAFETY: v outlives the call; its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(())
    }
}

fn read_loop(fd: &OwnedFd, seen: &Mutex<Seen>, stop: &AtomicBool) {
    prompt();
    let mut buf = vec![0u8; 1 << 20];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: buf is writable for its whole length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let at = Instant::now();
        let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOBUFS) {
                s.lost += 1;
            }
            continue;
        }
        for pid in commits(&buf[..n as usize]) {
            s.commits.push(Commit { pid, at });
        }
    }
}

/// Real-time priority for this thread: each commit is stamped when recv
/// returns, and on two busy CPUs an ordinary thread woke milliseconds late,
/// stamping the flush and the repair after it at nearly the same moment.
/// It only parses what arrives, so it takes little from the others. Without
/// the privilege the stamps are only less sharp.
fn prompt() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: for the calling thread (0), with a valid param.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
}

/// The committers' pids of the NEWGEN messages in one datagram.
fn commits(datagram: &[u8]) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut rest = datagram;
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        if len < 16 || len > rest.len() {
            break;
        }
        if kind == (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN) {
            // After the header, nfgenmsg (4 bytes), then the attributes.
            pids.extend(gen_pid(rest.get(20..len).unwrap_or_default()));
        }
        rest = &rest[align4(len).min(rest.len())..];
    }
    pids
}

/// NFTA_GEN_PROC_PID (big-endian u32) among `attrs`.
fn gen_pid(mut attrs: &[u8]) -> Option<u32> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NFTA_GEN_PROC_PID && len >= 8 {
            return Some(u32::from_be_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]));
        }
        attrs = &attrs[align4(len).min(attrs.len())..];
    }
    None
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = ((4 + data.len()) as u16).to_ne_bytes().to_vec();
        a.extend(kind.to_ne_bytes());
        a.extend(data);
        a.resize(align4(a.len()), 0);
        a
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = ((16 + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend(kind.to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend(body);
        m
    }

    #[test]
    fn newgen_gives_the_committers_pid() {
        let mut body = vec![0u8; 4]; // nfgenmsg
        body.extend(attr(1, &7u32.to_be_bytes())); // NFTA_GEN_ID
        body.extend(attr(NFTA_GEN_PROC_PID, &4242u32.to_be_bytes()));
        body.extend(attr(3, b"nft\0"));
        let mut dgram = message(10 << 8 | 14, &[0u8; 8]); // a NEWSETELEM
        dgram.extend(message(10 << 8 | NFT_MSG_NEWGEN, &body));
        assert_eq!(commits(&dgram), vec![4242]);
    }

    #[test]
    fn a_truncated_datagram_gives_nothing() {
        let m = message(10 << 8 | NFT_MSG_NEWGEN, &[0u8; 4]);
        assert!(commits(&m[..10]).is_empty());
        assert!(commits(&m).is_empty());
    }
}
