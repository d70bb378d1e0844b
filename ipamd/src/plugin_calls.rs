//! What a plugin process tells the daemon about its call once it has answered the
//! runtime: plugin type, verb, network, CNI result code and duration, one datagram on a
//! unix socket beside the daemon's (`plugin-calls.sock`), for `/metrics`.
//!
//! Why a datagram: a plugin lives for one call, and its runtime waits for it to exit. One
//! non-blocking `sendto` costs a few microseconds and never waits: no daemon (or an older
//! one, without the socket) is ENOENT or ECONNREFUSED, a full receive queue EAGAIN, and
//! the report is dropped. Only root reaches the socket (mode 0600, or 0660 to the daemon's
//! allowed group, as its API socket); a report is data for counters only, never trusted
//! for anything else, and its labels are checked and their number bounded.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The socket's name, in the directory of the daemon's API socket.
pub const SOCKET_NAME: &str = "plugin-calls.sock";
/// A report is far smaller; anything longer is not one.
pub const MAX_REPORT: usize = 512;

/// One plugin call, as the plugin saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallReport {
    /// The plugin's type (`bridge`, `portmap`, …).
    pub plugin: String,
    /// ADD, DEL, CHECK, STATUS, GC or VERSION.
    pub verb: String,
    /// The network's name (empty when the call had none, e.g. VERSION).
    pub network: String,
    /// 0 for success, else the CNI error code printed.
    pub code: u32,
    /// From the process's start to its answer written, microseconds.
    pub micros: u64,
}

/// Where the daemon whose API socket is `daemon_socket` receives reports.
pub fn socket_beside(daemon_socket: &Path) -> PathBuf {
    daemon_socket.with_file_name(SOCKET_NAME)
}

/// Send `report` to the daemon at `daemon_socket`, if one listens; never waits, never
/// fails (a report that cannot go is dropped).
pub fn send(daemon_socket: &Path, report: &CallReport) {
    let Ok(bytes) = serde_json::to_vec(report) else {
        return;
    };
    if bytes.len() > MAX_REPORT {
        return;
    }
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    if sock.set_nonblocking(true).is_ok() {
        let _ = sock.send_to(&bytes, socket_beside(daemon_socket));
    }
}

/// A report read off the socket, if it is one with labels fit for metrics.
pub(crate) fn decode(datagram: &[u8]) -> Option<CallReport> {
    let r: CallReport = serde_json::from_slice(datagram).ok()?;
    let label = |s: &str, max: usize| {
        s.len() <= max
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    let verbs = ["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION"];
    let fits = !r.plugin.is_empty()
        && label(&r.plugin, 32)
        && verbs.contains(&r.verb.as_str())
        && label(&r.network, 128)
        && r.code < 1000;
    fits.then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> CallReport {
        CallReport {
            plugin: "bridge".into(),
            verb: "ADD".into(),
            network: "pods".into(),
            code: 0,
            micros: 1500,
        }
    }

    #[test]
    fn reports_round_trip_and_odd_labels_are_refused() {
        let bytes = serde_json::to_vec(&report()).unwrap();
        assert_eq!(decode(&bytes), Some(report()));
        let bad = |f: fn(&mut CallReport)| {
            let mut r = report();
            f(&mut r);
            decode(&serde_json::to_vec(&r).unwrap())
        };
        assert_eq!(bad(|r| r.plugin = "a\"b".into()), None);
        assert_eq!(bad(|r| r.verb = "FOO".into()), None);
        assert_eq!(bad(|r| r.network = "x".repeat(200)), None);
        assert_eq!(decode(b"not json"), None);
    }

    #[test]
    fn sending_without_a_daemon_costs_nothing_and_fails_nothing() {
        let dir = tempfile::tempdir().unwrap();
        send(&dir.path().join("ipamd.sock"), &report());
        let receiver = UnixDatagram::bind(dir.path().join(SOCKET_NAME)).unwrap();
        send(&dir.path().join("ipamd.sock"), &report());
        let mut buf = [0u8; MAX_REPORT];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(decode(&buf[..n]), Some(report()));
    }
}
