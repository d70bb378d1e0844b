//! vlan plugin. The test machine's kernel is built without 802.1Q support
//! (CONFIG_VLAN_8021Q): there ADD must fail with code 101 naming it, before any lease,
//! leaving nothing behind; STATUS says 50; DEL, CHECK's refusals, GC and the
//! configuration rules work as on any kernel. The VM suite (tests/vm/links.sh,
//! Debian's kernel) runs the attachments.

use crate::support::*;
use serde_json::{json, Value};

const NET: &str = "vlnet";

fn conf(version: &str, master: &str, ipam: Option<Value>) -> Value {
    let mut c = json!({"cniVersion": version, "name": NET, "type": "vlan",
        "master": master, "vlanId": 100});
    if let Some(ipam) = ipam {
        c["ipam"] = ipam;
    }
    c
}

/// Whether this kernel makes VLAN links (`ip link add … type vlan` in the test host).
fn kernel_has_vlan(env: &TestEnv) -> bool {
    let (master, _) = env.veth_pair();
    let probe = env.link_name("vlp");
    let (ok, _, _) = sh(
        "ip",
        &[
            "link", "add", "link", &master, &probe, "type", "vlan", "id", "5",
        ],
    );
    ok
}

/// Proves: without kernel support ADD fails with code 101 naming vlan and
/// CONFIG_VLAN_8021Q, with ipamd and host-local, for 1.1.0, 1.0.0 and 0.4.0, also with
/// `linkInContainer`; the netns holds only lo (or its own master), no lease is left;
/// DEL of the failed attachment succeeds, twice; STATUS says 50 naming
/// CONFIG_VLAN_8021Q.
#[test]
fn without_kernel_support_add_fails_cleanly_and_status_is_not_available() {
    let env = TestEnv::new("vlan_no_kernel_support");
    if kernel_has_vlan(&env) {
        eprintln!("this kernel has vlan links: the no-support test is skipped");
        return;
    }
    let nets = env.subnets();
    let (master, _) = env.veth_pair();
    for version in ["1.1.0", "1.0.0", "0.4.0"] {
        for ipam in [
            env.ipam(Ipam::Ipamd, nets.dual_ranges()),
            env.ipam(Ipam::HostLocal, nets.v4_ranges()),
        ] {
            let c = conf(version, &master, Some(ipam));
            assert_add_unsupported(&env, "vlan", &c, NET, &["vlan", "CONFIG_VLAN_8021Q"]);
        }
    }
    // linkInContainer: the master is the pod's own (foreign) eth0.
    let ns = env.netns_with_foreign_eth0();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let c = merged(
        conf("1.0.0", "eth0", Some(ipam.clone())),
        json!({"linkInContainer": true}),
    );
    let att = env
        .attachment("vlan", &cid("inpod"), &ns, &c)
        .with_ifname("net1");
    att.try_add().expect_err(101, &["CONFIG_VLAN_8021Q"]);
    assert!(link(Some(&ns.name), "net1").is_none());
    assert_eq!(env.lease_count(&ipam, NET), 0);
    att.del_twice();
    let status = conf(
        "1.1.0",
        &master,
        Some(env.ipam(Ipam::Ipamd, nets.v4_ranges())),
    );
    env.plugin("vlan")
        .command("STATUS")
        .conf(&status)
        .run()
        .expect_err(50, &["CONFIG_VLAN_8021Q"]);
}

/// Proves: the reference's configuration errors are code 7 before anything is made:
/// no master, a vlanId out of 0–4094, no IPAM (ADD, CHECK, STATUS); a master that does
/// not exist is code 7 too; GC without IPAM succeeds.
#[test]
fn configuration_errors() {
    let env = TestEnv::new("vlan_conf");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let (master, _) = env.veth_pair();
    for (c, needle) in [
        (conf("1.1.0", "", Some(ipam.clone())), "master"),
        (
            merged(
                conf("1.1.0", &master, Some(ipam.clone())),
                json!({"vlanId": 4095}),
            ),
            "VLAN ID",
        ),
        (
            merged(
                conf("1.1.0", &master, Some(ipam.clone())),
                json!({"vlanId": -1}),
            ),
            "VLAN ID",
        ),
        (conf("1.1.0", &master, None), "IPAM"),
        (
            conf("1.1.0", "nosuchmaster0", Some(ipam.clone())),
            "nosuchmaster0",
        ),
    ] {
        let att = env.new_attachment("vlan", "conf", &c);
        att.try_add().expect_err(7, &[needle]);
        assert_only_lo(&att.ns, "refused ADD");
        att.del_twice();
    }
    assert_eq!(env.lease_count(&ipam, NET), 0);
    let no_ipam = conf("1.1.0", &master, None);
    env.plugin("vlan")
        .command("STATUS")
        .conf(&no_ipam)
        .run()
        .expect_err(7, &["IPAM"]);
    let gc = merged(no_ipam, json!({"cni.dev/valid-attachments": []}));
    env.plugin("vlan").command("GC").conf(&gc).run().ok_silent();
}

/// Proves: DEL succeeds with the netns gone (and releases the lease), with an empty or
/// no CNI_NETNS, with a configuration it cannot use (no master, a bad vlanId, a garbled
/// `ipam` and prevResult), with the master gone; and it leaves an `eth0` that is not a
/// VLAN alone.
#[test]
fn del_never_blocks_and_removes_only_a_vlan() {
    let env = TestEnv::new("vlan_del");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let c = conf("1.0.0", "gonemaster0", Some(ipam.clone()));
    assert_del_without_netns_releases_lease(&env, "vlan", &c, &ipam, NET);
    for bad in [
        json!({"master": ""}),
        json!({"vlanId": 9999}),
        json!({"ipam": {"subnet": 5}, "prevResult": {"ips": "x"}}),
    ] {
        env.new_attachment("vlan", "bad", &merged(c.clone(), bad))
            .del_twice();
    }
    assert_del_leaves_foreign_eth0(&env, "vlan", &c);
}

/// Proves: CHECK refuses an `eth0` that is not a VLAN (100), prevResult without the
/// interface (7), a missing prevResult (7), and a master that is gone (100).
#[test]
fn check_refusals() {
    let env = TestEnv::new("vlan_check");
    let nets = env.subnets();
    let (master, _) = env.veth_pair();
    let static_ipam = json!({"type": "static",
        "addresses": [{"address": format!("{}/24", nets.v4_addr(5))}]});
    let c = conf("1.0.0", &master, Some(static_ipam));
    let ips = json!([{"address": format!("{}/24", nets.v4_addr(5)), "interface": 0}]);
    let (att, prev) = assert_check_refuses_foreign_eth0(&env, "vlan", &c, ips, "not a vlan");
    let gone_master = conf("1.0.0", "nosuchmaster0", c.get("ipam").cloned());
    att.call("CHECK")
        .conf(&with_prev(&gone_master, &prev))
        .run()
        .expect_err(100, &["nosuchmaster0"]);
}
