//! static: cnikit's against Debian's reference (/usr/lib/cni/static, 1.1.1) on the same
//! configurations, CNI_ARGS and versions (the same results and the same failures), the
//! verbs and route keys the reference lacks, and static behind macvlan (Multus's example
//! shape, in-process and with the reference static exec'd) and bridge on the kernel.

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// An IPAM plugin never enters the netns; the runtime still names one.
const NETNS: &str = "/run/netns/static-unused";
/// The versions Debian's static speaks (1.1.0 came later).
const REF_VERSIONS: [&str; 6] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// A network configuration for `version` whose `ipam` is static's `ipam` keys, with the
/// `extra` top-level keys.
fn conf(version: &str, ipam: Value, extra: Value) -> Value {
    let mut ipam = ipam;
    ipam["type"] = json!("static");
    merged(
        json!({"cniVersion": version, "name": "stnet", "type": "macvlan", "ipam": ipam}),
        extra,
    )
}

/// `verb` of ours or of the reference, alone, for container `ctr-st`.
fn call(env: &TestEnv, reference: bool, verb: &str, conf: &Value, cni_args: &str) -> Outcome {
    let p = if reference {
        env.ref_plugin("static")
    } else {
        env.plugin("static")
    };
    p.command(verb)
        .container("ctr-st")
        .netns_path(NETNS)
        .ifname("eth0")
        .cni_args(cni_args)
        .conf(conf)
        .run()
}

/// The reference's error objects may lack `cniVersion`.
fn failed(o: &Outcome) -> CniError {
    assert!(!o.success(), "unexpected success: {}", o.stdout);
    parse_error_object(&o.stdout, true).unwrap()
}

/// The side-by-side cases: a label, static's `ipam` keys, top-level keys and CNI_ARGS.
fn cases() -> Vec<(&'static str, Value, Value, &'static str)> {
    let configured = json!({
        "addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
                      {"address": "3ffe:ffff:0:01ff::1/64"}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.10.0.254"},
                   {"dst": "3ffe:ffff:0:01ff::1/64", "gw": "3ffe:ffff:0::1"},
                   {"dst": "192.168.0.0/16"}],
        "dns": {"nameservers": ["8.8.8.8"], "domain": "example.com",
                "search": ["example.com"], "options": ["ndots:2"]},
    });
    let two_v4 = json!({"addresses": [{"address": "10.10.0.1/24"}, {"address": "10.10.1.1/24"}]});
    let args = json!({"args": {"cni": {"ips": ["10.10.0.2/24", "3ffe:ffff:0:01ff::2/64"]}}});
    let runtime = json!({"capabilities": {"ips": true},
                         "runtimeConfig": {"ips": ["10.10.0.3/24", "3ffe:ffff:0:01ff::3/64"]}});
    let both = merged(args.clone(), runtime.clone());
    let no_prefix = json!({"addresses": [{"address": "10.10.0.1"}]});
    let env_pair = "IP=10.10.0.5/24,11.11.0.5/24;GATEWAY=10.10.0.254";
    vec![
        ("configured", configured.clone(), json!({}), ""),
        ("CNI_ARGS", json!({}), json!({}), env_pair),
        (
            "configured + CNI_ARGS",
            configured.clone(),
            json!({}),
            env_pair,
        ),
        (
            "GATEWAY skips configured",
            configured.clone(),
            json!({}),
            "GATEWAY=10.10.0.9",
        ),
        ("args.cni.ips", configured.clone(), args, env_pair),
        ("runtimeConfig.ips", configured.clone(), runtime, env_pair),
        ("all three", configured.clone(), both, env_pair),
        (
            "RuntimeConfig spelled as Go",
            json!({}),
            json!({"RuntimeConfig": {"ips": ["10.10.0.4/24"]}}),
            "",
        ),
        (
            "IgnoreUnknown",
            json!({}),
            json!({}),
            "IgnoreUnknown=1;K8S_POD_NAME=web;IP=10.10.0.6/24",
        ),
        (
            "unknown CNI_ARGS key",
            json!({}),
            json!({}),
            "K8S_POD_NAME=web",
        ),
        ("two v4", two_v4, json!({}), ""),
        ("none", json!({}), json!({}), ""),
        ("address without prefix", no_prefix.clone(), json!({}), ""),
        (
            "replaced address without prefix",
            no_prefix,
            json!({"runtimeConfig": {"ips": ["10.10.0.3/24"]}}),
            "",
        ),
        (
            "CNI_ARGS IP without prefix",
            json!({}),
            json!({}),
            "IP=10.10.0.5",
        ),
        (
            "bad GATEWAY",
            json!({}),
            json!({}),
            "IP=10.10.0.5/24;GATEWAY=x",
        ),
        (
            "runtimeConfig.ips without prefix",
            json!({}),
            json!({"runtimeConfig": {"ips": ["10.10.0.3"]}}),
            "",
        ),
    ]
}

/// Proves: for every case and every version both speak, ours prints exactly the
/// reference's result, or fails where it fails (code 7, or 4 for CNI_ARGS, where the
/// reference says 999); DEL succeeds silently for both whatever the input.
#[test]
fn same_results_and_failures_as_the_reference() {
    let env = TestEnv::new("static_same_as_reference");
    let mut compared = 0;
    for (label, ipam, extra, cni_args) in cases() {
        for version in REF_VERSIONS {
            let c = conf(version, ipam.clone(), extra.clone());
            let what = format!("{label} at {version} (CNI_ARGS {cni_args:?})");
            let theirs = call(&env, true, "ADD", &c, cni_args);
            let ours = call(&env, false, "ADD", &c, cni_args);
            if theirs.success() {
                assert_eq!(ours.result(), theirs.result(), "{what}");
                compared += 1;
            } else {
                let want = if label.contains("CNI_ARGS key") { 4 } else { 7 };
                let e = ours.err();
                assert_eq!(
                    e.code,
                    want,
                    "{what}: ours {e:?}, reference {:?}",
                    failed(&theirs)
                );
            }
            for reference in [true, false] {
                call(&env, reference, "DEL", &c, cni_args).ok_silent();
            }
        }
    }
    // Sanity: most cases are results, not failures on both sides.
    assert!(compared > 40, "{compared} results compared");
}

/// Proves: CHECK (0.4.0, 1.0.0) passes on the ADD's own result for ours and the
/// reference; both fail without prevResult and on a gateway that differs; an address
/// missing from prevResult fails ours (code 103) where the reference lets it pass.
#[test]
fn check_as_the_reference_and_stricter_on_a_missing_address() {
    let env = TestEnv::new("static_check");
    let ipam = json!({"addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"}]});
    for version in ["0.4.0", "1.0.0"] {
        let c = conf(version, ipam.clone(), json!({}));
        let prev = call(&env, true, "ADD", &c, "").result();
        for reference in [true, false] {
            call(&env, reference, "CHECK", &with_prev(&c, &prev), "").ok_silent();
            failed(&call(&env, reference, "CHECK", &c, ""));
            let mut other_gw = prev.clone();
            other_gw["ips"][0]["gateway"] = json!("10.10.0.1");
            failed(&call(
                &env,
                reference,
                "CHECK",
                &with_prev(&c, &other_gw),
                "",
            ));
        }
        let mut elsewhere = prev.clone();
        elsewhere["ips"][0]["address"] = json!("10.10.0.9/24");
        let c = with_prev(&c, &elsewhere);
        call(&env, true, "CHECK", &c, "").ok_silent();
        call(&env, false, "CHECK", &c, "").expect_err(103, &["10.10.0.1", "prevResult"]);
    }
}

/// Proves: at 1.1.0 (which the reference 1.1.1 does not speak) a route's mtu, advmss,
/// priority, table and scope reach the result as v1.9.1 prints them; STATUS and GC
/// succeed silently, with nothing to check or collect.
#[test]
fn version_1_1_0_route_keys_status_and_gc() {
    let env = TestEnv::new("static_1_1_0");
    let c = conf(
        "1.1.0",
        json!({"addresses": [{"address": "10.10.0.1/24"}],
               "routes": [{"dst": "0.0.0.0/0", "gw": "10.10.0.254", "mtu": 1400,
                           "advmss": 1360, "priority": 100, "table": 100, "scope": 0}]}),
        json!({}),
    );
    let r = call(&env, false, "ADD", &c, "").result();
    assert_eq!(
        r["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "10.10.0.254", "mtu": 1400, "advmss": 1360,
                "priority": 100, "table": 100, "scope": 0}])
    );
    for verb in ["STATUS", "GC"] {
        env.plugin("static")
            .command(verb)
            .env("CNI_PATH", "/nonexistent")
            .conf(&merged(c.clone(), json!({"cni.dev/valid-attachments": []})))
            .run()
            .ok_silent();
    }
}

/// Multus's macvlan + static example: `master`, bridge mode, one address with its gateway
/// and a default route; `addresses` from the configuration or from `runtimeConfig.ips`.
fn multus_conf(version: &str, master: &str, ipam: Value, extra: Value) -> Value {
    let mut ipam = ipam;
    ipam["type"] = json!("static");
    merged(
        json!({"cniVersion": version, "name": "macvlan-conf", "type": "macvlan",
               "master": master, "mode": "bridge", "ipam": ipam}),
        extra,
    )
}

fn set(items: &[String]) -> BTreeSet<String> {
    items.iter().cloned().collect()
}

/// Proves: two pods on one master, each given its address by static (one in the
/// configuration, one through `runtimeConfig.ips`, capability `ips`), have exactly that
/// address and the configured routes (and the kernel's subnet route), nothing else; they
/// reach each other; CHECK (1.0.0) passes; DEL, twice, removes the link.
#[test]
fn macvlan_with_static_gives_the_pod_exactly_its_address_and_routes() {
    let env = TestEnv::new("static_macvlan");
    for version in ["0.3.1", "1.0.0"] {
        let (master, _) = env.veth_pair();
        let nets = env.subnets();
        let gw = nets.v4_addr(254);
        let table =
            json!([{"dst": "0.0.0.0/0"}, {"dst": "192.168.77.0/24", "gw": nets.v4_addr(253)}]);
        let a = multus_conf(
            version,
            &master,
            json!({"addresses": [{"address": format!("{}/24", nets.v4_addr(1)), "gateway": gw}],
                   "routes": table}),
            json!({}),
        );
        let b = multus_conf(
            version,
            &master,
            json!({"routes": table}),
            json!({"capabilities": {"ips": true},
                   "runtimeConfig": {"ips": [format!("{}/24", nets.v4_addr(2))]}}),
        );
        let pods = [
            env.new_attachment("macvlan", "sa", &a),
            env.new_attachment("macvlan", "sb", &b),
        ];
        let results: Vec<Value> = pods.iter().map(|p| p.add()).collect();
        for (host, (pod, r)) in [1u8, 2].into_iter().zip(pods.iter().zip(&results)) {
            let addr = format!("{}/24", nets.v4_addr(host));
            assert_eq!(result_addresses(r), [addr.as_str()], "{version}: {r}");
            assert_eq!(addrs(Some(&pod.ns.name), "eth0"), set(&[addr]), "{version}");
            let mut want = vec![
                format!("{} dev eth0", nets.v4),
                format!("192.168.77.0/24 via {} dev eth0", nets.v4_addr(253)),
            ];
            // The gateway-less default route takes the address's gateway; runtimeConfig.ips
            // carry none, so there it is a device route (as the reference makes it).
            want.push(match host {
                1 => format!("default via {gw} dev eth0"),
                _ => "default dev eth0".to_string(),
            });
            assert_eq!(routes(Some(&pod.ns.name), "-4"), set(&want), "{version}");
        }
        assert_ping(&pods[0].ns.name, &nets.v4_addr(2));
        if version == "1.0.0" {
            for (pod, r) in pods.iter().zip(&results) {
                pod.check(r);
            }
        }
        for pod in &pods {
            pod.del_twice();
            assert!(link(Some(&pod.ns.name), "eth0").is_none(), "{version}");
        }
    }
}

/// Proves: `CNI_ARGS IP=…;GATEWAY=…` without IgnoreUnknown passes macvlan (which reads
/// CNI_ARGS strictly) on its way to static, and the pod gets that address, gateway and
/// default route; with the reference's static first in CNI_PATH (exec'd, not in-process)
/// the result is the same.
#[test]
fn cni_args_through_macvlan_and_the_reference_static_exec_d() {
    let env = TestEnv::new("static_cni_args_macvlan");
    let nets = env.subnets();
    let ipam = json!({"routes": [{"dst": "0.0.0.0/0"}]});
    let mut results = Vec::new();
    for ours_first in [true, false] {
        let (master, _) = env.veth_pair();
        let c = multus_conf("1.0.0", &master, ipam.clone(), json!({}));
        let pod = env.new_attachment("macvlan", "sargs", &c);
        let mut path = vec![env.bin.clone(), env.ref_bin.clone()];
        if !ours_first {
            path.reverse();
        }
        let path = std::env::join_paths(path).unwrap();
        let with_path = |verb: &str| {
            pod.call(verb)
                .env("CNI_PATH", &path.to_string_lossy())
                .cni_args(&format!(
                    "IP={}/24;GATEWAY={}",
                    nets.v4_addr(9),
                    nets.v4_addr(1)
                ))
        };
        let r = with_path("ADD").run().result();
        assert_eq!(
            routes(Some(&pod.ns.name), "-4"),
            set(&[
                format!("{} dev eth0", nets.v4),
                format!("default via {} dev eth0", nets.v4_addr(1)),
            ])
        );
        with_path("CHECK")
            .conf(&with_prev(&c, &r))
            .run()
            .ok_silent();
        with_path("DEL").run().ok_silent();
        results.push(json!({"ips": r["ips"], "routes": r["routes"], "dns": r["dns"]}));
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0]["ips"][0]["gateway"], nets.v4_addr(1));
}

/// Proves: bridge (isGateway) with static: the pod has exactly the static address, the
/// bridge the static gateway, the pod reaches it; CHECK passes; DEL twice.
#[test]
fn bridge_with_static() {
    let env = TestEnv::new("static_bridge");
    let nets = env.subnets();
    let bridge = env.link_name("stbr");
    let c = json!({
        "cniVersion": "1.0.0", "name": "stbr", "type": "bridge", "bridge": bridge,
        "isGateway": true,
        "ipam": {"type": "static",
                 "addresses": [{"address": format!("{}/24", nets.v4_addr(7)),
                                "gateway": nets.v4_addr(1)}],
                 "routes": [{"dst": "0.0.0.0/0"}]},
    });
    let pod = env.new_attachment("bridge", "stbr", &c);
    let r = pod.add();
    let addr = format!("{}/24", nets.v4_addr(7));
    assert_eq!(addrs(Some(&pod.ns.name), "eth0"), set(&[addr]));
    assert!(
        addrs(None, &bridge).contains(&format!("{}/24", nets.v4_addr(1))),
        "the bridge carries the gateway"
    );
    assert_ping(&pod.ns.name, &nets.v4_addr(1));
    pod.check(&r);
    pod.del_twice();
    assert!(link(Some(&pod.ns.name), "eth0").is_none());
}
