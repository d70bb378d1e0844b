//! A cluster with a network between its parts, for the chaos test: etcd members listen on
//! addresses of a bridge in the test namespace, and every node daemon runs in a network
//! namespace of its own with a veth to that bridge. A node can then be cut off from etcd
//! (nftables drop rules in its namespace) while the test, its plugin calls (the daemon's
//! socket is a file) and the other nodes are not.
//!
//! Addresses: 198.18.N.0/24 (the benchmarking range; nothing else uses it here), one N
//! per [`Lan`]: members .1–.9 on the bridge, nodes .10 and up; and fd18:N::/64, the
//! bridge ::1, nodes ::10 and up. Every node's default routes go via the bridge.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicU8};

/// The bridge and the subnet of one chaos cluster.
pub struct Lan {
    bridge: String,
    /// "198.18.N".
    net: String,
    members: Vec<String>,
}

impl Lan {
    /// The bridge (deleted with the test's env), up, with the addresses of `members`
    /// etcd members on it.
    pub fn new(env: &TestEnv, members: usize) -> Lan {
        static NEXT: AtomicU8 = AtomicU8::new(0);
        let net = format!("198.18.{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let bridge = env.link_name("cnkcb");
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["link", "set", &bridge, "up"]);
        let members: Vec<String> = (1..=members).map(|i| format!("{net}.{i}")).collect();
        for m in &members {
            ip(&["addr", "add", &format!("{m}/24"), "dev", &bridge]);
        }
        // The nodes' default gateway in both families (the first member's address).
        let v6 = format!("{}::1/64", v6_net(&net));
        ip(&["addr", "add", &v6, "dev", &bridge, "nodad"]);
        Lan {
            bridge,
            net,
            members,
        }
    }

    /// The etcd cluster, one member on each member address.
    pub fn etcd(&self, env: &TestEnv) -> Etcd {
        let hosts: Vec<&str> = self.members.iter().map(String::as_str).collect();
        Etcd::start_on(env, &hosts)
    }

    /// Node `name` (the `i`-th) in a new namespace with address `.10+i`, its daemon started
    /// there with `extra` and joined to etcd at `endpoints`.
    pub fn node(
        &self,
        env: &TestEnv,
        i: usize,
        name: &str,
        endpoints: &str,
        extra: &[&str],
    ) -> NsNode {
        let ns = env.netns();
        let (outer, inner) = env.veth_pair();
        ip(&["link", "set", &outer, "master", &self.bridge]);
        ip(&["link", "set", &inner, "netns", &ns.name]);
        let addr = format!("{}.{}", self.net, 10 + i);
        let n = &ns.name;
        ip(&["-n", n, "link", "set", &inner, "name", "eth0"]);
        ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        let v6 = format!("{}::{}/64", v6_net(&self.net), 10 + i);
        ip(&["-n", n, "addr", "add", &v6, "dev", "eth0", "nodad"]);
        ip(&["-n", n, "link", "set", "eth0", "up"]);
        // A node's look: its default routes go out of eth0.
        ip(&["-n", n, "route", "add", "default", "via", &self.members[0]]);
        let gw6 = format!("{}::1", v6_net(&self.net));
        ip(&["-n", n, "-6", "route", "add", "default", "via", &gw6]);
        let dir = env.dir(&format!("node-{name}"));
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        extra.extend([
            format!("--etcd-endpoints={endpoints}"),
            format!("--node={name}"),
        ]);
        let node = Node {
            name: name.to_string(),
            sock: dir.join("ipamd.sock"),
            data: dir.join("data"),
            extra,
            daemon: std::sync::Mutex::new(None),
        };
        let n = NsNode {
            node,
            ns,
            members: self.members.clone(),
            cut: AtomicBool::new(false),
        };
        n.restart();
        n
    }
}

/// The IPv6 /64 of the Lan on "198.18.N": "fd18:N:" (each node's eth0 ::10+i, the
/// bridge ::1).
fn v6_net(net: &str) -> String {
    format!("fd18:{}", net.rsplit('.').next().unwrap_or("0"))
}

/// A node whose daemon runs in its own network namespace.
pub struct NsNode {
    pub node: Node,
    pub ns: Netns,
    members: Vec<String>,
    cut: AtomicBool,
}

impl NsNode {
    /// (Re)start the daemon in the node's namespace and wait until it serves. Every line
    /// it logs starts with the Unix time it was written at (its own log has no times): bash
    /// execs the daemon with its output going through perl, so the child's pid is the
    /// daemon's.
    pub fn restart(&self) {
        let extra: Vec<&str> = self.node.extra.iter().map(String::as_str).collect();
        let stamp = r#"$| = 1; printf("%.3f %s", Time::HiRes::time(), $_)"#;
        let script = format!(r#"exec "$0" "$@" > >(exec perl -MTime::HiRes -ne '{stamp}') 2>&1"#);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns.name, "bash", "-c", &script])
            .arg(cnikit_exe());
        let d = Daemon::start_by(cmd, &self.node.sock, &self.node.data, &extra);
        *lock(&self.node.daemon) = Some(d);
    }

    /// The lines of every log of the node's daemons (oldest daemon first) whose time
    /// (Unix seconds) lies in `from..=to`: (time, line).
    pub fn log_lines(&self, from: f64, to: f64) -> Vec<(f64, String)> {
        let dir = self.node.sock.parent().expect("node dir");
        let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains("/daemon-"))
            .collect();
        logs.sort();
        let mut out = Vec::new();
        for text in logs.iter().filter_map(|p| std::fs::read_to_string(p).ok()) {
            for l in text.lines() {
                let Some((t, rest)) = l.split_once(' ') else {
                    continue;
                };
                match t.parse::<f64>() {
                    Ok(t) if (from..=to).contains(&t) => out.push((t, rest.to_string())),
                    _ => {}
                }
            }
        }
        out
    }

    /// SIGKILL the daemon (also a stopped one).
    pub fn kill(&self) {
        self.node.kill();
    }

    /// SIGSTOP (`freeze`) or SIGCONT the daemon.
    pub fn freeze(&self, freeze: bool) {
        let sig = if freeze { libc::SIGSTOP } else { libc::SIGCONT };
        if let Some(d) = lock(&self.node.daemon).as_ref() {
            d.signal(sig);
        }
    }

    /// Cut the node off from every etcd member (`cut`: packets to and from them dropped in
    /// the node's namespace, so connections hang instead of failing) or end that.
    pub fn partition(&self, cut: bool) {
        if self.cut.swap(cut, Ordering::SeqCst) == cut {
            return;
        }
        let set = self.members.join(", ");
        let script = if cut {
            format!(
                "add table inet cnkchaos; \
                 add chain inet cnkchaos out {{ type filter hook output priority 0; }}; \
                 add chain inet cnkchaos in {{ type filter hook input priority 0; }}; \
                 add rule inet cnkchaos out ip daddr {{ {set} }} drop; \
                 add rule inet cnkchaos in ip saddr {{ {set} }} drop"
            )
        } else {
            "delete table inet cnkchaos".to_string()
        };
        let (ok, _, err) = sh("ip", &["netns", "exec", &self.ns.name, "nft", &script]);
        assert!(ok, "nft in {} ({script}): {err}", self.ns.name);
    }
}

impl NsNode {
    /// Whether a TCP connection from the node's namespace to `url` (`http://HOST:PORT`)
    /// opens within `within` (tries of a second each): proof that a partition cuts and
    /// that its end mends.
    pub fn reaches(&self, url: &str, within: Duration) -> bool {
        let hp = url.trim_start_matches("http://");
        let (host, port) = hp.split_once(':').expect("http://HOST:PORT");
        let probe = format!("exec 3<>/dev/tcp/{host}/{port}");
        let args = [
            "netns",
            "exec",
            &self.ns.name,
            "timeout",
            "1",
            "bash",
            "-c",
            &probe,
        ];
        let t = Instant::now();
        loop {
            if sh("ip", &args).0 {
                return true;
            }
            if t.elapsed() >= within {
                return false;
            }
        }
    }
}

/// POST /v3/maintenance/status to the member on `host`:`port` (etcd's JSON gateway): its
/// answer, None unless it answers within a second.
fn member_status(host: &str, port: u16) -> Option<Value> {
    let addr = std::net::SocketAddr::new(host.parse().ok()?, port);
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let req = "POST /v3/maintenance/status HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\
               Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let body = &out[out.find("\r\n\r\n")?..];
    serde_json::from_str(&body[body.find('{')?..=body.rfind('}')?]).ok()
}

impl Etcd {
    /// The member that leads now, as it says itself (None while no running member does).
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            let m = &self.members[i];
            let st = m
                .child
                .as_ref()
                .and_then(|_| member_status(&m.host, m.client));
            let Some(st) = st else {
                return false;
            };
            st["leader"].is_string() && st["leader"] == st["header"]["member_id"]
        })
    }

    /// SIGSTOP (`freeze`) or SIGCONT member `i` alone.
    pub fn freeze(&self, i: usize, freeze: bool) {
        let sig = if freeze { libc::SIGSTOP } else { libc::SIGCONT };
        if let Some(c) = self.members[i].child.as_ref() {
            let pid = libc::pid_t::try_from(c.id()).expect("pid");
            // SAFETY: kill(2) on our own child, which has not been waited for.
            unsafe { libc::kill(pid, sig) };
        }
    }

    pub fn member_count(&self) -> usize {
        self.members.len()
    }
}
