//! The benchmark's own "host": a fresh network namespace and a private mount
//! namespace with a tmpfs on /run, entered before any thread exists. Every
//! bridge, veth, pod namespace, iptables/nftables rule, IPAM file and cache
//! entry lives in there, so the machine's real network is never touched and
//! everything vanishes with the process, even on SIGKILL.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Scratch space for IPAM state, caches and plugin links (on the tmpfs).
pub const STATE: &str = "/run/cnikit-bench";
/// Where pod namespaces are bind-mounted, like `ip netns add` does.
pub const NETNS_DIR: &str = "/run/netns";

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNALS: AtomicU32 = AtomicU32::new(0);

/// True once Ctrl-C was pressed: workers finish the pod at hand and stop.
pub fn stopping() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Unshare network + mount namespaces and prepare /run. Must run while the
/// process is single-threaded: namespaces are per thread, and only threads
/// started afterwards inherit them.
pub fn enter() -> Result<(), String> {
    let before = std::fs::read_link("/proc/thread-self/ns/net").map_err(|e| e.to_string())?;
    check(
        unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS) },
        "unshare",
    )?;
    let after = std::fs::read_link("/proc/thread-self/ns/net").map_err(|e| e.to_string())?;
    if before == after {
        return Err("unshare did not give us a new network namespace; refusing to run".into());
    }
    // Private propagation first, so our mounts never reach the real host.
    mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE)?;
    mount(Some("tmpfs"), "/run", Some("tmpfs"), 0)?;
    for dir in [STATE, NETNS_DIR] {
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {dir}: {e}"))?;
    }
    install_sigint();
    Ok(())
}

fn mount(
    src: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
) -> Result<(), String> {
    let c = |s: &str| std::ffi::CString::new(s).map_err(|e| e.to_string());
    let src = src.map(c).transpose()?;
    let fstype = fstype.map(c).transpose()?;
    let target_c = c(target)?;
    let rc = unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target_c.as_ptr(),
            fstype.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            std::ptr::null(),
        )
    };
    check(rc, &format!("mount {target}"))
}

fn check(rc: libc::c_int, what: &str) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what}: {}", std::io::Error::last_os_error()))
    }
}

/// First Ctrl-C: stop after the pods in flight (results so far are still
/// written). Second: leave at once; the namespaces die with the process.
fn install_sigint() {
    extern "C" fn on_sigint(_: libc::c_int) {
        STOP.store(true, Ordering::SeqCst);
        if SIGNALS.fetch_add(1, Ordering::SeqCst) >= 1 {
            unsafe { libc::_exit(130) };
        }
    }
    let handler = on_sigint as extern "C" fn(libc::c_int);
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

/// The loopback of our host namespace up (plugins and iptables expect it).
pub fn loopback_up() -> Result<(), String> {
    let mut nl = cnikit::netlink::Netlink::open().map_err(|e| e.to_string())?;
    let lo = nl
        .link_by_name("lo")
        .map_err(|e| e.to_string())?
        .ok_or("no lo")?;
    nl.set_up(lo.index).map_err(|e| e.to_string())
}
