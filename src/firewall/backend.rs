//! Where firewall requests are done, chosen once per plugin call: in this
//! process, or by the ipamd daemon when one serves them (`service.rs` says
//! why). Falling back to in-process is safe because every operation is
//! idempotent; when that happens is `ipamd::client::Daemon::send`'s policy,
//! plus one rule of ours: a daemon that cannot read a request (400) leaves it
//! to us too.
//!
//! Versions. Requests carry the protocol version of this build
//! (`ipamd::service::PROTOCOL`, a body field an older daemon ignores), so a
//! daemon older than the plugin declines what it would not do as this build
//! means it. A daemon that predates versions (cnikit 0.1.0) answers an
//! operation it does not know with 400; during an upgrade that is an older
//! daemon, not a broken request, so the plugin does the work itself rather
//! than failing the ADD or DEL. A newer daemon reads every older plugin's
//! request (a body without the field is version 1).

use super::request::Request;
use super::service::{self, Done, Envelope};
use super::{Error, ErrorKind, Result, Sockets};
use crate::netlink::NetNs;
use ipamd::client::{Daemon, Outcome};
use ipamd::log::Level;
use std::fmt;
use std::path::{Path, PathBuf};

/// Does firewall requests.
pub trait Firewall: fmt::Debug + Send + Sync {
    fn apply(&self, req: Request) -> Result<()>;
}

/// Does the work in this process, on sockets that stay open as long as it
/// lives (`socket.rs` says why).
#[derive(Debug, Default)]
pub struct InProcess {
    sockets: Sockets,
}

impl Firewall for InProcess {
    fn apply(&self, req: Request) -> Result<()> {
        req.run(&self.sockets)
    }
}

/// The daemon at `socket` when it serves the request, else in-process.
#[derive(Debug)]
pub struct ViaDaemon {
    socket: PathBuf,
    here: InProcess,
}

impl ViaDaemon {
    /// What the daemon does not serve is done here, on `sockets`.
    pub fn new(socket: &Path, sockets: Sockets) -> ViaDaemon {
        ViaDaemon {
            socket: socket.to_path_buf(),
            here: InProcess { sockets },
        }
    }
}

impl Firewall for ViaDaemon {
    fn apply(&self, request: Request) -> Result<()> {
        // Without our own netns id the daemon cannot tell whether it may serve us.
        let Ok(netns) = NetNs::current_id() else {
            return self.here.apply(request);
        };
        let env = Envelope { netns, request };
        match ask(&Daemon::new(&self.socket), &env) {
            Asked::Done => Ok(()),
            Asked::Here => self.here.apply(env.request),
            Asked::Failed(e) => Err(e),
        }
    }
}

/// What came of asking the daemon.
#[derive(Debug)]
enum Asked {
    /// The daemon did it.
    Done,
    /// The daemon did not serve it: do it in this process.
    Here,
    /// The request's error (the daemon's answer, or a daemon that cannot be used).
    Failed(Error),
}

/// One request to the daemon at `daemon`, versioned (see the module's doc).
fn ask(daemon: &Daemon, env: &Envelope) -> Asked {
    let op = env.request.name();
    let other = |msg: String| Asked::Failed(Error::new(ErrorKind::Other, msg));
    let target = ipamd::service::target::<service::Firewall>(env);
    let body = match ipamd::service::body::<service::Firewall>(env) {
        Ok(b) => b,
        Err(e) => return other(format!("firewall.{op}: cannot encode the request: {e}")),
    };
    match daemon.send("POST", &target, &[], Some(&body)) {
        Outcome::Local(_) => Asked::Here,
        Outcome::Failed(why) => other(format!("firewall.{op}: {why}")),
        Outcome::Answered { status, body } if (200..300).contains(&status) => {
            match serde_json::from_slice::<Done>(&body) {
                Ok(Done {}) => Asked::Done,
                Err(e) => other(format!(
                    "firewall.{op}: ipamd sent an unreadable answer to {target}: {e}"
                )),
            }
        }
        Outcome::Answered { status, body } if status == ipamd::service::UNREADABLE => {
            ipamd::log_at!(
                Level::Warn,
                "ipamd at {} could not read {target} (an older daemon?): {}; doing it in-process",
                daemon.socket().display(),
                String::from_utf8_lossy(&body).trim()
            );
            Asked::Here
        }
        Outcome::Answered { status, body } => match serde_json::from_slice::<Error>(&body) {
            Ok(e) => Asked::Failed(e),
            Err(_) => other(format!(
                "firewall.{op}: {target}: ipamd at {} answered {status}: {}",
                daemon.socket().display(),
                String::from_utf8_lossy(&body).trim()
            )),
        },
    }
}

/// Records the requests instead of doing them (unit tests of the plugins'
/// firewall logic need no root and no kernel).
#[derive(Debug, Default)]
pub struct Recording {
    pub requests: std::sync::Mutex<Vec<Request>>,
    /// When set, every request fails with this error.
    pub fail_with: Option<Error>,
}

impl Recording {
    pub fn taken(&self) -> Vec<Request> {
        std::mem::take(&mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Firewall for Recording {
    fn apply(&self, req: Request) -> Result<()> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(req);
        match &self.fail_with {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall::{masq, Attachment, Del};
    use ipamd::service::{decode, PROTOCOL, PROTOCOL_FIELD};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;

    const ATT: &str = r#"{"network":"pods","container_id":"c1","ifname":"eth0"}"#;

    /// Every operation as a cnikit 0.1.0 plugin sends it (no protocol field): its
    /// `request` object, fields in the order 0.1.0 wrote them. These never change: a
    /// newer daemon must read what plugins of every release still installed send.
    fn sent_by_0_1_0() -> Vec<String> {
        let spec = format!(
            r#""att":{ATT},"container":["10.88.0.2/24","fd00::2/64"],"mappings":[{{"host_ip":null,"host_port":8081,"proto":"tcp","container_port":80}},{{"host_ip":"127.0.0.1","host_port":5351,"proto":"udp","container_port":53}}],"masq":{{"snat":true,"masq_all":false}}"#
        );
        let del = format!(r#""att":{ATT}"#);
        let gc = format!(r#""network":"pods","valid":[{ATT}]"#);
        let masq = format!(r#""att":{ATT},"addrs":["10.88.0.2"],"subnets":["10.88.0.0/24"]"#);
        let mac = format!(r#""att":{ATT},"host_ifname":"veth1a2b3c4d","mac":"0a:58:0a:58:00:02""#);
        let fwd = format!(
            r#""att":{ATT},"addrs":["10.88.0.2"],"admin_chain":"CNI-ADMIN","isolation":{{"bridge":"cni0","isolated":false}}"#
        );
        [
            ("portmap-add", &spec),
            ("portmap-check", &spec),
            ("portmap-del", &del),
            ("portmap-del-keys", &spec),
            ("portmap-gc", &gc),
            ("masq-add", &masq),
            ("masq-del", &del),
            ("masq-del-keys", &masq),
            ("masq-gc", &gc),
            ("macspoof-add", &mac),
            ("macspoof-del", &del),
            ("macspoof-del-keys", &mac),
            ("macspoof-gc", &gc),
            (
                "conntrack-flush-udp",
                &r#""targets":[{"port":5351,"dst":null,"ipv6":false}]"#.to_string(),
            ),
            ("forward-add", &fwd),
            ("forward-check", &fwd),
            (
                "forward-del",
                &format!(r#""att":{ATT},"addrs":["10.88.0.2"]"#),
            ),
            ("forward-gc", &gc),
        ]
        .into_iter()
        .map(|(op, fields)| format!(r#"{{"netns":4026531840,"request":{{"op":"{op}",{fields}}}}}"#))
        .collect()
    }

    #[test]
    fn this_daemon_reads_every_request_of_a_0_1_0_plugin() {
        for body in sent_by_0_1_0() {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let op = v["request"]["op"].as_str().unwrap().to_string();
            match decode::<service::Firewall>(&op, body.as_bytes()) {
                Ok(env) => assert_eq!(env.request.name(), op),
                Err(e) => panic!("{op}: a 0.1.0 plugin's request is not read: {e:?}\n{body}"),
            }
        }
    }

    fn env() -> Envelope {
        Envelope {
            netns: 1,
            request: masq::Op::Del(Del {
                att: Attachment::new("pods", "c1", "eth0"),
            })
            .into(),
        }
    }

    #[test]
    fn requests_carry_our_protocol_and_a_daemon_without_versions_reads_them() {
        let body = ipamd::service::body::<service::Firewall>(&env()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v[PROTOCOL_FIELD], PROTOCOL);
        // 0.1.0's daemon read the body as an `Envelope` straight away (no unknown
        // field denied): the field is ignored there.
        let old: Envelope = serde_json::from_slice(&body).unwrap();
        assert_eq!(old.request, env().request);
        assert_eq!(
            decode::<service::Firewall>("masq-del", &body)
                .unwrap()
                .request,
            env().request
        );
    }

    /// A daemon at a socket in a temp dir that answers one request with `status` and
    /// `body`, and hands back the request it got (head and body).
    fn daemon_answering(
        status: u16,
        body: &str,
    ) -> (tempfile::TempDir, Daemon, mpsc::Receiver<String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ipamd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let answer = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // The request is whole once its body (Content-Length) follows the head.
            loop {
                let n = conn.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if rest.len() >= len || n == 0 {
                        let _ = tx.send(text);
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let _ = conn.write_all(answer.as_bytes());
        });
        let daemon = Daemon::new(&path);
        (dir, daemon, rx)
    }

    #[test]
    fn an_op_a_0_1_0_daemon_does_not_know_is_done_here() {
        // What 0.1.0's daemon answers to an operation it has no variant for.
        let (_dir, daemon, got) = daemon_answering(
            400,
            r#"{"kind":"other","message":"masq-del: malformed request: data did not match any variant of untagged enum Request"}"#,
        );
        assert!(matches!(ask(&daemon, &env()), Asked::Here));
        let request = got.recv().unwrap();
        assert!(
            request.starts_with("POST /v1/ext/firewall.masq-del "),
            "{request}"
        );
        assert!(
            request.contains(&format!(r#""{PROTOCOL_FIELD}":{PROTOCOL}"#)),
            "{request}"
        );
    }

    #[test]
    fn a_declined_request_is_done_here() {
        let (_dir, daemon, _) = daemon_answering(
            421,
            r#"{"kind":"other","message":"masq-del: the request is of protocol 3, newer than this daemon's (2); the caller does it itself"}"#,
        );
        assert!(matches!(ask(&daemon, &env()), Asked::Here));
    }

    #[test]
    fn no_daemon_means_here() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon::new(&dir.path().join("none.sock"));
        assert!(matches!(ask(&daemon, &env()), Asked::Here));
    }

    #[test]
    fn done_is_done() {
        let (_dir, daemon, _) = daemon_answering(200, "{}");
        assert!(matches!(ask(&daemon, &env()), Asked::Done));
    }

    #[test]
    fn the_daemons_error_is_the_requests_error() {
        let (_dir, daemon, _) = daemon_answering(
            409,
            r#"{"kind":"conflict","message":"host port tcp/8081 belongs to another container"}"#,
        );
        match ask(&daemon, &env()) {
            Asked::Failed(e) => assert_eq!(e.kind, ErrorKind::Conflict, "{e}"),
            other => panic!("{other:?}"),
        }
        // A refusal of the caller is not fallen back from either.
        let (_dir, daemon, _) = daemon_answering(403, "refused");
        match ask(&daemon, &env()) {
            Asked::Failed(e) => assert!(e.message.contains("answered 403"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
