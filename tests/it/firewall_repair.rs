//! A node that heals itself: after someone else rewrote the host's firewall
//! (`nft flush ruleset`, a Debian-style `/etc/nftables.conf` loaded with
//! `nft -f`, `nft delete table inet cnikit`), the daemon puts back what the
//! pods hold, and so does `cnikit firewall restore` without it. Checked with
//! traffic: host ports via 127.0.0.1 and the gateway, hairpin, masqueraded
//! egress; others' tables as loaded; CHECK after; DEL leaves nothing.
//!
//! Each test has a node of its own (a netns with eth0, a default route and
//! an "outside" beyond it), so its flushes touch no other test.

use crate::support::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const WEB: u16 = 8080;

struct Node {
    /// Repairs need the firewall lock promptly (see `firewall_lock_wanted`).
    _lock: std::sync::RwLockReadGuard<'static, ()>,
    env: TestEnv,
    ns: Netns,
    outside: Netns,
    /// The node's eth0 subnet: node .1, outside .2.
    uplink: Subnets,
    conf_dir: PathBuf,
    cache: PathBuf,
    data: PathBuf,
    sock: PathBuf,
    host_port: u16,
}

impl Node {
    fn new(test: &str) -> Node {
        Node::with(test, &[])
    }

    /// A node whose network list ends with `more` plugins.
    fn with(test: &str, more: &[Value]) -> Node {
        let lock = firewall_lock_wanted();
        let env = TestEnv::new(test);
        let (ns, outside, uplink) = (env.netns(), env.netns(), env.subnets());
        let (node_end, far_end) = env.veth_pair();
        ip(&["link", "set", &node_end, "netns", &ns.name, "name", "eth0"]);
        ip(&[
            "link",
            "set",
            &far_end,
            "netns",
            &outside.name,
            "name",
            "eth0",
        ]);
        for (n, host) in [(&ns.name, 1u8), (&outside.name, 2)] {
            let v4 = format!("{}/24", uplink.v4_addr(host));
            let v6 = format!("{}/64", uplink.v6_addr(host.into()));
            ip(&["-n", n, "addr", "add", &v4, "dev", "eth0"]);
            ip(&["-n", n, "addr", "add", &v6, "dev", "eth0", "nodad"]);
            ip(&["-n", n, "link", "set", "eth0", "up"]);
        }
        ip(&[
            "-n",
            &ns.name,
            "route",
            "add",
            "default",
            "via",
            &uplink.v4_addr(2),
        ]);
        let data = env.dir("ipamd");
        let node = Node {
            _lock: lock,
            conf_dir: env.dir("net.d"),
            cache: env.dir("results"),
            sock: data.join("ipamd.sock"),
            data,
            host_port: host_port(),
            env,
            ns,
            outside,
            uplink,
        };
        node.write_network(more);
        node
    }

    /// bridge (gateway, ipMasq, hairpin) + ipamd + portmap (+ `more`).
    fn write_network(&self, more: &[Value]) {
        let mut plugins = vec![json!({
            "type": "bridge", "bridge": self.env.link_name("rpbr"), "isGateway": true,
            "isDefaultGateway": true, "ipMasq": true, "hairpinMode": true, "ipam": self.ipam(),
        })];
        plugins.push(json!({"type": "portmap", "capabilities": {"portMappings": true}}));
        plugins.extend(more.iter().cloned());
        self.write_plugins(plugins);
    }

    fn ipam(&self) -> Value {
        let ranges = self.env.subnets().dual_ranges();
        json!({"type": "ipamd", "dataDir": self.data, "socket": self.sock, "ranges": ranges})
    }

    /// The network list `web`, every plugin through the node's daemon socket
    /// (in-process when none answers).
    fn write_plugins(&self, mut plugins: Vec<Value>) {
        for plugin in &mut plugins {
            plugin["daemonSocket"] = json!(self.sock);
        }
        let list = json!({"cniVersion": "1.0.0", "name": "web", "plugins": plugins});
        std::fs::write(self.conf_dir.join("10-web.conflist"), list.to_string()).expect("write");
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new("ip")
            .args(["netns", "exec", &self.ns.name])
            .args(args)
            .output()
            .expect("run in the node")
    }

    /// `cnikit net VERB web POD` on the node, with the host port mapped.
    fn net(&self, verb: &str, pod: &Netns) -> String {
        stdout_ok(&format!("cnikit net {verb}"), &self.net_output(verb, pod))
    }

    /// The same, when it must fail: what it printed (the plugin's error).
    fn net_fails(&self, verb: &str, pod: &Netns) -> String {
        let out = self.net_output(verb, pod);
        assert!(!out.status.success(), "cnikit net {verb} succeeded");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn net_output(&self, verb: &str, pod: &Netns) -> std::process::Output {
        let map = json!({"portMappings": [{"hostPort": self.host_port, "containerPort": WEB}]});
        let exe = cnikit_exe();
        let (conf, bin, cache) = (
            self.conf_dir.to_string_lossy(),
            self.env.bin_dir().to_string_lossy().into_owned(),
            self.cache.to_string_lossy(),
        );
        self.run(&[
            &exe.to_string_lossy(),
            "net",
            "--conf-dir",
            &conf,
            "--cni-path",
            &bin,
            "--cache-dir",
            &cache,
            verb,
            "web",
            &pod.path,
            "--cap-args",
            &map.to_string(),
        ])
    }

    fn nft(&self, args: &str) -> String {
        let mut full = vec!["nft"];
        full.extend(args.split(' '));
        stdout_ok(&format!("nft {args}"), &self.run(&full))
    }

    /// `cnikit firewall restore` on the node.
    fn restore(&self) -> String {
        let exe = cnikit_exe();
        stdout_ok(
            "cnikit firewall restore",
            &self.run(&[&exe.to_string_lossy(), "firewall", "restore"]),
        )
    }

    fn daemon(&self) -> Daemon {
        Daemon::start_in(&self.ns.name, &self.sock, &self.data)
    }
}

/// A pod with a web server on the node's network.
struct Pod {
    ns: Netns,
    v4: String,
    _servers: Servers,
}

fn pod(node: &Node) -> Pod {
    let ns = node.env.netns();
    let result: Value = serde_json::from_str(&node.net("add", &ns)).expect("result");
    let servers = Servers::start(&ns.path, "P", WEB, WEB + 1);
    Pod {
        v4: first_addr(&result, false),
        ns,
        _servers: servers,
    }
}

/// Everything the pod should have, with traffic: its host port from the node
/// via 127.0.0.1 and via the bridge's address, hairpin (the pod to itself
/// through the node's address), and egress that the outside sees coming
/// from the node.
fn assert_whole(node: &Node, pod: &Pod, gateway: &str) {
    let in_node = Some(node.ns.path.as_str());
    for host in ["127.0.0.1", gateway] {
        let got = eventually_answers(|| tcp_ask(in_node, &sock(host, node.host_port)));
        assert!(
            got.is_some_and(|g| g.starts_with("P ")),
            "host port via {host}"
        );
    }
    let in_pod = Some(pod.ns.path.as_str());
    let hairpin = sock(&node.uplink.v4_addr(1), node.host_port);
    assert!(
        eventually_answers(|| tcp_ask(in_pod, &hairpin)).is_some(),
        "hairpin"
    );
    let out = eventually_answers(|| tcp_ask(in_pod, &sock(&node.uplink.v4_addr(2), WEB)));
    assert_eq!(
        out,
        Some(format!("O {}", node.uplink.v4_addr(1))),
        "masqueraded egress"
    );
}

/// How long until the host port answers again (polled every 5 ms).
fn time_to_answer(node: &Node) -> Duration {
    let started = Instant::now();
    let in_node = Some(node.ns.path.as_str());
    let target = sock("127.0.0.1", node.host_port);
    while started.elapsed() < Duration::from_secs(5) {
        if quick_tcp(in_node, &target) {
            return started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!(
        "the host port did not answer within 5 s; the node's ruleset:\n{}",
        node.nft("list ruleset")
    );
}

/// A connection that gets an answer within 200 ms.
fn quick_tcp(ns: Option<&str>, addr: &str) -> bool {
    use std::io::Read;
    let addr: std::net::SocketAddr = addr.parse().expect("address");
    in_netns(ns, move || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(200))).ok()?;
        let mut buf = [0u8; 1];
        s.read(&mut buf).ok().filter(|n| *n > 0)
    })
    .is_some()
}

fn gateway(node: &Node, pod: &Pod) -> String {
    let routes = routes(Some(&pod.ns.name), "-4");
    routes
        .iter()
        .find_map(|r| {
            r.strip_prefix("default via ")
                .map(|g| g.split(' ').next().unwrap_or(g).to_string())
        })
        .unwrap_or_else(|| {
            panic!(
                "no default route in the pod of {}: {routes:?}",
                node.ns.name
            )
        })
}

/// What Debian's nftables.service loads: `/etc/nftables.conf` as shipped.
const DEBIAN_NFTABLES_CONF: &str = "#!/usr/sbin/nft -f

flush ruleset

table inet filter {
	chain input {
		type filter hook input priority filter;
	}
	chain forward {
		type filter hook forward priority filter;
	}
	chain output {
		type filter hook output priority filter;
	}
}
";

#[test]
fn the_daemon_puts_back_what_a_flush_a_reload_or_a_deleted_table_took() {
    let node = Node::new("fw-repair-daemon");
    let daemon = node.daemon();
    let p = pod(&node);
    let gw = gateway(&node, &p);
    let _outside = Servers::start(&node.outside.path, "O", WEB, WEB + 1);
    assert_whole(&node, &p, &gw);

    node.nft("flush ruleset");
    let took = time_to_answer(&node);
    eprintln!("daemon log:\n{}", daemon.log());
    eprintln!("host port answered again {took:?} after nft flush ruleset");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_whole(&node, &p, &gw);

    let conf = node.env.dir("etc").join("nftables.conf");
    std::fs::write(&conf, DEBIAN_NFTABLES_CONF).expect("write");
    node.nft(&format!("-f {}", conf.display()));
    let theirs = node.nft("list table inet filter");
    assert!(time_to_answer(&node) < Duration::from_secs(1));
    assert_whole(&node, &p, &gw);
    assert_eq!(
        node.nft("list table inet filter"),
        theirs,
        "their table as loaded"
    );

    node.nft("delete table inet cnikit");
    assert!(time_to_answer(&node) < Duration::from_secs(1));
    assert_whole(&node, &p, &gw);
    node.net("check", &p.ns);
    assert!(daemon.log().contains("put back"), "{}", daemon.log());

    node.net("del", &p.ns);
    std::thread::sleep(Duration::from_millis(300));
    let table = node.nft("list table inet cnikit");
    assert!(!table.contains(&p.v4), "DEL left {}:\n{table}", p.v4);
    // Only the three changes by `nft` woke the watch, not the daemon's own
    // batches (the ADD, CHECK and DEL it served, on its worker threads).
    let log = daemon.log();
    let woken = log.matches("firewall: after a change by process").count();
    assert_eq!(woken, 3, "{log}");
}

#[test]
fn a_flush_racing_a_del_brings_nothing_back() {
    let node = Node::new("fw-repair-del");
    let _daemon = node.daemon();
    let gone = pod(&node);
    node.nft("flush ruleset");
    node.net("del", &gone.ns);
    std::thread::sleep(Duration::from_millis(300));
    let ruleset = node.nft("list ruleset");
    assert!(
        !ruleset.contains(&gone.v4),
        "the deleted pod came back:\n{ruleset}"
    );
    // The next pod maps the same host port.
    let next = pod(&node);
    assert!(time_to_answer(&node) < Duration::from_secs(1));
    node.net("del", &next.ns);
}

#[test]
fn a_flush_while_the_daemon_was_down_is_repaired_when_it_starts() {
    let node = Node::new("fw-repair-start");
    let daemon = node.daemon();
    let p = pod(&node);
    drop(daemon);
    node.nft("flush ruleset");
    assert!(!quick_tcp(
        Some(node.ns.path.as_str()),
        &sock("127.0.0.1", node.host_port)
    ));
    let _daemon = node.daemon();
    assert!(time_to_answer(&node) < Duration::from_secs(1));
    node.net("check", &p.ns);
    node.net("del", &p.ns);
}

#[test]
fn without_a_daemon_cnikit_firewall_restore_repairs_once() {
    let node = Node::new("fw-repair-cli");
    let p = pod(&node);
    let gw = gateway(&node, &p);
    let _outside = Servers::start(&node.outside.path, "O", WEB, WEB + 1);
    assert_eq!(
        node.restore().trim(),
        "firewall: nothing to put back (1 attachment recorded, all in place)"
    );
    node.nft("flush ruleset");
    // CHECK tells the truth: the first plugin, bridge, misses its masquerade.
    let error: Value = serde_json::from_str(&node.net_fails("check", &p.ns)).expect("error");
    assert_eq!(error["code"], 100, "{error}");
    let msg = error["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(&format!("masquerade of {}", p.v4)), "{error}");
    let said = node.restore();
    assert!(
        said.contains("put back what 1 of 1 attachment lacked"),
        "{said}"
    );
    assert_whole(&node, &p, &gw);
    assert!(node.restore().contains("nothing to put back"));
    node.net("check", &p.ns);
    node.net("del", &p.ns);
    let table = node.nft("list table inet cnikit");
    assert!(!table.contains(&p.v4), "DEL left {}:\n{table}", p.v4);
}

/// The firewall plugin's rules in iptables' filter table, under a FORWARD
/// policy of drop: an `iptables -F FORWARD` takes the jump to CNI-FORWARD,
/// and the pod's egress stops until the daemon puts it back.
#[test]
fn the_daemon_puts_back_the_firewall_plugins_jump_after_iptables_flushes_forward() {
    let node = Node::with("fw-repair-iptables", &[json!({"type": "firewall"})]);
    let iptables = |args: &str| {
        let mut full = vec!["iptables"];
        full.extend(args.split(' '));
        stdout_ok(&format!("iptables {args}"), &node.run(&full))
    };
    iptables("-P FORWARD DROP");
    let _daemon = node.daemon();
    let p = pod(&node);
    let _outside = Servers::start(&node.outside.path, "O", WEB, WEB + 1);
    let in_pod = Some(p.ns.path.as_str());
    let far = sock(&node.uplink.v4_addr(2), WEB);
    assert!(
        eventually_answers(|| tcp_ask(in_pod, &far)).is_some(),
        "egress"
    );
    // The jump back in FORWARD, and the pod's egress through the drop policy.
    let repaired = |after: &str| {
        eventually(&format!("the jump is back after {after}"), || {
            iptables("-S FORWARD").contains("-j CNI-FORWARD")
        });
        assert!(tcp_ask(in_pod, &far).is_some(), "egress after {after}");
    };
    iptables("-F FORWARD");
    repaired("iptables -F FORWARD");
    // A flush takes iptables' tables too (and their drop); when the host's
    // firewall makes FORWARD again with its drop policy, the plugin's jump
    // and rules go there.
    node.nft("flush ruleset");
    iptables("-P FORWARD DROP");
    repaired("nft flush ruleset and iptables -P FORWARD DROP");
    node.net("check", &p.ns);
    node.net("del", &p.ns);
    let rules = iptables("-S CNI-FORWARD");
    assert!(!rules.contains(&p.v4), "DEL left:\n{rules}");
}

/// ptp's CHECK with ipMasq tells the truth too, and passes once restored.
#[test]
fn ptp_check_fails_while_its_masquerade_is_gone() {
    let node = Node::new("fw-repair-ptp");
    node.write_plugins(vec![
        json!({"type": "ptp", "ipMasq": true, "ipam": node.ipam()}),
        json!({"type": "portmap", "capabilities": {"portMappings": true}}),
    ]);
    let p = pod(&node);
    node.net("check", &p.ns);
    node.nft("flush ruleset");
    let error: Value = serde_json::from_str(&node.net_fails("check", &p.ns)).expect("error");
    assert_eq!(error["code"], 100, "{error}");
    let msg = error["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(&format!("masquerade of {}", p.v4)), "{error}");
    assert!(node.restore().contains("put back"));
    node.net("check", &p.ns);
    node.net("del", &p.ns);
}
