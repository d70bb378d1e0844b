//! The two bits of systemd integration, done by hand rather than through libsystemd:
//! socket activation (`LISTEN_FDS`/`LISTEN_PID`) and readiness (`READY=1` to `NOTIFY_SOCKET`).

use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener};

use crate::Error;

/// First passed descriptor (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

/// The listening socket systemd passed us, if we were socket-activated.
pub(crate) fn listen_fd() -> Result<Option<UnixListener>, Error> {
    let pid_ok = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(0);
    if !pid_ok || count < 1 {
        return Ok(None);
    }
    if count > 1 {
        return Err(Error::invalid(format!(
            "socket activation passed {count} sockets; ipamd.socket must have exactly one ListenStream="
        )));
    }
    let fd = LISTEN_FDS_START;
    // SAFETY: fcntl/getsockopt on a descriptor number we only inspect; errors are checked.
    unsafe {
        let mut ty: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let rc = libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        );
        if rc != 0 || ty != libc::SOCK_STREAM {
            return Err(Error::invalid(
                "socket activation: fd 3 is not a stream socket (use ListenStream=)",
            ));
        }
        // Not inherited by anything we might spawn.
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    // SAFETY: systemd hands us ownership of fd 3 for the life of the process.
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    Ok(Some(listener))
}

/// Send a state line to the service manager; no-op when not run by systemd.
pub(crate) fn notify(state: &str) {
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET") {
        if let Err(e) = notify_to(&path, state) {
            crate::log_at!(crate::log::Level::Warn, "sd_notify {state:?}: {e}");
        }
    }
}

/// `sd_notify` by hand: one datagram to a path, or to an abstract socket for `@name`.
fn notify_to(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_sends_one_datagram() {
        let d = crate::testutil::temp_dir("notify");
        let p = d.path().join("notify.sock");
        let rx = UnixDatagram::bind(&p).unwrap();
        notify_to(p.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let name = format!("ipamd-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
