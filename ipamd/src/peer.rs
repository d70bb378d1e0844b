//! Who is on the other end of a connection, from the kernel, captured at connect time so it
//! cannot be spoofed by what the client writes.
//!
//! - uid, gid, groups: SO_PEERCRED, SO_PEERGROUPS.
//! - the process: a pidfd, from SO_PEERPIDFD (Linux 6.5+; it names the process that
//!   connected, so pid reuse cannot swap it) or else `pidfd_open` of SO_PEERCRED's pid right
//!   after accept. Its effective capabilities (`/proc/<pid>/status` CapEff) and its network
//!   and user namespaces (`/proc/<pid>/ns/{net,user}`, device and inode) are read through
//!   `/proc/<pid>`, then the pidfd must still be alive (not readable): had the process
//!   exited, its pid could have been given to another one whose `/proc` entry was read
//!   instead. What cannot be read for certain is left `None`/false, which is refused.
//!
//! With the `pidfd_open` fallback one window remains: the peer exits (keeping the
//! connection open in a child) and its pid is recycled between connect and accept. Kernels
//! with SO_PEERPIDFD close it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

use tokio::net::UnixStream;

/// SO_PEERGROUPS (Linux 4.13+) and SO_PEERPIDFD (6.5+): not exported by every libc version.
#[cfg(target_arch = "sparc64")]
const SO_PEERGROUPS: libc::c_int = 0x003d;
#[cfg(not(target_arch = "sparc64"))]
const SO_PEERGROUPS: libc::c_int = 59;
#[cfg(target_arch = "sparc64")]
const SO_PEERPIDFD: libc::c_int = 0x0056;
#[cfg(not(target_arch = "sparc64"))]
const SO_PEERPIDFD: libc::c_int = 77;

/// Bit of CAP_NET_ADMIN in a capability set.
const CAP_NET_ADMIN: u32 = 12;

/// A namespace's identity: the device and inode of its nsfs file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

impl NsId {
    fn of(path: &str) -> io::Result<NsId> {
        let m = std::fs::metadata(path)?;
        Ok(NsId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// The network namespace of the calling thread (where a netlink socket it opens talks).
    pub fn this_thread_net() -> io::Result<NsId> {
        NsId::of("/proc/thread-self/ns/net")
    }

    /// The user namespace of this process.
    pub fn own_user() -> io::Result<NsId> {
        NsId::of("/proc/self/ns/user")
    }
}

#[derive(Debug, Clone)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The peer's pid in the daemon's pid namespace, when its process could be pinned.
    pub pid: Option<u32>,
    /// CAP_NET_ADMIN in the peer's effective set, and the peer in the daemon's user
    /// namespace (capabilities held in another user namespace do not reach the daemon's
    /// network namespace). False when unknown.
    pub cap_net_admin: bool,
    /// The peer's network namespace at connect time; None when unknown.
    pub netns: Option<NsId>,
}

impl Peer {
    /// A peer with `uid` as user and group, no supplementary groups, a known
    /// process (pid 1) and an unknown netns: a caller as the tests of this
    /// crate and of the crates hosting services describe one to a permission
    /// check.
    pub fn with_uid(uid: u32, cap_net_admin: bool) -> Peer {
        Peer {
            uid,
            gid: uid,
            groups: vec![],
            pid: Some(1),
            cap_net_admin,
            netns: None,
        }
    }

    pub(crate) fn of(stream: &UnixStream) -> io::Result<Peer> {
        let cred = stream.peer_cred()?;
        let fd = stream.as_raw_fd();
        let mut peer = Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            // Supplementary groups are best effort: on an old kernel only the primary group
            // counts.
            groups: peer_groups(fd).unwrap_or_default(),
            pid: None,
            cap_net_admin: false,
            netns: None,
        };
        // A pid of 0 or none: the peer is in a pid namespace the daemon cannot see into.
        let pid = cred.pid().filter(|&p| p > 0).map(|p| p as u32);
        if let Ok(p) = Process::of(fd, pid) {
            peer.pid = Some(p.pid);
            peer.cap_net_admin = p.cap_net_admin;
            peer.netns = Some(p.netns);
        }
        Ok(peer)
    }

    /// The network namespace of the calling thread, to compare with `netns`.
    pub fn netns_of_this_thread() -> io::Result<NsId> {
        NsId::this_thread_net()
    }

    /// root, or a member (primary or supplementary) of the configured group.
    pub fn allowed(&self, allowed_gid: Option<u32>) -> bool {
        self.uid == 0 || allowed_gid.is_some_and(|g| self.gid == g || self.groups.contains(&g))
    }

    /// root with CAP_NET_ADMIN: someone who could change the host's network and leases
    /// without the daemon.
    pub fn net_admin(&self) -> bool {
        self.uid == 0 && self.cap_net_admin
    }
}

/// What `/proc` says about a pinned peer process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Process {
    pub pid: u32,
    pub cap_net_admin: bool,
    pub netns: NsId,
}

impl Process {
    /// The process at the other end of socket `fd` (`pid`: SO_PEERCRED's).
    pub(crate) fn of(fd: RawFd, pid: Option<u32>) -> io::Result<Process> {
        // SO_PEERCRED's pid and SO_PEERPIDFD's process are both the connecting one, so while
        // the pidfd's process lives (checked after reading) that pid is still its pid.
        let (pidfd, pid) = match (peer_pidfd(fd), pid) {
            (Ok(pidfd), Some(pid)) => (pidfd, pid),
            (Ok(pidfd), None) => {
                let pid = pidfd_pid(&pidfd)?;
                (pidfd, pid)
            }
            (Err(_), Some(pid)) => (pidfd_open(pid)?, pid),
            (Err(e), None) => return Err(e),
        };
        Process::read(&pidfd, pid)
    }

    /// Reads `/proc/<pid>` of the process `pidfd` pins, and checks afterwards that it was
    /// that process's.
    pub(crate) fn read(pidfd: &OwnedFd, pid: u32) -> io::Result<Process> {
        // capget rather than parsing /proc/<pid>/status: one syscall on every connection.
        let cap_eff = effective_caps(pid)?;
        let netns = NsId::of(&format!("/proc/{pid}/ns/net"))?;
        let userns = NsId::of(&format!("/proc/{pid}/ns/user"))?;
        if !alive(pidfd)? {
            return Err(io::Error::other("the peer exited before it could be read"));
        }
        let same_userns = own_userns().is_some_and(|own| own == userns);
        Ok(Process {
            pid,
            cap_net_admin: same_userns && cap_eff & (1 << CAP_NET_ADMIN) != 0,
            netns,
        })
    }
}

/// This process's user namespace; it never changes (the daemon does not unshare), so it is
/// read once rather than on every connection.
fn own_userns() -> Option<NsId> {
    static OWN: std::sync::OnceLock<Option<NsId>> = std::sync::OnceLock::new();
    *OWN.get_or_init(|| NsId::own_user().ok())
}

/// The effective capability set of process `pid` (capget, version 3: 64 bits).
fn effective_caps(pid: u32) -> io::Result<u64> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: pid as libc::c_int,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: a v3 header and the two data structs v3 fills.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// SO_PEERPIDFD: a pidfd of the process that connected.
fn peer_pidfd(fd: RawFd) -> io::Result<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the buffer is one c_int, `len` says so.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel gave us this new descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(pidfd) })
}

pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative result is a new descriptor we own.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: see above.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// The pid (in our pid namespace) of the process a pidfd names, from its fdinfo.
fn pidfd_pid(pidfd: &OwnedFd) -> io::Result<u32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
    let pid: i64 = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no Pid in the pidfd's fdinfo"))?;
    // -1: exited; 0: not in our pid namespace.
    u32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| io::Error::other("the peer's process is gone or out of sight"))
}

/// A pidfd turns readable when its process exits.
fn alive(pidfd: &OwnedFd) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc == 0)
}

fn peer_groups(fd: RawFd) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: the buffer is valid for `len` bytes; the kernel writes at most that much.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        // ERANGE: `len` now says how much room is needed.
        if err.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= 65536 {
            groups.resize(n, 0);
            continue;
        }
        return Err(err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{skip_unless_root, temp_dir};
    use std::os::unix::net::UnixListener;

    fn peer(uid: u32, cap_net_admin: bool) -> Peer {
        Peer::with_uid(uid, cap_net_admin)
    }

    #[test]
    fn allowed_rules() {
        let p = |uid, gid, groups: &[u32]| Peer {
            groups: groups.to_vec(),
            gid,
            ..peer(uid, false)
        };
        assert!(p(0, 0, &[]).allowed(None));
        assert!(!p(1000, 1000, &[]).allowed(None));
        assert!(p(1000, 500, &[]).allowed(Some(500)));
        assert!(p(1000, 1000, &[27, 500]).allowed(Some(500)));
        assert!(!p(1000, 1000, &[27]).allowed(Some(500)));
    }

    #[test]
    fn net_admin_takes_root_and_the_capability() {
        assert!(peer(0, true).net_admin());
        assert!(!peer(0, false).net_admin());
        assert!(!peer(1000, true).net_admin());
    }

    /// What the daemon learns of a child that connects after `prepare` (raw syscalls only:
    /// it runs between fork and exit). The child keeps the connection open until the
    /// parent has looked.
    fn child_seen(prepare: fn() -> bool) -> io::Result<Process> {
        let dir = temp_dir("peer");
        let path = dir.path().join("peer.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        use std::os::unix::ffi::OsStrExt;
        for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
            *d = *s as libc::c_char;
        }
        // SAFETY: the child makes raw syscalls only and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            unsafe {
                if !prepare() {
                    libc::_exit(10);
                }
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                    libc::_exit(11);
                }
                let mut b = [0u8; 1];
                libc::read(fd, b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let (stream, _) = listener.accept().unwrap();
        let seen = Process::of(stream.as_raw_fd(), Some(pid as u32));
        drop(stream);
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        seen
    }

    #[test]
    fn a_root_peer_with_the_capability_in_our_netns_is_seen_so() {
        skip_unless_root!("for a peer with CAP_NET_ADMIN");
        let p = child_seen(|| true).unwrap();
        assert!(p.cap_net_admin);
        assert_eq!(p.netns, NsId::this_thread_net().unwrap());
    }

    #[test]
    fn capability_less_root_is_seen_without_cap_net_admin() {
        skip_unless_root!("for a root peer to drop its capabilities");
        fn drop_effective() -> bool {
            #[repr(C)]
            struct Header {
                version: u32,
                pid: libc::c_int,
            }
            #[repr(C)]
            #[derive(Clone, Copy)]
            struct Data {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            let hdr = Header {
                version: 0x2008_0522,
                pid: 0,
            };
            let none = [Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            }; 2];
            // SAFETY: capset with a version-3 header and two data words.
            unsafe { libc::syscall(libc::SYS_capset, &hdr, none.as_ptr()) == 0 }
        }
        let p = child_seen(drop_effective).unwrap();
        assert!(!p.cap_net_admin, "{p:?}");
    }

    #[test]
    fn root_in_another_netns_is_seen_there() {
        skip_unless_root!("to unshare a network namespace");
        // SAFETY: unshare in the forked child only.
        let p = child_seen(|| unsafe { libc::unshare(libc::CLONE_NEWNET) == 0 }).unwrap();
        assert_ne!(p.netns, NsId::this_thread_net().unwrap());
        assert!(p.cap_net_admin);
    }

    #[test]
    fn a_process_that_exited_is_not_read() {
        // SAFETY: the child exits at once; it stays a zombie until waited for.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            unsafe { libc::_exit(0) };
        }
        let pidfd = pidfd_open(pid as u32).unwrap();
        // Until the child is gone, its pidfd turns readable; then /proc/<pid> could name any
        // process that got the pid again.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits without reaping, so the pid stays taken.
        unsafe {
            libc::waitid(
                libc::P_PID,
                pid as u32,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        assert!(Process::read(&pidfd, pid as u32).is_err());
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
}
