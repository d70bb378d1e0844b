//! Sockets whose close must not hold up a plugin's exit: at the end of a
//! plugin call they are handed to a short-lived detached child process, which
//! closes them after the plugin has exited.
//!
//! Why: releasing the last reference to a NETLINK_NETFILTER socket runs the
//! nftables `NETLINK_URELEASE` notifier (`netlink_release` →
//! `nft_rcv_nl_event`), which takes the netns' nftables commit mutex and
//! flushes the transaction destroy work (`nf_tables_trans_destroy_flush_work`).
//! That work frees what earlier batches deleted after `synchronize_rcu()`, so
//! whenever a batch of the last few milliseconds deleted anything, the close
//! sleeps a whole RCU grace period (≈10 ms on 2 CPUs with HZ=250; 6.14+ wait
//! for their own netns' work, 6.1 for every netns'). A process's last
//! reference goes at exit at the latest, and a runtime waits for the plugin's
//! exit, so under churn every plugin with firewall work paid one grace period,
//! most of them one after the other on the commit mutex.
//!
//! How: the process that runs a plugin call makes one [`DeferredClose`] and
//! gives it to the firewall's sockets of that call (through the plugin
//! registry), which hand it their descriptors instead of closing them. After
//! the reply is printed, [`DeferredClose::hand_off`] forks a child that
//! closes every other descriptor first (stdin, stdout and stderr are the
//! runtime's pipes: it reads them to EOF), waits until this process has
//! dropped its own references (a pipe's EOF; else the last reference, and the
//! wait, could still be ours), waits out one grace period of its own
//! (`membarrier`, without the commit mutex: the release then more often finds
//! the destroy work done and holds the mutex, which every nftables writer and
//! the RTNL of a link deletion may be waiting for, only briefly), closes the
//! sockets and exits. Nobody waits for it: the plugin exits at once, and the
//! orphan is reaped by init or the runtime's subreaper, as every orphan of a
//! runtime's child is. When the fork fails the sockets are closed here, as
//! before. A value, not a process-wide switch: the daemon and the admin
//! commands make none, so their sockets close when dropped.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// `MEMBARRIER_CMD_GLOBAL`: returns after an RCU grace period (`synchronize_rcu`).
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;

/// Descriptors whose close waits until the plugin call's reply is out (see
/// the module comment). Clones share what is kept: the runner of the call
/// holds one to hand off, the sockets it was given to hold the others.
#[derive(Clone, Default)]
pub struct DeferredClose {
    kept: Arc<Mutex<Vec<OwnedFd>>>,
}

impl std::fmt::Debug for DeferredClose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredClose")
            .field("kept", &self.lock_kept().len())
            .finish()
    }
}

impl DeferredClose {
    /// Nothing kept yet. For a process that calls [`hand_off`](Self::hand_off)
    /// before it exits (the runner of a plugin call): what is deferred stays
    /// open until then.
    pub fn new() -> DeferredClose {
        DeferredClose::default()
    }

    /// Keeps `fd` open until [`hand_off`](Self::hand_off), whose child closes it.
    pub(crate) fn defer(&self, fd: OwnedFd) {
        self.lock_kept().push(fd);
    }

    /// Hands what was kept to a detached child that closes it; the last thing
    /// a plugin process does before it exits, after its reply is written.
    pub fn hand_off(self) {
        drop(fork_closer(self.take_kept()));
    }

    /// How many descriptors wait for the hand-off.
    #[cfg(test)]
    pub(crate) fn deferred(&self) -> usize {
        self.lock_kept().len()
    }

    fn take_kept(&self) -> Vec<OwnedFd> {
        std::mem::take(&mut *self.lock_kept())
    }

    fn lock_kept(&self) -> MutexGuard<'_, Vec<OwnedFd>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A child process holding descriptors handed to it; it closes them, and exits,
/// once this is dropped.
struct Closer {
    /// The child, for the tests to watch.
    #[cfg(test)]
    pid: libc::pid_t,
    /// The write end of the pipe the child waits on.
    _gate: OwnedFd,
}

/// Forks the child that closes `fds` (see the module comment); None when there
/// is nothing to hand off or no child could be made, and then `fds` are closed here.
fn fork_closer(fds: Vec<OwnedFd>) -> Option<Closer> {
    if fds.is_empty() {
        return None;
    }
    let mut ends = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: pipe2 succeeded, both descriptors are ours alone.
    let (wait_end, gate) =
        unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    let sockets: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut keep = sockets.clone();
    keep.push(wait_end.as_raw_fd());
    keep.sort_unstable();
    // SAFETY: the child only makes async-signal-safe calls on memory prepared
    // above (no allocation, no lock) and leaves through _exit.
    match unsafe { libc::fork() } {
        0 => unsafe { child(&keep, wait_end.as_raw_fd(), &sockets) },
        -1 => None,
        _pid => {
            // Ours go before the gate: the child closes only after the gate is
            // gone, so its close is the last reference and the release runs there.
            drop(fds);
            Some(Closer {
                #[cfg(test)]
                pid: _pid,
                _gate: gate,
            })
        }
    }
}

/// The detached child: see the module comment.
///
/// # Safety
/// Only right after fork: it closes every descriptor but `keep`.
unsafe fn child(keep: &[RawFd], wait_end: RawFd, sockets: &[RawFd]) -> ! {
    close_all_but(keep);
    // What ps and perf show for it, rather than the plugin's name.
    libc::prctl(libc::PR_SET_NAME, c"cnikit-linger".as_ptr());
    let mut byte = 0u8;
    while libc::read(wait_end, (&raw mut byte).cast(), 1) < 0
        && *libc::__errno_location() == libc::EINTR
    {}
    libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0);
    for &fd in sockets {
        libc::close(fd);
    }
    libc::_exit(0)
}

/// Closes every descriptor not in `keep` (sorted): close_range over the gaps,
/// or one by one below 1024 where the kernel has no close_range (before 5.9).
unsafe fn close_all_but(keep: &[RawFd]) {
    let mut from: libc::c_uint = 0;
    for &fd in keep.iter().chain(std::iter::once(&RawFd::MAX)) {
        let fd = fd as libc::c_uint;
        if fd > from && libc::syscall(libc::SYS_close_range, from, fd - 1, 0) != 0 {
            for old in from..fd.min(1024) {
                libc::close(old as RawFd);
            }
        }
        from = fd.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Read;

    fn pipe() -> (File, OwnedFd) {
        let mut ends = [0; 2];
        // SAFETY: as in fork_closer.
        assert_eq!(
            unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) },
            0
        );
        // SAFETY: fresh descriptors, ours alone.
        unsafe { (File::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) }
    }

    /// Whether reading `r` reaches EOF (no process holds the write end) within `ms`.
    fn eof(r: &mut File, ms: libc::c_int) -> bool {
        let mut p = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, ms) } != 1 {
            return false;
        }
        matches!(r.read(&mut [0; 1]), Ok(0))
    }

    /// Kills and reaps the child if the test fails before it exits by itself.
    struct Reap(libc::pid_t);

    impl Reap {
        /// Waits for the child's exit; its wait status.
        fn exit_status(self) -> libc::c_int {
            let mut status = 0;
            // SAFETY: our own child, not reaped yet.
            assert_eq!(unsafe { libc::waitpid(self.0, &mut status, 0) }, self.0);
            std::mem::forget(self);
            status
        }
    }

    impl Drop for Reap {
        fn drop(&mut self) {
            // SAFETY: our own child, not reaped yet.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, std::ptr::null_mut(), 0);
            }
        }
    }

    /// The number of descriptors process `pid` holds.
    fn held(pid: libc::pid_t) -> usize {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(Iterator::count)
            .unwrap_or(0)
    }

    /// Proves: the child holds nothing but what it was handed (a pipe standing for
    /// the runtime's stdout reaches EOF while the child still waits), it keeps what
    /// it was handed open until released and then closes it, and this process
    /// keeps no copy of it.
    #[test]
    fn the_child_holds_only_what_it_was_handed_and_closes_it_when_released() {
        let (mut handed_r, handed_w) = pipe();
        // The child inherits this one too (fork ignores O_CLOEXEC), as it does
        // the runtime's stdout pipe.
        let (mut stdout_r, stdout_w) = pipe();
        let closer = fork_closer(vec![handed_w]).expect("a child");
        let reap = Reap(closer.pid);
        drop(stdout_w);
        assert!(
            eof(&mut stdout_r, 10_000),
            "the child kept a descriptor it was not handed"
        );
        // Its last close_range may still be under way.
        for _ in 0..1000 {
            if held(closer.pid) == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            held(closer.pid),
            2,
            "the child holds the handed socket and its gate only"
        );
        assert!(
            !eof(&mut handed_r, 0),
            "the handed descriptor was closed before its release"
        );
        drop(closer);
        assert!(
            eof(&mut handed_r, 10_000),
            "the handed descriptor was never closed"
        );
        let status = reap.exit_status();
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }

    /// Proves: a descriptor given to a clone (as the firewall's sockets hold
    /// one) stays open until the hand-off, whose child closes it.
    #[test]
    fn a_deferred_descriptor_stays_open_until_the_hand_off_closes_it() {
        let (mut deferred_r, deferred_w) = pipe();
        let deferred = DeferredClose::new();
        deferred.clone().defer(deferred_w);
        assert!(
            !eof(&mut deferred_r, 0),
            "the deferred descriptor was closed before its hand-off"
        );
        // What hand_off does, with the child's pid kept to reap it.
        let closer = fork_closer(deferred.take_kept()).expect("a child");
        let reap = Reap(closer.pid);
        drop(closer);
        assert!(
            eof(&mut deferred_r, 10_000),
            "the deferred descriptor was never closed"
        );
        reap.exit_status();
        assert!(deferred.take_kept().is_empty(), "handed off twice");
    }

    #[test]
    fn nothing_to_hand_off_forks_nothing() {
        assert!(fork_closer(Vec::new()).is_none());
    }
}
