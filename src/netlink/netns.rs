//! Network namespace handles and "run this closure inside that netns".
//!
//! Network namespaces are per *thread* in Linux: `setns(CLONE_NEWNET)` only moves
//! the calling thread. cnikit plugins are single threaded, so switching the one
//! thread and switching it back is safe; a multi-threaded caller must make sure
//! nothing else runs on the thread meanwhile (which `run` guarantees since it
//! is synchronous). The original namespace is remembered through
//! `/proc/thread-self/ns/net` (not `/proc/self`, which names the main thread).
use super::{Error, ErrorKind, Result};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How long [`NetNs::lock_exclusive`] waits for another holder.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// An open network namespace (an nsfs file descriptor) and the path it came from.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
    path: PathBuf,
}

impl NetNs {
    /// Opens a netns path such as `/run/netns/x` or `/proc/<pid>/ns/net`.
    /// A missing path, or a file that is not a network namespace (e.g. a
    /// `/run/netns` entry whose bind mount is gone), is `ErrorKind::NetnsNotFound`.
    pub fn open(path: impl AsRef<Path>) -> Result<NetNs> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| open_error(path, &e))?;
        let ns = NetNs {
            fd: OwnedFd::from(file),
            path: path.to_path_buf(),
        };
        ns.check_is_netns()?;
        Ok(ns)
    }

    /// The namespace the calling thread is in right now.
    pub fn current() -> Result<NetNs> {
        NetNs::open(THREAD_NETNS)
    }

    /// The identity (nsfs inode) of the calling thread's namespace: two
    /// threads or processes are in the same namespace when their ids match.
    pub fn current_id() -> Result<u64> {
        std::fs::metadata(THREAD_NETNS)
            .map(|m| m.ino())
            .map_err(|e| Error::io("read the current network namespace", &e))
    }

    /// This namespace's identity, comparable with [`NetNs::current_id`].
    pub fn id(&self) -> Result<u64> {
        // SAFETY: fstat of a descriptor we own, into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(self.as_raw_fd(), &mut st) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::io(
                &format!("read network namespace {}", self.display()),
                &e,
            ));
        }
        Ok(st.st_ino)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Runs `f` with the calling thread inside this namespace and always switches
    /// back afterwards (also when `f` panics, via a drop guard). The outer
    /// `Result` only reports entering / leaving the namespace; `f`'s own result
    /// is returned untouched. Sockets and `/proc/sys/net` files opened inside `f`
    /// stay bound to this namespace after `run` returns.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        let origin = NetNs::current()?;
        setns(self.as_raw_fd())
            .map_err(|e| Error::io(&format!("enter network namespace {}", self.display()), &e))?;
        let guard = Restore {
            origin: &origin,
            armed: true,
        };
        let out = f();
        guard.finish()?;
        Ok(out)
    }

    /// Waits for, then holds, an exclusive `flock` on the namespace file until this
    /// handle is dropped: plugins that read, then change a namespace's state (sbr picking
    /// a free routing table) take turns, as the reference's lock on the netns path makes
    /// them. The wait is bounded: anyone who can open the file can take the lock, and a
    /// plugin must not hang the runtime behind them.
    pub fn lock_exclusive(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(self.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            let what = format!("lock network namespace {}", self.display());
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(Error::io(&what, &e));
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Other,
                    format!("{what}: another process has held it for {LOCK_WAIT:?}"),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    fn display(&self) -> String {
        self.path.display().to_string()
    }

    /// NS_GET_NSTYPE (Linux 4.11+) answers CLONE_NEWNET only for a netns; any
    /// other file fails with ENOTTY or answers another type.
    fn check_is_netns(&self) -> Result<()> {
        // SAFETY: ioctl on an fd we own; NS_GET_NSTYPE takes no argument.
        let kind = unsafe { libc::ioctl(self.as_raw_fd(), libc::NS_GET_NSTYPE) };
        if kind == libc::CLONE_NEWNET {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::NetnsNotFound,
            format!("{} is not a network namespace", self.display()),
        ))
    }
}

impl AsRawFd for NetNs {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn open_error(path: &Path, err: &io::Error) -> Error {
    if err.kind() == io::ErrorKind::NotFound {
        let mut e = Error::new(
            ErrorKind::NetnsNotFound,
            format!("network namespace {} does not exist", path.display()),
        );
        e.errno = err.raw_os_error();
        return e;
    }
    Error::io(&format!("open network namespace {}", path.display()), err)
}

fn setns(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain syscall on a valid nsfs fd; only affects this thread.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Switches the thread back to `origin`; armed until `finish` reports the result.
struct Restore<'a> {
    origin: &'a NetNs,
    armed: bool,
}

impl Restore<'_> {
    fn finish(mut self) -> Result<()> {
        self.armed = false;
        setns(self.origin.as_raw_fd())
            .map_err(|e| Error::io("return to the original network namespace", &e))
    }
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        // Only reached when `f` unwound: nothing to report to, but the thread
        // must not stay in the container's namespace.
        if self.armed {
            let _ = setns(self.origin.as_raw_fd());
        }
    }
}
