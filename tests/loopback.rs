//! loopback plugin: what containerd's CRI calls for every pod
//! (`{"cniVersion":"0.3.1","name":"cni-loopback","type":"loopback"}`,
//! `CNI_IFNAME=lo`), compared with Debian's reference plugin.

mod common;

use common::*;
use serde_json::{json, Value};

fn conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": "cni-loopback", "type": "loopback"})
}

/// A netns with `lo` down, as a runtime creates it (the harness brings it up).
fn fresh_netns(env: &TestEnv) -> Netns {
    let ns = env.netns();
    ip(&["-n", &ns.name, "link", "set", "lo", "down"]);
    ns
}

fn lo_is_up(ns: &Netns) -> bool {
    let l = link(Some(&ns.name), "lo").expect("lo exists in every netns");
    l["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "UP"))
}

/// Proves: for every version, ADD brings `lo` up and reports it with
/// 127.0.0.1/8 and ::1/128 in that version's layout, as the reference does
/// (whose layout is the 1.0 one for every version); CHECK (≥ 0.4.0) passes; DEL sets `lo` down; DEL again succeeds.
#[test]
fn every_version_matches_the_reference() {
    let env = TestEnv::new("loopback_every_version");
    for version in ALL_VERSIONS {
        let ours_ns = fresh_netns(&env);
        let ref_ns = fresh_netns(&env);
        assert!(!lo_is_up(&ours_ns), "a new netns has lo down");
        let id = format!("lo-{}", short_hash());
        let ours = env
            .plugin("loopback")
            .attach("ADD", &id, &ours_ns, "lo")
            .conf(&conf(version))
            .run()
            .result();
        // Debian's reference speaks up to 1.0.0, whose layout 1.1.0 shares.
        let ref_version = if version == "1.1.0" { "1.0.0" } else { version };
        let mut theirs = env
            .ref_plugin("loopback")
            .attach("ADD", &id, &ref_ns, "lo")
            .conf(&conf(ref_version))
            .run()
            .result();
        theirs["cniVersion"] = json!(version);
        assert!(lo_is_up(&ours_ns), "{version}: lo must be up after ADD");
        // Debian's reference (1.1.1) prints the 1.0 layout whatever the
        // version: no ips[].version for 0.3.x/0.4.0, which the spec requires
        // and cnikit prints. Compared without it.
        let normalize = |r: Value, ns: &Netns| {
            let text = r.to_string().replace(&ns.path, "NETNS");
            let mut r: Value = serde_json::from_str(&text).unwrap();
            for ip in r["ips"].as_array_mut().into_iter().flatten() {
                ip.as_object_mut().unwrap().remove("version");
            }
            r
        };
        if version < "0.3.0" {
            // The spec's layout for these versions is ip4/ip6.
            assert_eq!(
                ours,
                json!({"cniVersion": version, "ip4": {"ip": "127.0.0.1/8"},
                       "ip6": {"ip": "::1/128"}, "dns": {}}),
                "{version}"
            );
        } else {
            if version < "1.0.0" {
                assert_eq!(ours["ips"][1]["version"], "6", "{version}: {ours}");
            }
            assert_eq!(
                normalize(ours.clone(), &ours_ns),
                normalize(theirs, &ref_ns),
                "{version}: result differs from the reference"
            );
        }
        if version >= "0.4.0" {
            env.plugin("loopback")
                .attach("CHECK", &id, &ours_ns, "lo")
                .conf(&with_prev(&conf(version), &ours))
                .run()
                .ok();
        }
        if version == "1.1.0" {
            for verb in ["STATUS", "GC"] {
                env.plugin("loopback")
                    .attach(verb, &id, &ours_ns, "lo")
                    .conf(&conf(version))
                    .run()
                    .ok();
            }
        }
        for _ in 0..2 {
            env.plugin("loopback")
                .attach("DEL", &id, &ours_ns, "lo")
                .conf(&conf(version))
                .run()
                .ok();
        }
        assert!(!lo_is_up(&ours_ns), "{version}: DEL sets lo down");
    }
}

/// Proves: CHECK fails with 100 when lo is down; ADD into a missing netns is
/// code 3; DEL succeeds when the netns is gone and when CNI_NETNS is empty.
#[test]
fn check_down_missing_netns_and_repeated_del() {
    let env = TestEnv::new("loopback_edges");
    let ns = fresh_netns(&env);
    let c = conf("1.0.0");
    let id = "lo-edges";
    env.plugin("loopback")
        .attach("CHECK", id, &ns, "lo")
        .conf(&c)
        .run()
        .expect_err(100, &["lo", "down"]);
    env.plugin("loopback")
        .attach("ADD", id, &ns, "lo")
        .netns_path("/run/netns/does-not-exist")
        .conf(&c)
        .run()
        .expect_err(3, &["does-not-exist"]);
    let r = env
        .plugin("loopback")
        .attach("ADD", id, &ns, "lo")
        .conf(&c)
        .run()
        .result();
    env.del_netns(&ns);
    env.plugin("loopback")
        .attach("DEL", id, &ns, "lo")
        .conf(&with_prev(&c, &r))
        .run()
        .ok();
    env.plugin("loopback")
        .attach("DEL", id, &ns, "lo")
        .netns_path("")
        .conf(&c)
        .run()
        .ok();
}

/// Proves: chained after another plugin, loopback passes prevResult through.
#[test]
fn chained_passes_prev_result_through() {
    let env = TestEnv::new("loopback_chained");
    let ns = env.netns();
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": ns.path}],
        "ips": [{"address": "10.1.2.3/24", "interface": 0}],
    });
    let r = env
        .plugin("loopback")
        .attach("ADD", "lo-chain", &ns, "lo")
        .conf(&with_prev(&conf("1.0.0"), &prev))
        .run()
        .result();
    assert_eq!(r["ips"][0]["address"], "10.1.2.3/24", "{r}");
    assert!(lo_is_up(&ns));
}
