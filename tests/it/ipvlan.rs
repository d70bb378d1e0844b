//! ipvlan plugin on a kernel WITHOUT ipvlan support (the test machine's
//! kernel is built without CONFIG_IPVLAN): ADD must fail with the clear
//! "no kernel support" error (code 101), leave nothing behind, and DEL must
//! still succeed.
//!
//! The real-kernel ipvlan tests (two containers pinging over l2/l3/l3s,
//! CHECK, DEL, the pod's eth0 beside the host's own eth0) run in the VM suite
//! (tests/vm); these tests only pin down the behaviour where the kernel lacks it.

use crate::support::*;
use serde_json::{json, Value};

const NET: &str = "ivnet";

fn conf(master: &str, mode: &str, ipam: Value) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NET,
        "type": "ipvlan",
        "master": master,
        "mode": mode,
        "ipam": ipam,
    })
}

/// The test's world and a master (one end of a veth pair), unless this
/// kernel does have ipvlan: then these tests do not apply.
fn env_without_ipvlan(test: &str) -> Option<(TestEnv, String)> {
    let env = TestEnv::new(test);
    let (master, _) = env.veth_pair();
    let probe = env.link_name("ivp");
    let (ok, _, _) = sh(
        "ip",
        &[
            "link", "add", &probe, "link", &master, "type", "ipvlan", "mode", "l2",
        ],
    );
    if ok {
        eprintln!("this kernel supports ipvlan: the no-support tests are skipped (the VM suite covers ipvlan)");
        return None;
    }
    let (master, _) = env.veth_pair();
    Some((env, master))
}

/// Proves: ADD fails with code 101 and a message naming ipvlan and
/// CONFIG_IPVLAN, for every mode and both IPAMs; no interface and no lease
/// are left behind; DEL of the failed attachment succeeds (twice).
#[test]
fn add_fails_with_clear_no_kernel_support_error() {
    let Some((env, master)) = env_without_ipvlan("add_fails_with_clear_no_kernel_support_error")
    else {
        return;
    };
    for kind in Ipam::BOTH {
        for mode in ["l2", "l3", "l3s"] {
            let nets = env.subnets();
            let ipam = env.ipam(kind, nets.v4_ranges());
            let att = env.new_attachment("ipvlan", "iv", &conf(&master, mode, ipam.clone()));
            att.try_add().expect_err(101, &["ipvlan", "CONFIG_IPVLAN"]);
            assert_only_lo(&att.ns, &format!("{kind:?} {mode}: nothing in the netns"));
            assert_eq!(
                env.lease_count(&ipam, NET),
                0,
                "{kind:?} {mode}: no lease left behind"
            );
            att.del_twice();
        }
    }
}

/// Proves: DEL succeeds without kernel support also when the netns is gone
/// or CNI_NETNS is empty (nothing to remove, IPAM DEL still runs).
#[test]
fn del_succeeds_without_netns() {
    let env = TestEnv::new("del_succeeds_without_netns");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let c = conf("nomaster0", "l2", ipam.clone());
    let gone = env.new_attachment("ipvlan", "gone", &c);
    env.del_netns(&gone.ns);
    gone.del();
    env.attachment("ipvlan", &cid("empty"), &gone.ns, &c)
        .del_with_empty_netns();
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: ipvlan without ipam and without prevResult is a config error (7)
/// that says what is missing — checked before any kernel work.
#[test]
fn needs_ipam_or_prev_result() {
    let env = TestEnv::new("needs_ipam_or_prev_result");
    let (master, _) = env.veth_pair();
    let mut c = conf(&master, "l2", json!(null));
    c.as_object_mut().unwrap().remove("ipam");
    env.new_attachment("ipvlan", "noipam", &c)
        .try_add()
        .expect_err(7, &["ipam"]);
}

/// Proves: chained without ipam (addresses from prevResult, master from its
/// single interface, also for `"master": ""`) the no-support error is the
/// same clean 101, whatever `CNI_ARGS` holds: ipvlan, like the reference,
/// does not read them (no IgnoreUnknown needed).
#[test]
fn chained_from_prev_result_fails_cleanly() {
    let Some((env, master)) = env_without_ipvlan("chained_from_prev_result_fails_cleanly") else {
        return;
    };
    let mut c = conf(&master, "l2", json!(null));
    let obj = c.as_object_mut().unwrap();
    obj.remove("ipam");
    obj.remove("master");
    c["prevResult"] = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": master}],
        "ips": [{"address": "10.123.0.5/24", "interface": 0}]
    });
    let att = env.new_attachment("ipvlan", "chain", &c);
    att.try_add().expect_err(101, &["ipvlan", "CONFIG_IPVLAN"]);
    c["master"] = json!("");
    let att = att.chained("ipvlan", &c);
    att.call("ADD")
        .cni_args("K8S_POD_NAME=web-1;K8S_POD_NAMESPACE=default")
        .run()
        .expect_err(101, &["ipvlan", "CONFIG_IPVLAN"]);
    assert_only_lo(&att.ns, "failed ADD");
}

/// Proves: STATUS answers 50 ("not available"), naming ipvlan, on a kernel
/// where ADD could not create an ipvlan link, while macvlan on the same
/// kernel answers ready.
#[test]
fn status_is_not_available_without_kernel_support() {
    let Some((env, master)) = env_without_ipvlan("status_is_not_available_without_kernel_support")
    else {
        return;
    };
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
    for (plugin, code) in [("ipvlan", Some(50)), ("macvlan", None)] {
        let mut c = conf(&master, "l2", ipam.clone());
        c["cniVersion"] = json!("1.1.0");
        c["type"] = json!(plugin);
        c["mode"] = json!(if plugin == "ipvlan" { "l2" } else { "bridge" });
        let out = env.plugin(plugin).command("STATUS").conf(&c).run();
        match code {
            Some(code) => drop(out.expect_err(code, &["ipvlan"])),
            None => drop(out.ok_silent()),
        }
    }
}
