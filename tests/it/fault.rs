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

impl Walk<'_> {
    /// Nothing of container `id` is left: only lo in the netns, no lease, no
    /// nft element, no portmap marker, no port on the bridge.
    fn assert_clean(&self, id: &str, what: &str) {
        assert_only_lo(&self.ns, what);
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
                .env
                .plugin(steps.plugin)
                .attach("ADD", id, &self.ns, "eth0")
                .env(fault, &n.to_string())
                .conf(&steps.conf)
                .run();
            let failed = !out.success();
            if failed {
                let e = out.err();
                let text = format!("{} {}", e.msg, e.details);
                assert!(text.contains("injected failure"), "{what}: {e:?}");
            }
            for del in &steps.dels {
                self.env
                    .plugin(del.0)
                    .attach("DEL", id, &self.ns, "eth0")
                    .conf(&del.1)
                    .run()
                    .ok_silent();
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

/// bridge with ipMasq and macspoofchk over in-process ipamd, then portmap
/// chained after it: every send of each ADD fails once.
#[test]
fn every_failure_point_of_a_bridge_portmap_add_leaves_nothing() {
    let env = TestEnv::new("fault_bridge_portmap");
    let bridge = env.link_name("fbr");
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
    let bridge_conf = json!({
        "cniVersion": "1.0.0", "name": "faultnet", "type": "bridge", "bridge": bridge,
        "isGateway": true, "ipMasq": true, "macspoofchk": true, "ipam": ipam,
    });
    let walk = Walk {
        env: &env,
        ns: env.netns(),
        ipam,
        network: "faultnet",
        host_ports: Some(bridge.clone()),
    };
    let id = cid("fault-br");
    let bridge_steps = Steps {
        plugin: "bridge",
        conf: bridge_conf.clone(),
        before: &|| {},
        dels: vec![("bridge", bridge_conf.clone())],
    };
    let points = FAULTS.map(|fault| walk.every(fault, &id, &bridge_steps));
    eprintln!("bridge ADD: {points:?} failure points ({FAULTS:?}), each failed once");
    assert!(points[0] > 5 && points[1] > 0, "{points:?}");

    // portmap after a bridge ADD that works; the runtime then DELs both.
    let add_bridge = || {
        env.plugin("bridge")
            .attach("ADD", &id, &walk.ns, "eth0")
            .conf(&bridge_conf)
            .run()
            .result()
    };
    let del_bridge = || {
        env.plugin("bridge")
            .attach("DEL", &id, &walk.ns, "eth0")
            .conf(&bridge_conf)
            .run()
            .ok_silent();
    };
    let prev = add_bridge();
    del_bridge();
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
    let walk = Walk {
        env: &env,
        ns: env.netns(),
        ipam,
        network: "faultmv",
        host_ports: None,
    };
    let steps = Steps {
        plugin: "macvlan",
        conf: conf.clone(),
        before: &|| {},
        dels: vec![("macvlan", conf.clone())],
    };
    let id = cid("fault-mv");
    let points = FAULTS.map(|fault| walk.every(fault, &id, &steps));
    eprintln!("macvlan ADD: {points:?} failure points ({FAULTS:?}), each failed once");
    assert!(points[0] > 3 && points[1] > 0, "{points:?}");
}

/// bridge over host-local (in-process, dual stack): every kernel send and every lease
/// write and fsync of its ADD fails once; then tuning chained after it: every kernel
/// send of its ADD fails once, and each failure puts the sysctls and the link back and
/// leaves no backup.
#[test]
fn every_failure_point_of_host_local_and_tuning_adds_leaves_nothing() {
    let env = TestEnv::new("fault_host_local_tuning");
    let bridge = env.link_name("fhl");
    let ipam = env.ipam(Ipam::HostLocal, env.subnets().dual_ranges());
    let bridge_conf = json!({
        "cniVersion": "1.0.0", "name": "faulthl", "type": "bridge", "bridge": bridge,
        "isGateway": true, "ipam": ipam,
    });
    let walk = Walk {
        env: &env,
        ns: env.netns(),
        ipam,
        network: "faulthl",
        host_ports: Some(bridge.clone()),
    };
    let id = cid("fault-hl");
    let steps = Steps {
        plugin: "bridge",
        conf: bridge_conf.clone(),
        before: &|| {},
        dels: vec![("bridge", bridge_conf.clone())],
    };
    let points = FAULTS.map(|fault| walk.every(fault, &id, &steps));
    eprintln!("bridge + host-local ADD: {points:?} failure points ({FAULTS:?})");
    // Two lease files written and fsynced, two round-robin hints, the directory.
    assert!(points[0] > 5 && points[1] >= 5, "{points:?}");

    let prev = env
        .plugin("bridge")
        .attach("ADD", &id, &walk.ns, "eth0")
        .conf(&bridge_conf)
        .run()
        .result();
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
        let out = env
            .plugin("tuning")
            .attach("ADD", &id, &walk.ns, "eth0")
            .env("CNIKIT_FAULT_NETLINK", &n.to_string())
            .conf(&tuning)
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
    for plugin in ["tuning", "bridge"] {
        let conf = if plugin == "tuning" {
            &tuning
        } else {
            &bridge_conf
        };
        env.plugin(plugin)
            .attach("DEL", &id, &walk.ns, "eth0")
            .conf(conf)
            .run()
            .ok_silent();
    }
    walk.assert_clean(&id, "after the DELs");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}
