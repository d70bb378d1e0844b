//! dummy plugin. The test machine's kernel is built without CONFIG_DUMMY: there ADD must
//! fail with the clear "no kernel support" error (code 101) before any lease, leave
//! nothing behind, STATUS must say "not available" (50), and DEL, CHECK's refusals, GC
//! and the IPAM requirement work as on any kernel. On a kernel with dummy links the
//! attachment tests run here too; the VM suite (tests/vm, Debian's kernel) always runs
//! dummy + ipamd and dummy + static ADD/CHECK/DEL.

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const NET: &str = "dmnet";

fn conf(version: &str, ipam: Option<Value>) -> Value {
    let mut c = json!({"cniVersion": version, "name": NET, "type": "dummy"});
    if let Some(ipam) = ipam {
        c["ipam"] = ipam;
    }
    c
}

/// Whether this kernel makes dummy links (`ip link add … type dummy` in the test host).
fn kernel_has_dummy(env: &TestEnv) -> bool {
    let probe = env.link_name("dmp");
    let (ok, _, _) = sh("ip", &["link", "add", &probe, "type", "dummy"]);
    ok
}

/// The static `ipam` of one v4 and one v6 address with a default route per family.
fn static_ipam(nets: &Subnets) -> Value {
    json!({"type": "static",
           "addresses": [{"address": format!("{}/24", nets.v4_addr(5)), "gateway": nets.v4_addr(1)},
                         {"address": format!("{}/64", nets.v6_addr(5))}],
           "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.99.0/24", "gw": nets.v4_addr(2)}]})
}

/// Proves: without kernel support ADD fails with code 101 naming dummy and CONFIG_DUMMY,
/// with ipamd, host-local and static; the netns holds only lo, no lease is left; DEL
/// of the failed attachment succeeds, twice; STATUS says 50, naming CONFIG_DUMMY.
#[test]
fn without_kernel_support_add_fails_cleanly_and_status_is_not_available() {
    let env = TestEnv::new("dummy_no_kernel_support");
    if kernel_has_dummy(&env) {
        eprintln!("this kernel has dummy links: the no-support test is skipped");
        return;
    }
    let nets = env.subnets();
    for ipam in [
        env.ipam(Ipam::Ipamd, nets.dual_ranges()),
        env.ipam(Ipam::HostLocal, nets.v4_ranges()),
        static_ipam(&nets),
    ] {
        let c = conf("1.0.0", Some(ipam));
        assert_add_unsupported(&env, "dummy", &c, NET, &["dummy", "CONFIG_DUMMY"]);
    }
    let status = conf("1.1.0", Some(env.ipam(Ipam::Ipamd, nets.v4_ranges())));
    env.plugin("dummy")
        .command("STATUS")
        .conf(&status)
        .run()
        .expect_err(50, &["CONFIG_DUMMY"]);
}

/// Proves: ADD, CHECK and STATUS without IPAM (no section, `{}`) are the reference's
/// error, code 7, with nothing made; GC and DEL without it succeed.
#[test]
fn ipam_is_required() {
    let env = TestEnv::new("dummy_ipam_required");
    for c in [conf("1.1.0", None), conf("1.1.0", Some(json!({})))] {
        let att = env.new_attachment("dummy", "noipam", &c);
        att.try_add().expect_err(7, &["IPAM"]);
        assert_only_lo(&att.ns, "ADD without IPAM");
        att.call("CHECK")
            .conf(&with_prev(&c, &json!({"cniVersion": "1.1.0"})))
            .run()
            .expect_err(7, &["IPAM"]);
        env.plugin("dummy")
            .command("STATUS")
            .conf(&c)
            .run()
            .expect_err(7, &["IPAM"]);
        let gc = merged(c.clone(), json!({"cni.dev/valid-attachments": []}));
        env.plugin("dummy")
            .command("GC")
            .conf(&gc)
            .run()
            .ok_silent();
        att.del_twice();
    }
}

/// Proves: DEL succeeds with the netns gone, with an empty or no CNI_NETNS, and with an
/// `ipam` section and prevResult it cannot decode; it leaves an `eth0` that is not a
/// dummy alone; and with the netns gone it still releases IPAM's lease.
#[test]
fn del_never_blocks_and_removes_only_a_dummy() {
    let env = TestEnv::new("dummy_del");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let c = conf("1.0.0", Some(ipam.clone()));
    assert_del_without_netns_releases_lease(&env, "dummy", &c, &ipam, NET);
    let garbled = merged(
        c.clone(),
        json!({"ipam": {"subnet": 5}, "prevResult": {"ips": "x"}}),
    );
    env.new_attachment("dummy", "garbled", &garbled).del_twice();
    assert_del_leaves_foreign_eth0(&env, "dummy", &c);
}

/// Proves: CHECK refuses an `eth0` that prevResult names but that is not a dummy (100),
/// one missing from prevResult (7), and a missing prevResult (7).
#[test]
fn check_refuses_what_is_not_the_attachments_dummy() {
    let env = TestEnv::new("dummy_check_refusals");
    let nets = env.subnets();
    let c = conf("1.0.0", Some(static_ipam(&nets)));
    let ips = json!([{"address": format!("{}/24", nets.v4_addr(5)), "gateway": nets.v4_addr(1),
                      "interface": 0},
                     {"address": format!("{}/64", nets.v6_addr(5)), "interface": 0}]);
    assert_check_refuses_foreign_eth0(&env, "dummy", &c, ips, "not a dummy");
}

/// Proves: GC hands the network's valid attachments to IPAM: a lease of an attachment
/// not in the list is freed, one in it is kept.
#[test]
fn gc_is_ipams() {
    let env = TestEnv::new("dummy_gc");
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
    let c = conf("1.1.0", Some(ipam.clone()));
    assert_gc_frees_only_stale_leases(&env, "dummy", &c, &ipam, NET);
}

/// `ip -d link` of the pod's eth0: a dummy that is up.
fn assert_dummy_up(ns: &Netns) -> Value {
    let l = link(Some(&ns.name), "eth0").unwrap_or_else(|| panic!("no eth0 in {}", ns.name));
    assert_eq!(link_kind(&l), Some("dummy"), "{l}");
    assert!(has_flag(&l, "UP"), "{l}");
    l
}

/// Proves (kernels with dummy links): for every version, dummy + dual-stack ipamd makes
/// an up dummy eth0 with the leased addresses, reported as interface 0 with its MAC;
/// CHECK (≥ 0.4.0) passes, and fails once an address is gone; DEL, twice, removes the
/// link and the leases.
#[test]
fn with_ipamd_every_version() {
    let env = TestEnv::new("dummy_ipamd");
    if !kernel_has_dummy(&env) {
        eprintln!("this kernel has no dummy links: covered by the VM suite (tests/vm)");
        return;
    }
    for version in ALL_VERSIONS {
        let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
        let att = env.new_attachment("dummy", "ipamd", &conf(version, Some(ipam.clone())));
        let r = att.add();
        let l = assert_dummy_up(&att.ns);
        assert_eth0_read_back_check_del(&env, &att, &r, &l, &ipam, NET, version);
    }
}

/// Proves (kernels with dummy links): dummy + static gives the pod exactly the static
/// addresses and routes; STATUS passes; CHECK passes; DEL removes the link.
#[test]
fn with_static_exactly_the_configured_addresses_and_routes() {
    let env = TestEnv::new("dummy_static");
    if !kernel_has_dummy(&env) {
        eprintln!("this kernel has no dummy links: covered by the VM suite (tests/vm)");
        return;
    }
    let nets = env.subnets();
    let c = conf("1.1.0", Some(static_ipam(&nets)));
    let att = env.new_attachment("dummy", "static", &c);
    let r = att.add();
    assert_dummy_up(&att.ns);
    let want: BTreeSet<String> = [
        format!("{}/24", nets.v4_addr(5)),
        format!("{}/64", nets.v6_addr(5)),
    ]
    .into_iter()
    .collect();
    assert_eq!(addrs(Some(&att.ns.name), "eth0"), want);
    let routes4: BTreeSet<String> = [
        format!("{} dev eth0", nets.v4),
        format!("default via {} dev eth0", nets.v4_addr(1)),
        format!("192.168.99.0/24 via {} dev eth0", nets.v4_addr(2)),
    ]
    .into_iter()
    .collect();
    assert_eq!(routes(Some(&att.ns.name), "-4"), routes4);
    env.plugin("dummy")
        .command("STATUS")
        .conf(&c)
        .run()
        .ok_silent();
    att.check(&r);
    att.del_twice();
    assert!(link(Some(&att.ns.name), "eth0").is_none());
}
