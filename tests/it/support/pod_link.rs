//! The steps the suites of plugins that give the pod one link of their own kind share
//! (dummy, tap, vlan): ADD's read-back of the pod's eth0, CHECK's refusals of an eth0
//! that is not theirs, DEL that never blocks, GC handed to IPAM, and ADD on a kernel
//! without the link kind. Each suite keeps what only its plugin does.

use super::attachment::Attachment;
use super::fixture::TestEnv;
use super::json::{merged, result_addresses, with_prev};
use super::kernel::{addrs, assert_only_lo, ip, link, link_kind};
use super::names::cid;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// After one ADD at `version` of a plugin that makes the pod's `eth0` alone, with dual-stack
/// IPAM `ipam` of network `net`: two leases; `r` reports eth0 as interface 0 with the MAC
/// `l` (its `ip -d link`) has and the netns, every address on it, and the kernel has the
/// result's addresses (≥ 0.3.0); CHECK (≥ 0.4.0) passes, and fails once the IPv4 address
/// is gone; DEL, twice, removes eth0 and the leases.
pub fn assert_eth0_read_back_check_del(
    env: &TestEnv,
    att: &Attachment,
    r: &Value,
    l: &Value,
    ipam: &Value,
    net: &str,
    version: &str,
) {
    assert_eq!(env.lease_count(ipam, net), 2, "{version}");
    if version >= "0.3.0" {
        let iface = &r["interfaces"][0];
        assert_eq!(iface["name"], "eth0", "{r}");
        assert_eq!(iface["mac"], l["address"], "{r}");
        assert_eq!(iface["sandbox"], att.ns.path, "{r}");
        assert!(r["ips"]
            .as_array()
            .unwrap()
            .iter()
            .all(|ip| ip["interface"] == 0));
        let want: BTreeSet<String> = result_addresses(r).into_iter().collect();
        assert_eq!(addrs(Some(&att.ns.name), "eth0"), want, "{version}");
    }
    if version >= "0.4.0" {
        att.check(r);
        let v4 = result_addresses(r)
            .into_iter()
            .find(|a| !a.contains(':'))
            .unwrap();
        ip(&["-n", &att.ns.name, "addr", "del", &v4, "dev", "eth0"]);
        att.call("CHECK")
            .conf(&with_prev(&att.conf, r))
            .run()
            .expect_err(100, &[&v4]);
    }
    att.del_twice();
    assert!(link(Some(&att.ns.name), "eth0").is_none(), "{version}");
    assert_eq!(env.lease_count(ipam, net), 0, "{version}");
}

/// On a kernel without `plugin`'s link kind, ADD of `c` (IPAM `ipam` of network `net`)
/// fails with code 101 naming `needles`, before any lease: the pod holds only lo, no lease
/// is left (static IPAM has none to count); DEL of the failed attachment succeeds, twice.
pub fn assert_add_unsupported(env: &TestEnv, plugin: &str, c: &Value, net: &str, needles: &[&str]) {
    let att = env.new_attachment(plugin, "nok", c);
    att.try_add().expect_err(101, needles);
    assert_only_lo(&att.ns, "failed ADD");
    if c["ipam"]["type"] != "static" {
        assert_eq!(env.lease_count(&c["ipam"], net), 0, "{}", c["ipam"]);
    }
    att.del_twice();
}

/// DEL of `plugin` with config `c` (ipamd `ipam` of network `net`) when the pod's netns
/// is gone releases the lease IPAM holds for it (taken by ipamd alone, as if ADD had);
/// DEL again, with an empty and with no CNI_NETNS, succeeds.
pub fn assert_del_without_netns_releases_lease(
    env: &TestEnv,
    plugin: &str,
    c: &Value,
    ipam: &Value,
    net: &str,
) {
    let gone = env.new_attachment(plugin, "gone", c);
    env.plugin("ipamd")
        .attach("ADD", &gone.id, &gone.ns, "eth0")
        .conf(c)
        .run()
        .result();
    assert_eq!(env.lease_count(ipam, net), 1);
    env.del_netns(&gone.ns);
    gone.del_twice();
    assert_eq!(env.lease_count(ipam, net), 0, "DEL released the lease");
    gone.del_with_empty_netns();
    gone.del_without_netns();
}

/// DEL of `plugin` with config `c` leaves a pod's `eth0` that is not its own (a veth).
pub fn assert_del_leaves_foreign_eth0(env: &TestEnv, plugin: &str, c: &Value) {
    let foreign = env.netns_with_foreign_eth0();
    env.attachment(plugin, &cid("foreign"), &foreign, c).del();
    let l = link(Some(&foreign.name), "eth0").expect("the foreign eth0 stays");
    assert_eq!(link_kind(&l), Some("veth"));
}

/// CHECK of `plugin` with config `c` in a pod whose `eth0` is a veth: with a prevResult
/// naming that eth0 with `ips`, code 100 naming `not_ours`; with the prevResult's interface
/// in another netns, or no prevResult, code 7. The attachment and that prevResult, for
/// the plugin's own refusals.
pub fn assert_check_refuses_foreign_eth0<'e>(
    env: &'e TestEnv,
    plugin: &str,
    c: &Value,
    ips: Value,
    not_ours: &str,
) -> (Attachment<'e>, Value) {
    let ns = env.netns_with_foreign_eth0();
    let att = env.attachment(plugin, &cid("chk"), &ns, c);
    let prev = json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": ns.path}], "ips": ips});
    att.call("CHECK")
        .conf(&with_prev(c, &prev))
        .run()
        .expect_err(100, &[not_ours]);
    let mut elsewhere = prev.clone();
    elsewhere["interfaces"][0]["sandbox"] = json!("/run/netns/other");
    att.call("CHECK")
        .conf(&with_prev(c, &elsewhere))
        .run()
        .expect_err(7, &["prevResult"]);
    att.call("CHECK").run().expect_err(7, &["prevResult"]);
    (att, prev)
}

/// GC of `plugin` with config `c` (ipamd `ipam` of network `net`) hands the valid
/// attachments to IPAM: of two leases, the one of an attachment not in the list is freed,
/// the other kept.
pub fn assert_gc_frees_only_stale_leases(
    env: &TestEnv,
    plugin: &str,
    c: &Value,
    ipam: &Value,
    net: &str,
) {
    for id in ["ctr-keep", "ctr-stale"] {
        env.plugin("ipamd")
            .attach("ADD", id, &env.netns(), "eth0")
            .conf(c)
            .run()
            .result();
    }
    let gc = merged(
        c.clone(),
        json!({"cni.dev/valid-attachments": [{"containerID": "ctr-keep", "ifname": "eth0"}]}),
    );
    env.plugin(plugin).command("GC").conf(&gc).run().ok_silent();
    assert_eq!(env.lease_count(ipam, net), 1);
}
