//! SO_PEERCRED: a non-root peer is refused with 403 even if the socket file lets it connect.
//! Needs root (to switch the child to uid 65534); skipped otherwise.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::daemon::{daemon_opts, store_opts};
use crate::daemon::start_with;
use crate::testutil::{skip_unless_root, temp_dir};

const NOBODY: libc::uid_t = 65534;

const LEASES: &[u8] = b"GET /v1/leases HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// Fork a child that drops to uid/gid 65534 (with `groups` as supplementary groups),
/// sends `req` and exits 0 if the status line starts with `expect`.
fn child_request(sock: &Path, groups: &[libc::gid_t], req: &[u8], expect: &[u8]) -> i32 {
    // Everything the child needs is prepared before fork: after it, only async-signal-safe
    // calls (no allocation) in the child.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(sock.as_os_str().as_bytes()) {
        *d = *s as libc::c_char;
    }
    let mut buf = [0u8; 64];
    // SAFETY: the child only makes raw syscalls and _exits.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                libc::_exit(10);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                libc::_exit(11);
            }
            if libc::write(fd, req.as_ptr().cast(), req.len()) != req.len() as isize {
                libc::_exit(12);
            }
            let mut got = 0usize;
            while got < expect.len() {
                let n = libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got);
                if n <= 0 {
                    libc::_exit(13);
                }
                got += n as usize;
            }
            libc::_exit(if buf[..expect.len()] == *expect {
                0
            } else {
                14
            });
        }
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        assert!(libc::WIFEXITED(status));
        libc::WEXITSTATUS(status)
    }
}

#[test]
fn non_root_peer_gets_403_and_allowed_group_gets_in() {
    skip_unless_root!("to act as another uid");
    let d = temp_dir("peer");
    let sock = d.path().join("ipamd.sock");
    let mut o = daemon_opts(d.path());
    o.allowed_gid = Some(4242);
    let _h = start_with(o, store_opts("boot-now")).unwrap();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    // Make the file world-writable so the kernel lets uid 65534 connect: the daemon's own
    // check is what must refuse it.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(
        child_request(&sock, &[], LEASES, b"HTTP/1.1 403"),
        0,
        "nobody was not refused"
    );
    assert_eq!(
        child_request(&sock, &[4242], LEASES, b"HTTP/1.1 200"),
        0,
        "allowed group refused"
    );
    // Reading is all the group may do: freeing a root pod's lease would let its address be
    // handed out twice.
    let gc = b"POST /v1/gc HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 32\r\n\r\n{\"network\":\"rootnet\",\"valid\":[]}";
    assert_eq!(
        child_request(&sock, &[4242], gc, b"HTTP/1.1 403"),
        0,
        "a group member changed leases"
    );
}
