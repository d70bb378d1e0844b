//! Cluster pools end to end: real etcd members (Debian's `etcd-server`) on
//! 127.0.0.1 of the test namespace, and ipamd daemons as nodes, each with its own socket,
//! data dir and node name, driven through the `ipamd` plugin and `cnikit ipamd pool`.
//!
//! - [`pool_cli`]: the pool commands, errors without a daemon, release-node rules;
//! - [`nodes`]: three nodes sharing pools: blocks, usage counts, exhaustion, restart;
//! - [`faults`]: etcd members and node daemons killed under concurrent ADDs, quorum loss;
//! - [`tls`]: an etcd that requires client certificates;
//! - [`reclaim`]: dead nodes' blocks reclaimed and quarantined, fencing, `pool check`;
//! - [`grow`]: CIDRs added to and drained from a pool live;
//! - [`routing`]: `--route-blocks`: pods on three nodes of one L2 segment reach each other;
//! - [`chaos`]: 4 nodes, each in its own network namespace ([`netns`]), under concurrent
//!   ADD/DEL while daemons and members are killed and stopped and nodes are cut off from
//!   etcd past `reclaimAfter` and return: no address reused, reclaim times bounded.

mod chaos;
mod faults;
mod grow;
mod netns;
mod nodes;
mod pool_cli;
mod reclaim;
mod routing;
mod tls;

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// Ports of the members of all tests (tests run in parallel in one namespace).
static NEXT_PORT: AtomicU16 = AtomicU16::new(24000);

/// One etcd member.
struct Member {
    name: String,
    /// The address it listens on (127.0.0.1, or a chaos network's).
    host: String,
    client: u16,
    peer: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// An etcd cluster of `n` members, killed on drop.
pub struct Etcd {
    members: Vec<Member>,
    initial: String,
}

impl Etcd {
    pub fn start(env: &TestEnv, n: usize) -> Etcd {
        Etcd::start_on(env, &vec!["127.0.0.1"; n])
    }

    /// One member per address of `hosts`, each listening there.
    pub fn start_on(env: &TestEnv, hosts: &[&str]) -> Etcd {
        let n = hosts.len();
        let base = NEXT_PORT.fetch_add(2 * n as u16, Ordering::SeqCst);
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                host: hosts[i].to_string(),
                client: base + 2 * i as u16,
                peer: base + 2 * i as u16 + 1,
                dir: env.dir(&format!("etcd-m{i}")),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://{}:{}", m.name, m.host, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut etcd = Etcd { members, initial };
        for i in 0..n {
            etcd.spawn(i);
        }
        for i in 0..n {
            etcd.wait_healthy(i);
        }
        etcd
    }

    fn spawn(&mut self, i: usize) {
        let initial = self.initial.clone();
        let m = &mut self.members[i];
        let log = std::fs::File::create(m.dir.with_extension("log")).expect("etcd log");
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(m.dir.join("data"))
            .arg(format!(
                "--listen-client-urls=http://{}:{}",
                m.host, m.client
            ))
            .arg(format!(
                "--advertise-client-urls=http://{}:{}",
                m.host, m.client
            ))
            .arg(format!("--listen-peer-urls=http://{}:{}", m.host, m.peer))
            .arg(format!(
                "--initial-advertise-peer-urls=http://{}:{}",
                m.host, m.peer
            ))
            .arg(format!("--initial-cluster={initial}"))
            .args([
                "--initial-cluster-token",
                &format!("t{}", self.members[0].peer),
            ])
            // Fast elections: the tests kill members and want a leader back quickly. Pre-vote
            // (etcd 3.5's default): a member back from SIGSTOP or a restart does not depose
            // the leader, and so does not refresh every lease's TTL as a new leader does.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .arg("--pre-vote")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("run etcd (apt-get install etcd-server)");
        self.members[i].child = Some(child);
    }

    /// Until the member answers /health with a leader (30 s at most).
    fn wait_healthy(&self, i: usize) {
        let (host, port) = (&self.members[i].host, self.members[i].client);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !health(host, port) {
            assert!(
                Instant::now() < deadline,
                "etcd member {i} on port {port} not healthy within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `--etcd-endpoints` value: every member.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("http://{}:{}", m.host, m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILL member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP (`freeze`) or SIGCONT every member: etcd stops answering without any
    /// connection breaking, as in a long leader election.
    pub fn freeze_all(&self, freeze: bool) {
        let sig = if freeze { libc::SIGSTOP } else { libc::SIGCONT };
        for c in self.members.iter().filter_map(|m| m.child.as_ref()) {
            let pid = libc::pid_t::try_from(c.id()).expect("pid");
            // SAFETY: kill(2) on our own child, which has not been waited for.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// Start member `i` again on its data dir.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i);
    }

    /// Wait until member `i` serves with a leader.
    pub fn wait(&self, i: usize) {
        self.wait_healthy(i);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// GET /health of the member on `host`:`port`: true when it reports itself healthy.
fn health(host: &str, port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect((host, port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = "GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}

/// `cnikit ipamd pool ARGS… --etcd-endpoints E`, the arguments written as an operator
/// types them (`"create p1 --cidr 10.60.0.0/24"`): none of them has a space.
pub fn pool(etcd: &str, args: &str) -> std::process::Output {
    Command::new(cnikit_exe())
        .args(["ipamd", "pool"])
        .args(args.split_whitespace())
        .arg(format!("--etcd-endpoints={etcd}"))
        .output()
        .expect("run cnikit ipamd pool")
}

/// `pool ARGS` must succeed; its stdout.
pub fn pool_ok(etcd: &str, args: &str) -> String {
    stdout_ok(&format!("cnikit ipamd pool {args}"), &pool(etcd, args))
}

/// `pool ARGS` must fail saying `needle`.
pub fn pool_err(etcd: &str, args: &str, needle: &str) {
    let out = pool(etcd, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "cnikit ipamd pool {args} succeeded");
    assert!(
        stderr.contains(needle),
        "pool {args}: no {needle:?} in {stderr}"
    );
}

/// `pool show NAME --json`.
pub fn show(etcd: &str, name: &str) -> Value {
    let out = pool_ok(etcd, &format!("show {name} --json"));
    serde_json::from_str(&out).expect("pool show --json")
}

/// An etcd cluster of `members` and its endpoints, with the pools `creates` made (each
/// the arguments of `pool create`): the start of every cluster test.
pub fn etcd_with_pools(env: &TestEnv, members: usize, creates: &[&str]) -> (Etcd, String) {
    let etcd = Etcd::start(env, members);
    let e = etcd.endpoints();
    for args in creates {
        pool_ok(&e, &format!("create {args}"));
    }
    (etcd, e)
}

/// A single-node test's start: etcd of `members` with the pool `create` makes (`pool
/// create` arguments, the name first), its endpoints, the node `name` started with the
/// daemon arguments `extra`, and the node's config of network "pods" on the pool.
pub fn one_node(
    env: &TestEnv,
    members: usize,
    create: &str,
    name: &str,
    extra: &[&str],
) -> (Etcd, String, Node, Value) {
    let (etcd, e) = etcd_with_pools(env, members, &[create]);
    let pool = create.split_whitespace().next().expect("pool name");
    let node = Node::start(env, name, &e, extra);
    let conf = node.conf("pods", &[pool]);
    (etcd, e, node, conf)
}

/// One node: an ipamd daemon joined to etcd under `name`.
pub struct Node {
    pub name: String,
    pub sock: PathBuf,
    pub data: PathBuf,
    extra: Vec<String>,
    /// Behind a lock: a test kills and restarts it while client threads use the node.
    daemon: std::sync::Mutex<Option<Daemon>>,
}

impl Node {
    /// Start the node's daemon and wait until it serves.
    pub fn start(env: &TestEnv, name: &str, etcd: &str, extra: &[&str]) -> Node {
        let dir = env.dir(&format!("node-{name}"));
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        extra.extend([format!("--etcd-endpoints={etcd}"), format!("--node={name}")]);
        let n = Node {
            name: name.to_string(),
            sock: dir.join("ipamd.sock"),
            data: dir.join("data"),
            extra,
            daemon: std::sync::Mutex::new(None),
        };
        n.restart();
        n
    }

    /// One node per name, all with the same `extra` daemon arguments.
    pub fn start_all(env: &TestEnv, names: &[&str], etcd: &str, extra: &[&str]) -> Vec<Node> {
        names
            .iter()
            .map(|n| Node::start(env, n, etcd, extra))
            .collect()
    }

    /// (Re)start the daemon on the same socket, data dir and node name.
    pub fn restart(&self) {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let d = Daemon::start(&self.sock, &self.data, &extra, &[]);
        *lock(&self.daemon) = Some(d);
    }

    /// SIGKILL the daemon.
    pub fn kill(&self) {
        if let Some(mut d) = lock(&self.daemon).take() {
            d.kill();
        }
    }

    /// The `ipam` section for `pools` on this node.
    pub fn ipam(&self, pools: &[&str]) -> Value {
        let mut ipam = json!({"type": "ipamd", "socket": self.sock, "dataDir": self.data});
        if let [one] = pools {
            ipam["pool"] = json!(one);
        } else {
            ipam["pools"] = json!(pools);
        }
        ipam
    }

    /// A network config of the ipamd plugin alone.
    pub fn conf(&self, network: &str, pools: &[&str]) -> Value {
        json!({"cniVersion": "1.1.0", "name": network, "type": "ipamd", "ipam": self.ipam(pools)})
    }

    /// Run `command` (ADD, DEL, STATUS, CHECK) of the ipamd plugin for container `cid`.
    pub fn call(&self, env: &TestEnv, command: &str, cid: &str, conf: &Value) -> Outcome {
        let c = env.plugin("ipamd").conf(conf);
        let c = if command == "STATUS" {
            c.command("STATUS")
        } else {
            c.attach_at(command, cid, "/var/run/netns/cluster-test")
        };
        c.run()
    }

    /// Leases this node's store holds, address → container ID (the daemon answers, or
    /// the store files do without it).
    pub fn leases(&self) -> BTreeMap<IpAddr, String> {
        leases_json(&self.data, &self.sock, None)
            .iter()
            .map(|l| {
                (
                    l["address"].as_str().unwrap().parse().unwrap(),
                    l["containerId"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    pub fn metric(&self, series: &str) -> u64 {
        metric(&self.sock, series)
    }
}

/// The addresses of an ADD result.
pub fn addresses(result: &Value) -> Vec<ipnet::IpNet> {
    result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .map(|ip| ip["address"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// Wait until `f` holds (at most `limit`); how long it took.
pub fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    t0.elapsed()
}

/// Block CIDR → owning node, from `pool show`.
pub fn owners(etcd: &str, pool: &str) -> BTreeMap<ipnet::IpNet, (String, u64)> {
    show(etcd, pool)["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .map(|b| {
            (
                b["cidr"].as_str().unwrap().parse().unwrap(),
                (
                    b["node"].as_str().unwrap().to_string(),
                    b["inUse"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

/// Every node's addresses of `pool` lie in blocks `pool show` gives to that node and no address is
/// held by two nodes; the usage counts catch up with the leases within 10 s.
pub fn assert_consistent<'a>(etcd: &str, pool: &str, nodes: impl IntoIterator<Item = &'a Node>) {
    let mut seen: BTreeMap<IpAddr, String> = BTreeMap::new();
    let blocks = owners(etcd, pool);
    let cidr: ipnet::IpNet = show(etcd, pool)["cidr"].as_str().unwrap().parse().unwrap();
    for n in nodes {
        for (addr, cid) in n.leases() {
            if !cidr.contains(&addr) {
                continue; // another pool's
            }
            if let Some(other) = seen.insert(addr, n.name.clone()) {
                panic!("{addr} is held on {other} and on {} ({cid})", n.name);
            }
            match blocks.iter().find(|(b, _)| b.contains(&addr)) {
                Some((b, (node, _))) => assert_eq!(
                    node, &n.name,
                    "{addr} of {} lies in block {b} of node {node}",
                    n.name
                ),
                None => panic!("{addr} of {} lies in no claimed block: {blocks:?}", n.name),
            }
        }
    }
    let t0 = Instant::now();
    loop {
        let wrong: Vec<String> = owners(etcd, pool)
            .iter()
            .filter_map(|(b, (node, in_use))| {
                let held = seen.keys().filter(|a| b.contains(*a)).count() as u64;
                (held != *in_use).then(|| format!("{b} of {node}: inUse {in_use}, leases {held}"))
            })
            .collect();
        if wrong.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "usage counts of pool {pool} did not catch up within 10 s: {}",
            wrong.join("; ")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
