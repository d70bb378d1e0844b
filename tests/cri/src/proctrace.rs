//! `cnikit-cri-suite proc-trace --out FILE`: the kernel's process events connector
//! (NETLINK_CONNECTOR, CN_IDX_PROC) records every fork, exec and exit with the kernel's
//! CLOCK_MONOTONIC timestamp, so `--measure` can place each CNI plugin exec of containerd on
//! the timeline of a CRI call without a wrapper in front of the plugins (a wrapper would add
//! its own exec to what is measured; the connector adds nothing to the traced processes).
//!
//! The kernel only accepts listeners in the initial pid and user namespaces, and the
//! connector exists in the initial network namespace only: run.sh starts this outside its
//! `unshare`; pids below are the initial namespace's.
//!
//! Lines written (only for containerd's descendants; everything else is dropped):
//!   E <exec ns> <pid> <parent pid> <fork ns|0> <parent comm> <CNI_COMMAND|-|?> <argv0> [argv1..]
//!   F <fork ns> <pid> <parent pid>   a child of a traced process (until it execs, if ever)
//!   X <exit ns> <pid> <exit code> <ns on a CPU|?> <ns waiting for a CPU|?>
//!   T <exit ns> <tid> <tgid>      a thread of containerd ended (its netns goroutine's, which
//!                                 it ends on purpose once the namespace is mounted)
//! `-`: no CNI_COMMAND in the environment; `?`: the process was gone before it could be read.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;

const NETLINK_CONNECTOR: i32 = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 1;
const PROC_EVENT_EXEC: u32 = 2;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// nlmsghdr (16) + cn_msg (20): where struct proc_event starts.
const EV: usize = 36;

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map(|s| u32::from_ne_bytes(s.try_into().unwrap()))
        .unwrap_or(0)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .map(|s| u64::from_ne_bytes(s.try_into().unwrap()))
        .unwrap_or(0)
}

/// A subscribed connector socket.
fn subscribe() -> Result<i32, String> {
    // SAFETY: plain syscalls on a socket this function owns; the structs are zeroed C
    // structs and the buffers outlive the calls.
    unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM, NETLINK_CONNECTOR);
        if fd < 0 {
            return Err(format!("socket: {}", std::io::Error::last_os_error()));
        }
        // a burst of forks elsewhere on the machine must not overflow the queue: 16 MiB
        let size: libc::c_int = 16 << 20;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        );
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_pid = libc::getpid() as u32;
        sa.nl_groups = CN_IDX_PROC;
        let len = std::mem::size_of::<libc::sockaddr_nl>() as u32;
        if libc::bind(fd, (&sa as *const libc::sockaddr_nl).cast(), len) < 0 {
            return Err(format!("bind: {}", std::io::Error::last_os_error()));
        }
        let mut msg = Vec::with_capacity(40);
        msg.extend_from_slice(&40u32.to_ne_bytes()); // nlmsg_len
        msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&(libc::getpid() as u32).to_ne_bytes());
        for v in [CN_IDX_PROC, CN_VAL_PROC, 0, 0] {
            msg.extend_from_slice(&v.to_ne_bytes());
        }
        msg.extend_from_slice(&4u16.to_ne_bytes()); // cn_msg.len
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        if libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) < 0 {
            return Err(format!("send: {}", std::io::Error::last_os_error()));
        }
        Ok(fd)
    }
}

fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().replace(' ', "_"))
        .unwrap_or_default()
}

/// argv[0..4] (spaces within an argument become `_`) and CNI_COMMAND, read at once at the
/// exec event: a VERSION call can be over within a millisecond.
fn describe(pid: u32) -> Option<(String, String)> {
    let argv = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = argv
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .take(4)
        .map(|a| String::from_utf8_lossy(a).replace(' ', "_"))
        .collect();
    let cmd = match fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) if env.is_empty() => "?".into(), // already exiting
        Ok(env) => env
            .split(|&b| b == 0)
            .find_map(|v| v.strip_prefix(b"CNI_COMMAND="))
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_else(|| "-".into()),
        Err(_) => "?".into(),
    };
    Some((args.join(" "), cmd))
}

/// "<ns on a CPU> <ns waiting for one>" of the exiting process's main thread, read from
/// /proc/PID/schedstat while it exits (its parent has not reaped it yet, mostly): what
/// separates a plugin's own work from the wait for a CPU on a busy machine. "? ?" once
/// it is gone.
fn schedstat(pid: u32) -> String {
    let s = fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap_or_default();
    let f: Vec<&str> = s.split_whitespace().collect();
    match f.as_slice() {
        [run, wait, ..] => format!("{run} {wait}"),
        _ => "? ?".into(),
    }
}

/// The parent of `pid` from /proc, for processes forked before the listener started.
fn ppid(pid: u32) -> u32 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

pub fn run(out: &str) -> Result<(), String> {
    let fd = subscribe()?;
    let mut file = fs::File::create(out).map_err(|e| format!("{out}: {e}"))?;
    // fork time and parent of every process forked since (threads are not processes)
    let mut forks: HashMap<u32, (u64, u32)> = HashMap::new();
    // comm of a parent, cached: most execs on a busy machine are not containerd's
    let mut comms: HashMap<u32, String> = HashMap::new();
    // containerd's descendants seen so far
    let mut traced: HashSet<u32> = HashSet::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: recv into a buffer this function owns, at most its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOBUFS) {
                writeln!(file, "# lost events (queue overflow)").ok();
                continue;
            }
            return Err(format!("recv: {e}"));
        }
        let b = &buf[..n as usize];
        let (what, ts) = (u32_at(b, EV), u64_at(b, EV + 8));
        let d = EV + 16;
        let mut line = None;
        match what {
            PROC_EVENT_FORK => {
                let (parent, child_pid, child) =
                    (u32_at(b, d + 4), u32_at(b, d + 8), u32_at(b, d + 12));
                if child_pid == child {
                    forks.insert(child, (ts, parent));
                    // a plugin's child that does not exec (cnikit's deferred socket closer)
                    // still runs beside what containerd does next: its exit goes on record
                    if traced.contains(&parent) && !traced.contains(&child) {
                        traced.insert(child);
                        line = Some(format!("F {ts} {child} {parent}"));
                    }
                }
            }
            PROC_EVENT_EXEC => {
                let pid = u32_at(b, d + 4);
                let (fork_ts, parent) = forks.get(&pid).copied().unwrap_or((0, 0));
                let parent = if parent == 0 { ppid(pid) } else { parent };
                let pcomm = comms.entry(parent).or_insert_with(|| comm(parent)).clone();
                if traced.contains(&parent)
                    || traced.contains(&pid)
                    || pcomm.starts_with("containerd")
                {
                    if let Some((args, cmd)) = describe(pid) {
                        traced.insert(pid);
                        line = Some(format!(
                            "E {ts} {pid} {parent} {fork_ts} {pcomm} {cmd} {args}"
                        ));
                    }
                }
            }
            PROC_EVENT_EXIT => {
                let (pid, tgid, code) = (u32_at(b, d), u32_at(b, d + 4), u32_at(b, d + 8));
                if pid == tgid {
                    forks.remove(&pid);
                    comms.remove(&pid);
                    if traced.remove(&pid) {
                        line = Some(format!("X {ts} {pid} {code} {}", schedstat(pid)));
                    }
                } else if comms.entry(tgid).or_insert_with(|| comm(tgid)) == "containerd" {
                    line = Some(format!("T {ts} {pid} {tgid}"));
                }
            }
            _ => {}
        }
        if let Some(l) = line {
            // one write per line, unbuffered: the listener ends by SIGTERM
            file.write_all(format!("{l}\n").as_bytes())
                .map_err(|e| format!("{out}: {e}"))?;
        }
    }
}
