//! Fault injection (built only with the cargo feature `fault-injection`,
//! which `tests/run` enables): the Nth kernel send of a plugin's ADD (a
//! netlink request or an nftables batch, `CNIKIT_FAULT_NETLINK=N`), or the
//! Nth write or fsync of its lease store (`CNIKIT_FAULT_STORE=N`), fails,
//! for every N until the ADD has no Nth one left. Each failed ADD must come
//! back as an error object and leave nothing behind (links, leases, nft
//! elements, portmap markers), and the DEL the runtime then sends must
//! succeed and still leave nothing.

use crate::support::*;
use serde_json::{json, Value};

/// More failure points than any ADD here has: reaching it means the walk never ends.
const MAX_SENDS: u32 = 400;

/// The two kinds of failure point.
const FAULTS: [&str; 2] = ["CNIKIT_FAULT_NETLINK", "CNIKIT_FAULT_STORE"];

/// What each step of the walk looks at.
struct Walk<'e> {
    env: &'e TestEnv,
    ns: Netns,
    ipam: Value,
    network: &'static str,
    /// The links the attachment's host side may leave (bridge ports).
    host_ports: Option<String>,
}

impl<'e> Walk<'e> {
    /// A walk of network `network` (IPAM `ipam`) in a new netns.
    fn new(
        env: &'e TestEnv,
        network: &'static str,
        ipam: Value,
        host_ports: Option<String>,
    ) -> Walk<'e> {
        Walk {
            env,
            ns: env.netns(),
            ipam,
            network,
            host_ports,
        }
    }

    /// A gateway bridge of network `network` over `ipam`, with the `extra` keys: the walk
    /// of its attachments (which also looks at the bridge's ports) and the bridge config.
    fn bridge(
        env: &'e TestEnv,
        network: &'static str,
        ipam: Value,
        extra: Value,
    ) -> (Walk<'e>, Value) {
        let bridge = env.link_name("fbr");
        let conf = merged(
            json!({
                "cniVersion": "1.0.0", "name": network, "type": "bridge", "bridge": bridge,
                "isGateway": true, "ipam": ipam,
            }),
            extra,
        );
        (Walk::new(env, network, ipam, Some(bridge)), conf)
    }

    /// `verb` of `plugin` for container `id` in the walk's netns, with `conf`.
    fn call(&self, plugin: &str, verb: &str, id: &str, conf: &Value) -> Call {
        self.env
            .plugin(plugin)
            .attach(verb, id, &self.ns, "eth0")
            .conf(conf)
    }

    /// Nothing of container `id` is left: only lo in the netns, no lease, no
    /// nft element, no portmap marker, no port on the bridge, no host link
    /// whose alias names the attachment.
    fn assert_clean(&self, id: &str, what: &str) {
        assert_only_lo(&self.ns, what);
        let (_, host_links, _) = sh("ip", &["-d", "link", "show"]);
        assert!(
            !host_links.contains(id),
            "{what}: a host link names {id}: {host_links}"
        );
        assert_eq!(
            self.env.lease_count(&self.ipam, self.network),
            0,
            "{what}: a lease is left"
        );
        assert_no_trace(what, &[id.to_string()]);
        assert!(
            !portmap_marker_ids().contains(id),
            "{what}: a portmap marker is left"
        );
        if let Some(bridge) = &self.host_ports {
            // No bridge yet (the ADD failed before making it) is no port either.
            let (_, ports, _) = sh("ip", &["link", "show", "master", bridge]);
            assert!(
                ports.trim().is_empty(),
                "{what}: ports left on {bridge}: {ports}"
            );
        }
    }

    /// ADD of `steps.plugin` failing at each point of kind `fault` (an env
    /// variable of [`FAULTS`]) in turn; `steps.before` runs (without faults)
    /// ahead of each ADD, `steps.dels` after it. Returns how many points of
    /// that kind the ADD has.
    fn every(&self, fault: &str, id: &str, steps: &Steps) -> u32 {
        for n in 1..MAX_SENDS {
            let what = format!("{} ADD failing at {fault}={n}", steps.plugin);
            (steps.before)();
            let out = self
                .call(steps.plugin, "ADD", id, &steps.conf)
                .env(fault, &n.to_string())
                .run();
            let failed = !out.success();
            if failed {
                let e = out.err();
                let text = format!("{} {}", e.msg, e.details);
                assert!(text.contains("injected failure"), "{what}: {e:?}");
            }
            for (plugin, conf) in &steps.dels {
                self.call(plugin, "DEL", id, conf).run().ok_silent();
            }
            self.assert_clean(id, &what);
            if !failed {
                return n - 1;
            }
        }
        panic!(
            "{} ADD still failing after {fault}={MAX_SENDS}",
            steps.plugin
        );
    }
}

/// One walk: the plugin whose ADD fails, and the DELs (in order) a runtime
/// sends for the chain afterwards.
struct Steps<'a> {
    plugin: &'static str,
    conf: Value,
    before: &'a dyn Fn(),
    dels: Vec<(&'static str, Value)>,
}

impl Steps<'static> {
    /// The ADD of `plugin` alone, with nothing before it and its own DEL after.
    fn alone(plugin: &'static str, conf: &Value) -> Steps<'static> {
        Steps {
            plugin,
            conf: conf.clone(),
            before: &|| {},
            dels: vec![(plugin, conf.clone())],
        }
    }
}

/// bridge with ipMasq and macspoofchk over in-process ipamd, then portmap
/// chained after it: every send of each ADD fails once.
#[test]
fn every_failure_point_of_a_bridge_portmap_add_leaves_nothing() {
    let env = TestEnv::new("fault_bridge_portmap");
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
    let extra = json!({"ipMasq": true, "macspoofchk": true});
    let (walk, bridge_conf) = Walk::bridge(&env, "faultnet", ipam, extra);
    let id = cid("fault-br");
    let bridge_steps = Steps::alone("bridge", &bridge_conf);
    let points = FAULTS.map(|fault| walk.every(fault, &id, &bridge_steps));
    eprintln!("bridge ADD: {points:?} failure points ({FAULTS:?}), each failed once");
    assert!(points[0] > 5 && points[1] > 0, "{points:?}");

    // portmap after a bridge ADD that works; the runtime then DELs both.
    let add_bridge = || walk.call("bridge", "ADD", &id, &bridge_conf).run().result();
    let prev = add_bridge();
    walk.call("bridge", "DEL", &id, &bridge_conf)
        .run()
        .ok_silent();
    let mappings = json!([{"hostPort": host_port(), "containerPort": 80, "protocol": "tcp"}]);
    let pm = json!({
        "cniVersion": "1.0.0", "name": "faultnet", "type": "portmap",
        "runtimeConfig": {"portMappings": mappings}, "prevResult": prev,
    });
    let portmap_steps = Steps {
        plugin: "portmap",
        conf: pm.clone(),
        before: &|| drop(add_bridge()),
        dels: vec![("portmap", pm.clone()), ("bridge", bridge_conf.clone())],
    };
    let points = FAULTS.map(|fault| walk.every(fault, &id, &portmap_steps));
    eprintln!("portmap ADD: {points:?} failure points ({FAULTS:?}), each failed once");
    assert!(points[0] > 0, "{points:?}");
}

/// macvlan over in-process ipamd: every send of its ADD fails once.
#[test]
fn every_failure_point_of_a_macvlan_add_leaves_nothing() {
    let env = TestEnv::new("fault_macvlan");
    let (master, _) = env.veth_pair();
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
    let conf = json!({
        "cniVersion": "1.0.0", "name": "faultmv", "type": "macvlan", "master": master,
        "ipam": ipam,
    });
    let walk = Walk::new(&env, "faultmv", ipam, None);
    let steps = Steps::alone("macvlan", &conf);
    let id = cid("fault-mv");
    let points = FAULTS.map(|fault| walk.every(fault, &id, &steps));
    eprintln!("macvlan ADD: {points:?} failure points ({FAULTS:?}), each failed once");
    assert!(points[0] > 3 && points[1] > 0, "{points:?}");
}

/// ptp with ipMasq over in-process ipamd (dual stack): every kernel send and
/// every lease write and fsync of its ADD fails once, and leaves no veth (the
/// host end is found by its alias), lease or masquerade entry.
#[test]
fn every_failure_point_of_a_ptp_add_leaves_nothing() {
    let env = TestEnv::new("fault_ptp");
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
    let conf = json!({
        "cniVersion": "1.0.0", "name": "faultptp", "type": "ptp", "ipMasq": true, "ipam": ipam,
    });
    let walk = Walk::new(&env, "faultptp", ipam, None);
    let steps = Steps::alone("ptp", &conf);
    let id = cid("fault-ptp");
    let points = FAULTS.map(|fault| walk.every(fault, &id, &steps));
    eprintln!("ptp ADD: {points:?} failure points ({FAULTS:?}), each failed once");
    assert!(points[0] > 10 && points[1] > 0, "{points:?}");
}

/// dummy over in-process ipamd (dual stack): every kernel send and every lease write and
/// fsync of its ADD fails once. On a kernel without dummy links (the CI machine's) the ADD
/// ends in code 101 instead of a result: the walk then covers the sends before the create,
/// and the store is never reached (no lease is taken before the link exists).
#[test]
fn every_failure_point_of_a_dummy_add_leaves_nothing() {
    let env = TestEnv::new("fault_dummy");
    let probe = env.link_name("fdp");
    let has_dummy = sh("ip", &["link", "add", &probe, "type", "dummy"]).0;
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
    let conf = json!({"cniVersion": "1.0.0", "name": "faultdm", "type": "dummy", "ipam": ipam});
    let walk = Walk::new(&env, "faultdm", ipam, None);
    let steps = Steps::alone("dummy", &conf);
    let id = cid("fault-dm");
    if has_dummy {
        let points = FAULTS.map(|fault| walk.every(fault, &id, &steps));
        eprintln!("dummy ADD: {points:?} failure points ({FAULTS:?}), each failed once");
        assert!(points[0] > 3 && points[1] > 0, "{points:?}");
        return;
    }
    for n in 1..MAX_SENDS {
        let what = format!("dummy ADD failing at CNIKIT_FAULT_NETLINK={n}");
        let out = walk
            .call("dummy", "ADD", &id, &conf)
            .env("CNIKIT_FAULT_NETLINK", &n.to_string())
            .run();
        let e = out.err();
        walk.call("dummy", "DEL", &id, &conf).run().ok_silent();
        walk.assert_clean(&id, &what);
        if !e.msg.contains("injected failure") {
            assert_eq!(e.code, 101, "{what}: {e:?}");
            eprintln!("dummy ADD without kernel support: {} failure points", n - 1);
            assert!(n > 2, "{n}");
            return;
        }
    }
    panic!("dummy ADD still failing after {MAX_SENDS} injected failures");
}

/// vlan over in-process ipamd (dual stack) on a veth master: every kernel send and every
/// lease write and fsync of its ADD fails once. On a kernel without 802.1Q (the CI
/// machine's) the ADD ends in code 101 instead: the walk then covers the sends before
/// the create, and the store is never reached (no lease is taken before the link exists).
#[test]
fn every_failure_point_of_a_vlan_add_leaves_nothing() {
    let env = TestEnv::new("fault_vlan");
    let (master, _) = env.veth_pair();
    let probe = env.link_name("fvp");
    let has_vlan = sh(
        "ip",
        &[
            "link", "add", "link", &master, &probe, "type", "vlan", "id", "9",
        ],
    )
    .0;
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
    let conf = json!({"cniVersion": "1.0.0", "name": "faultvl", "type": "vlan",
        "master": master, "vlanId": 10, "ipam": ipam});
    let walk = Walk::new(&env, "faultvl", ipam, None);
    let steps = Steps::alone("vlan", &conf);
    let id = cid("fault-vl");
    if has_vlan {
        let points = FAULTS.map(|fault| walk.every(fault, &id, &steps));
        eprintln!("vlan ADD: {points:?} failure points ({FAULTS:?}), each failed once");
        assert!(points[0] > 3 && points[1] > 0, "{points:?}");
        return;
    }
    for n in 1..MAX_SENDS {
        let what = format!("vlan ADD failing at CNIKIT_FAULT_NETLINK={n}");
        let out = walk
            .call("vlan", "ADD", &id, &conf)
            .env("CNIKIT_FAULT_NETLINK", &n.to_string())
            .run();
        let e = out.err();
        walk.call("vlan", "DEL", &id, &conf).run().ok_silent();
        walk.assert_clean(&id, &what);
        if !e.msg.contains("injected failure") {
            assert_eq!(e.code, 101, "{what}: {e:?}");
            eprintln!("vlan ADD without kernel support: {} failure points", n - 1);
            assert!(n > 2, "{n}");
            return;
        }
    }
    panic!("vlan ADD still failing after {MAX_SENDS} injected failures");
}

/// bridge over host-local (in-process, dual stack): every kernel send and every lease
/// write and fsync of its ADD fails once; then tuning chained after it: every kernel
/// send of its ADD fails once, and each failure puts the sysctls and the link back and
/// leaves no backup.
#[test]
fn every_failure_point_of_host_local_and_tuning_adds_leaves_nothing() {
    let env = TestEnv::new("fault_host_local_tuning");
    let ipam = env.ipam(Ipam::HostLocal, env.subnets().dual_ranges());
    let (walk, bridge_conf) = Walk::bridge(&env, "faulthl", ipam, json!({}));
    let id = cid("fault-hl");
    let steps = Steps::alone("bridge", &bridge_conf);
    let points = FAULTS.map(|fault| walk.every(fault, &id, &steps));
    eprintln!("bridge + host-local ADD: {points:?} failure points ({FAULTS:?})");
    // Two lease files written and fsynced, two round-robin hints, the directory.
    assert!(points[0] > 5 && points[1] >= 5, "{points:?}");

    let prev = walk.call("bridge", "ADD", &id, &bridge_conf).run().result();
    let dir = env.dir("tuning");
    let tuning = json!({
        "cniVersion": "1.0.0", "name": "faulthl", "type": "tuning", "dataDir": dir,
        "prevResult": prev, "mac": "0a:58:00:00:00:99", "mtu": 1400, "promisc": true,
        "allmulti": true, "txQLen": 50,
        "sysctl": {"net.core.somaxconn": "1000", "net.ipv4.conf.IFNAME.arp_notify": "1"},
    });
    let state = || {
        let ns = &walk.ns.name;
        let read = |key: &str| {
            let path = format!("/proc/sys/{key}");
            sh("ip", &["netns", "exec", ns, "cat", &path]).1
        };
        let l = link(Some(ns), "eth0").expect("eth0");
        json!({"somaxconn": read("net/core/somaxconn"),
               "arp_notify": read("net/ipv4/conf/eth0/arp_notify"),
               "mtu": l["mtu"], "address": l["address"], "txqlen": l["txqlen"],
               "flags": l["flags"]})
    };
    let before = state();
    for n in 1..MAX_SENDS {
        let out = walk
            .call("tuning", "ADD", &id, &tuning)
            .env("CNIKIT_FAULT_NETLINK", &n.to_string())
            .run();
        if out.success() {
            eprintln!("tuning ADD: {} failure points", n - 1);
            assert!(n > 5, "every link setting is a send of its own: {n}");
            break;
        }
        let what = format!("tuning ADD failing at CNIKIT_FAULT_NETLINK={n}");
        assert!(out.err().msg.contains("injected failure"), "{what}");
        assert_eq!(state(), before, "{what}: not all put back");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "{what}: a backup is left"
        );
    }
    for (plugin, conf) in [("tuning", &tuning), ("bridge", &bridge_conf)] {
        walk.call(plugin, "DEL", &id, conf).run().ok_silent();
    }
    walk.assert_clean(&id, "after the DELs");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// tap over in-process ipamd (dual stack): every kernel send and every lease write and
/// fsync of its ADD fails once, and leaves no tap and no lease.
#[test]
fn every_failure_point_of_a_tap_add_leaves_nothing() {
    let env = TestEnv::new("fault_tap");
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
    let conf = json!({"cniVersion": "1.0.0", "name": "faulttap", "type": "tap", "mtu": 1400,
        "mac": "0a:58:00:00:00:11", "ipam": ipam});
    let walk = Walk::new(&env, "faulttap", ipam, None);
    let steps = Steps::alone("tap", &conf);
    let id = cid("fault-tap");
    let points = FAULTS.map(|fault| walk.every(fault, &id, &steps));
    eprintln!("tap ADD: {points:?} failure points ({FAULTS:?}), each failed once");
    assert!(points[0] > 5 && points[1] > 0, "{points:?}");
}

/// sbr chained after bridge + ipamd (dual stack, with a default route): every kernel send
/// of its ADD fails once, and each failure leaves the pod's rules and routes (every table)
/// as they were before it; the DELs then leave nothing.
#[test]
fn every_failure_point_of_an_sbr_add_puts_rules_and_routes_back() {
    let env = TestEnv::new("fault_sbr");
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
    let extra = json!({"isDefaultGateway": true});
    let (walk, bridge_conf) = Walk::bridge(&env, "faultsbr", ipam, extra);
    let id = cid("fault-sbr");
    let prev = walk.call("bridge", "ADD", &id, &bridge_conf).run().result();
    let sbr = json!({"cniVersion": "1.0.0", "name": "faultsbr", "type": "sbr", "prevResult": prev});
    let ns = walk.ns.name.clone();
    let state = || {
        let show = |args: &[&str]| ip(&[&["-n", ns.as_str()][..], args].concat());
        [
            show(&["-d", "-4", "rule"]),
            show(&["-d", "-6", "rule"]),
            show(&["-d", "-4", "route", "show", "table", "all"]),
            show(&["-d", "-6", "route", "show", "table", "all"]),
        ]
        .concat()
    };
    let before = state();
    assert!(before.contains("default via"), "{before}");
    for n in 1..MAX_SENDS {
        let out = walk
            .call("sbr", "ADD", &id, &sbr)
            .env("CNIKIT_FAULT_NETLINK", &n.to_string())
            .run();
        if out.success() {
            eprintln!("sbr ADD: {} failure points", n - 1);
            assert!(
                n > 8,
                "rules, routes and deletes are sends of their own: {n}"
            );
            break;
        }
        let what = format!("sbr ADD failing at CNIKIT_FAULT_NETLINK={n}");
        assert!(out.err().msg.contains("injected failure"), "{what}");
        assert_eq!(state(), before, "{what}: not all put back");
    }
    assert_ne!(state(), before, "the last ADD worked");
    for (plugin, conf) in [("sbr", &sbr), ("bridge", &bridge_conf)] {
        walk.call(plugin, "DEL", &id, conf).run().ok_silent();
    }
    walk.assert_clean(&id, "after the DELs");
    assert!(!state().contains("lookup 10"), "a rule is left");
}
