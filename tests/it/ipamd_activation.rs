//! The ipamd daemon under a service manager: socket activation (`LISTEN_FDS`,
//! with `systemd-socket-activate` standing in for the shipped `ipamd.socket`)
//! and readiness (`READY=1` on `NOTIFY_SOCKET`), and the first pod on a fresh
//! node, whose data directory does not exist until the activated daemon makes it.

use crate::support::*;
use serde_json::{json, Value};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills the process (and so the daemon it started) when the test ends.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn conf(network: &str, data: &Path, socket: &Path, subnet: &str) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": network, "type": "ipamd",
        "ipam": {"type": "ipamd", "dataDir": data, "socket": socket,
                 "ranges": [[{"subnet": subnet}]]},
    })
}

/// `systemd-socket-activate` listening on `socket`: it starts the daemon with
/// `LISTEN_FDS=1` when the first client connects, as systemd's socket unit does.
fn socket_activated(env: &TestEnv, socket: &Path, data: &Path) -> Reaper {
    let log = std::fs::File::create(env.dir("logs").join("activate.log")).unwrap();
    let child = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(socket)
        .arg(cnikit_exe())
        .args(["ipamd", "daemon", "--log-level", "info", "--data-dir"])
        .arg(data)
        // Where the daemon would bind without activation: it must not.
        .arg("--socket")
        .arg(env.dir("unused").join("own.sock"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("systemd-socket-activate (package systemd)");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !socket.exists() {
        assert!(std::time::Instant::now() < deadline, "no listening socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    Reaper(child)
}

/// Proves: on a node whose data directory does not exist yet, the very first
/// ADD through a socket-activated daemon succeeds (served by the daemon, not
/// the fallback), the daemon uses the passed socket and binds none of its
/// own, and later ADD/DEL go through it too.
#[test]
fn first_add_on_a_fresh_node_under_socket_activation() {
    let env = TestEnv::new("ipamd_first_contact");
    let root = env.dir("node");
    let data = root.join("var-lib-cni-ipamd");
    let socket = root.join("ipamd.sock");
    assert!(!data.exists());
    let _activator = socket_activated(&env, &socket, &data);
    let subnet = format!("{}/24", env.subnets().v4_addr(0));
    let c = conf("firstnet", &data, &socket, &subnet);
    let ns = env.netns();
    let pods = ["pod-1", "pod-2"].map(|id| env.attachment("ipamd", id, &ns, &c));
    for pod in &pods {
        let r = pod.add();
        assert_eq!(r["ips"].as_array().map(Vec::len), Some(1), "{r}");
    }
    assert!(data.is_dir(), "the daemon created its data dir");
    assert_eq!(
        ipamd_daemon_allocations(&c["ipam"]),
        2,
        "both ADDs were served by the activated daemon"
    );
    assert!(
        !env.dir("unused").join("own.sock").exists(),
        "an activated daemon must not bind a socket of its own"
    );
    for pod in &pods {
        pod.del();
    }
    assert_eq!(env.lease_count(&c["ipam"], "firstnet"), 0);
}

/// Proves: a config naming a data directory that is not the daemon's is still
/// refused with 7 naming both, also when that directory does not exist (the
/// first-contact allowance applies only to the daemon's own directory).
#[test]
fn foreign_missing_data_dir_is_still_refused() {
    let env = TestEnv::new("ipamd_foreign_dir");
    let root = env.dir("node");
    let (data, other) = (root.join("daemon-data"), root.join("other-data"));
    let socket = root.join("ipamd.sock");
    let _activator = socket_activated(&env, &socket, &data);
    let subnet = format!("{}/24", env.subnets().v4_addr(0));
    let c = conf("foreign", &other, &socket, &subnet);
    let err = env
        .attachment("ipamd", "pod-x", &env.netns(), &c)
        .try_add()
        .expect_err(7, &["other-data", "daemon-data"]);
    assert!(err.msg.contains("is not the directory"), "{err:?}");
}

/// Proves: the daemon reports `READY=1` on `NOTIFY_SOCKET` (Type=notify), and
/// only once it answers requests.
#[test]
fn daemon_notifies_readiness() {
    let env = TestEnv::new("ipamd_notify");
    let root = env.dir("node");
    let notify_path = root.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let socket = root.join("ipamd.sock");
    let child = Command::new(cnikit_exe())
        .args(["ipamd", "daemon", "--log-level", "warn", "--socket"])
        .arg(&socket)
        .arg("--data-dir")
        .arg(root.join("data"))
        .env("NOTIFY_SOCKET", &notify_path)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let _daemon = Reaper(child);
    let mut buf = [0u8; 256];
    let n = notify
        .recv(&mut buf)
        .expect("a READY=1 datagram within 10 s");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    assert!(
        ipamd_get(&socket, "/healthz").is_some(),
        "ready means answering"
    );
}
