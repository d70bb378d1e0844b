//! vrf plugin. The test machine's kernel is built without VRF support (CONFIG_NET_VRF):
//! there ADD must fail with code 101 naming it and leave the pod's interface as it was
//! (no master, no VRF device); DEL works in every state; CHECK, STATUS and GC as the
//! reference. The VM suite (tests/vm/links.sh, Debian's kernel) runs the enslaving.

use crate::support::*;
use serde_json::{json, Value};

const NET: &str = "vrfnet";

fn conf(version: &str, vrf: &str) -> Value {
    json!({"cniVersion": version, "name": NET, "type": "vrf", "vrfname": vrf})
}

fn kernel_has_vrf(env: &TestEnv) -> bool {
    let probe = env.link_name("vrp");
    let (ok, _, _) = sh("ip", &["link", "add", &probe, "type", "vrf", "table", "77"]);
    ok
}

/// The prevResult of an interface plugin that made `eth0` in `ns`.
fn prev(ns: &Netns, version: &str) -> Value {
    json!({"cniVersion": version,
        "interfaces": [{"name": "eth0", "sandbox": ns.path}],
        "ips": [{"address": "10.99.0.5/24", "interface": 0}]})
}

/// Proves: without kernel support ADD, chained after an interface (`eth0` in the pod),
/// fails with code 101 naming vrf and CONFIG_NET_VRF, for 1.1.0, 1.0.0, 0.4.0 and
/// 0.3.1, with and without `table`; eth0 has no master after it and the netns no VRF;
/// DEL after it succeeds, twice.
#[test]
fn without_kernel_support_add_fails_cleanly() {
    let env = TestEnv::new("vrf_no_kernel_support");
    if kernel_has_vrf(&env) {
        eprintln!("this kernel has vrf devices: the no-support test is skipped");
        return;
    }
    for version in ["1.1.0", "1.0.0", "0.4.0", "0.3.1"] {
        for extra in [json!({}), json!({"table": 1001})] {
            let ns = env.netns_with_foreign_eth0();
            let c = merged(conf(version, "blue"), extra);
            let att = env.attachment("vrf", &cid("nok"), &ns, &with_prev(&c, &prev(&ns, version)));
            att.try_add().expect_err(101, &["vrf", "CONFIG_NET_VRF"]);
            let l = link(Some(&ns.name), "eth0").expect("eth0 stays");
            assert!(l.get("master").is_none(), "{l}");
            assert!(link(Some(&ns.name), "blue").is_none());
            att.del_twice();
        }
    }
}

/// Proves: ADD and CHECK need prevResult and a vrfname (7), ADD needs CNI_IFNAME in the
/// pod (7) and refuses an interface that already has a master (7), and a vrfname that
/// names a link that is not a VRF (7); STATUS and GC succeed, as the reference's.
#[test]
fn configuration_errors() {
    let env = TestEnv::new("vrf_conf");
    let ns = env.netns_with_foreign_eth0();
    let with = |c: &Value| with_prev(c, &prev(&ns, "1.0.0"));
    for (c, needle) in [
        (conf("1.0.0", "blue"), "prevResult"),
        (with(&conf("1.0.0", "")), "vrf name"),
        (
            with(&json!({"cniVersion": "1.0.0", "name": NET, "type": "vrf"})),
            "vrf name",
        ),
        (with(&conf("1.0.0", "eth0")), "not a VRF"),
    ] {
        let att = env.attachment("vrf", &cid("conf"), &ns, &c);
        att.try_add().expect_err(7, &[needle]);
    }
    let att = env.attachment("vrf", &cid("conf"), &ns, &with(&conf("1.0.0", "blue")));
    att.call("CHECK")
        .conf(&conf("1.0.0", "blue"))
        .run()
        .expect_err(7, &["prevResult"]);
    let missing = att.clone().with_ifname("net9");
    missing.try_add().expect_err(7, &["net9"]);
    // eth0 in a bridge of the pod: it already has a master.
    ip(&["-n", &ns.name, "link", "add", "br9", "type", "bridge"]);
    ip(&["-n", &ns.name, "link", "set", "eth0", "master", "br9"]);
    att.try_add().expect_err(7, &["already", "br9"]);
    for verb in ["STATUS", "GC"] {
        let c = merged(
            conf("1.1.0", "blue"),
            json!({"cni.dev/valid-attachments": []}),
        );
        env.plugin("vrf").command(verb).conf(&c).run().ok_silent();
    }
}

/// Proves: DEL succeeds with the netns gone, an empty or no CNI_NETNS, no VRF of that
/// name, no vrfname, a vrfname that is not a VRF, and a garbled prevResult; it leaves
/// the pod's eth0 and a non-VRF link of that name alone.
#[test]
fn del_never_blocks() {
    let env = TestEnv::new("vrf_del");
    let ns = env.netns_with_foreign_eth0();
    for c in [
        conf("1.0.0", "blue"),
        conf("1.0.0", ""),
        conf("1.0.0", "eth0"),
        json!({"cniVersion": "1.0.0", "name": NET, "type": "vrf"}),
        merged(
            conf("1.0.0", "blue"),
            json!({"prevResult": {"ips": "x"}, "table": -4}),
        ),
    ] {
        let att = env.attachment("vrf", &cid("del"), &ns, &c);
        att.del_twice();
        att.del_with_empty_netns();
        att.del_without_netns();
        let l = link(Some(&ns.name), "eth0").expect("eth0 stays");
        assert_eq!(link_kind(&l), Some("veth"));
    }
    let gone = env.new_attachment("vrf", "gone", &conf("1.0.0", "blue"));
    env.del_netns(&gone.ns);
    gone.del_twice();
}

/// Proves: CHECK without the VRF in the pod fails (100).
#[test]
fn check_without_the_vrf_fails() {
    let env = TestEnv::new("vrf_check");
    let ns = env.netns_with_foreign_eth0();
    let c = conf("1.0.0", "blue");
    let att = env.attachment("vrf", &cid("chk"), &ns, &c);
    att.call("CHECK")
        .conf(&with_prev(&c, &prev(&ns, "1.0.0")))
        .run()
        .expect_err(100, &["blue"]);
}
