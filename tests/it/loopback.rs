//! loopback plugin: what containerd's CRI calls for every pod
//! (`{"cniVersion":"0.3.1","name":"cni-loopback","type":"loopback"}`,
//! `CNI_IFNAME=lo`), compared with Debian's reference plugin.

use crate::support::*;
use serde_json::{json, Value};

fn conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": "cni-loopback", "type": "loopback"})
}

/// Attachment `id` of loopback as `lo` in a fresh netns with `lo` down, as a
/// runtime creates it (the harness brings it up).
fn fresh<'e>(env: &'e TestEnv, id: &str, version: &str) -> Attachment<'e> {
    let ns = env.netns();
    ip(&["-n", &ns.name, "link", "set", "lo", "down"]);
    env.attachment("loopback", id, &ns, &conf(version))
        .with_ifname("lo")
}

fn lo_is_up(ns: &Netns) -> bool {
    has_flag(
        &link(Some(&ns.name), "lo").expect("lo exists in every netns"),
        "UP",
    )
}

/// Debian's reference (1.1.1) prints the 1.0 layout whatever the version:
/// no ips[].version for 0.3.x/0.4.0, which the spec requires and cnikit
/// prints. Compared without it, and without the netns path.
fn normalize(r: &Value, ns: &Netns) -> Value {
    let text = r.to_string().replace(&ns.path, "NETNS");
    let mut r: Value = serde_json::from_str(&text).unwrap();
    for ip in r["ips"].as_array_mut().into_iter().flatten() {
        ip.as_object_mut().unwrap().remove("version");
    }
    r
}

/// Proves: for every version, ADD brings `lo` up and reports it with
/// 127.0.0.1/8 and ::1/128 in that version's layout, as the reference does
/// (whose layout is the 1.0 one for every version); CHECK (≥ 0.4.0) passes; DEL sets `lo` down; DEL again succeeds.
#[test]
fn every_version_matches_the_reference() {
    let env = TestEnv::new("loopback_every_version");
    for version in ALL_VERSIONS {
        let id = format!("lo-{}", short_hash());
        let ours = fresh(&env, &id, version);
        // Debian's reference speaks up to 1.0.0, whose layout 1.1.0 shares.
        let ref_version = if version == "1.1.0" { "1.0.0" } else { version };
        let theirs = fresh(&env, &id, ref_version);
        assert!(!lo_is_up(&ours.ns), "a new netns has lo down");
        let r = ours.add();
        let mut r_ref = env
            .ref_plugin("loopback")
            .attach("ADD", &id, &theirs.ns, "lo")
            .conf(&theirs.conf)
            .run()
            .result();
        r_ref["cniVersion"] = json!(version);
        assert!(lo_is_up(&ours.ns), "{version}: lo must be up after ADD");
        if version < "0.3.0" {
            // The spec's layout for these versions is ip4/ip6.
            assert_eq!(
                r,
                json!({"cniVersion": version, "ip4": {"ip": "127.0.0.1/8"},
                       "ip6": {"ip": "::1/128"}, "dns": {}}),
                "{version}"
            );
        } else {
            if version < "1.0.0" {
                assert_eq!(r["ips"][1]["version"], "6", "{version}: {r}");
            }
            assert_eq!(
                normalize(&r, &ours.ns),
                normalize(&r_ref, &theirs.ns),
                "{version}: result differs from the reference"
            );
        }
        if version >= "0.4.0" {
            ours.call("CHECK")
                .conf(&with_prev(&ours.conf, &r))
                .run()
                .ok();
        }
        if version == "1.1.0" {
            for verb in ["STATUS", "GC"] {
                ours.call(verb).run().ok();
            }
        }
        for _ in 0..2 {
            ours.call("DEL").run().ok();
        }
        assert!(!lo_is_up(&ours.ns), "{version}: DEL sets lo down");
    }
}

/// Proves: CHECK fails with 100 when lo is down; ADD into a missing netns is
/// code 3; DEL succeeds when the netns is gone and when CNI_NETNS is empty.
#[test]
fn check_down_missing_netns_and_repeated_del() {
    let env = TestEnv::new("loopback_edges");
    let att = fresh(&env, "lo-edges", "1.0.0");
    att.call("CHECK").run().expect_err(100, &["lo", "down"]);
    att.call("ADD")
        .netns_path("/run/netns/does-not-exist")
        .run()
        .expect_err(3, &["does-not-exist"]);
    let r = att.add();
    env.del_netns(&att.ns);
    att.call("DEL").conf(&with_prev(&att.conf, &r)).run().ok();
    att.call("DEL").netns_path("").run().ok();
}

/// Proves: chained after another plugin, loopback passes prevResult through.
#[test]
fn chained_passes_prev_result_through() {
    let (env, ns) = TestEnv::with_netns("loopback_chained");
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": ns.path}],
        "ips": [{"address": "10.1.2.3/24", "interface": 0}],
    });
    let r = env
        .attachment(
            "loopback",
            "lo-chain",
            &ns,
            &with_prev(&conf("1.0.0"), &prev),
        )
        .with_ifname("lo")
        .add();
    assert_eq!(r["ips"][0]["address"], "10.1.2.3/24", "{r}");
    assert!(lo_is_up(&ns));
}

/// Proves: loopback takes any `CNI_ARGS` — keys nobody declared without
/// IgnoreUnknown, a malformed pair — on ADD, CHECK and DEL, as the reference
/// (which never reads them) does: both answer ADD with the same result.
#[test]
fn any_cni_args_as_the_reference() {
    let env = TestEnv::new("loopback_any_cni_args");
    let args = "K8S_POD_NAME=web-1;K8S_POD_NAMESPACE=default;novalue";
    let ours = fresh(&env, "lo-args", "1.0.0");
    let theirs = fresh(&env, "lo-args", "1.0.0");
    let r = ours.call("ADD").cni_args(args).run().result();
    let r_ref = env
        .ref_plugin("loopback")
        .attach("ADD", "lo-args", &theirs.ns, "lo")
        .cni_args(args)
        .conf(&theirs.conf)
        .run()
        .result();
    assert_eq!(normalize(&r, &ours.ns), normalize(&r_ref, &theirs.ns));
    assert!(lo_is_up(&ours.ns));
    ours.call("CHECK")
        .cni_args(args)
        .conf(&with_prev(&ours.conf, &r))
        .run()
        .ok_silent();
    ours.call("DEL").cni_args(args).run().ok_silent();
    assert!(!lo_is_up(&ours.ns));
}
