//! Idle connections cannot keep other clients waiting.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;

use crate::server::MAX_CONNECTIONS;
use crate::testutil::temp_dir;

use super::daemon::{get, start};

/// Enough fds for both ends of more connections than the daemon serves at once.
fn raise_fd_limit(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid rlimit to fill and then pass back.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        if r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        }
    }
}

fn still_open(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 64];
    matches!(s.read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock)
}

#[test]
fn a_new_client_is_served_while_more_idle_connections_than_the_cap_are_open() {
    raise_fd_limit(4 * MAX_CONNECTIONS as u64 + 1024);
    let d = temp_dir("idle-conns");
    let sock = d.path().join("ipamd.sock");
    let h = start(d.path());
    let extra = 76;
    let mut idle = Vec::new();
    for i in 0..MAX_CONNECTIONS + extra {
        let mut s = UnixStream::connect(&sock).unwrap();
        if i % 2 == 1 {
            // Part of a request head, never finished (slowloris).
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
        }
        s.set_nonblocking(true).unwrap();
        idle.push(s);
    }
    // Served at once (the daemon's head timeout is 5 s; `get` allows 2 s to connect and
    // 5 s for the answer), by closing idle connections rather than waiting them out.
    let (code, body) = get(&sock, "/healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let open = idle.iter_mut().map(still_open).filter(|o| *o).count();
    // Only the longest-idle ones made room: the rest are still open, so the answer did
    // not come from waiting for them to time out.
    assert!(
        open >= MAX_CONNECTIONS - extra - 8,
        "{open} of {} idle connections still open",
        idle.len()
    );
    assert!(
        !still_open(&mut idle[0]),
        "the oldest idle connection was closed"
    );
    drop(idle);
    h.stop().unwrap();
}
