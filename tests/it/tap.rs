//! tap plugin: a persistent tap named CNI_IFNAME in the pod, addressed from IPAM or
//! plain L2 in a bridge of the pod; `multiQueue`, `owner`, `group`, `mtu`, `mac` read back
//! from `ip -d link`, and the same device `ip tuntap add` makes (what the reference runs
//! when owner and group are not both given; Debian's 1.1.1 has no tap); CHECK, DEL
//! (twice, netns gone, input it cannot use), failures that leave nothing, STATUS, GC.

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const NET: &str = "tapnet";

fn conf(version: &str, extra: Value) -> Value {
    merged(
        json!({"cniVersion": version, "name": NET, "type": "tap"}),
        extra,
    )
}

/// The pod's `ifname`, which must be a tap: `ip -d link`'s view of it.
fn tap_link(ns: &Netns, ifname: &str) -> Value {
    let l = link(Some(&ns.name), ifname).unwrap_or_else(|| panic!("no {ifname} in {}", ns.name));
    assert_eq!(link_kind(&l), Some("tun"), "{l}");
    assert_eq!(l["linkinfo"]["info_data"]["type"], "tap", "{l}");
    l
}

/// Proves: for every version, tap + dual-stack ipamd makes an up tap eth0 (persistent,
/// single queue, no owner) with the leased addresses, reported as interface 0 with its
/// MAC and sandbox; CHECK (≥ 0.4.0) passes, and fails once an address is gone; DEL,
/// twice, removes the tap and the leases.
#[test]
fn with_ipamd_every_version() {
    let env = TestEnv::new("tap_ipamd");
    for version in ALL_VERSIONS {
        let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
        let att = env.new_attachment("tap", "ipamd", &conf(version, json!({"ipam": ipam})));
        let r = att.add();
        let l = tap_link(&att.ns, "eth0");
        assert!(has_flag(&l, "UP"), "{l}");
        let info = &l["linkinfo"]["info_data"];
        assert_eq!(
            (&info["persist"], &info["multi_queue"]),
            (&json!(true), &json!(false))
        );
        assert!(
            info.get("user").is_none() && info.get("group").is_none(),
            "{l}"
        );
        assert_eth0_read_back_check_del(&env, &att, &r, &l, &ipam, NET, version);
    }
}

/// Proves: without IPAM, the tap joins the pod's bridge `bridge`, multi-queue, with the
/// configured owner, group, MTU and MAC (MAC also from CNI_ARGS and runtimeConfig, which
/// win), up; the result is its interface alone; CHECK passes, and fails once the tap has
/// left the bridge, and for a prevResult with another MAC; DEL, twice, removes the tap
/// and leaves the bridge; DEL with the netns gone succeeds.
#[test]
fn in_a_bridge_of_the_pod() {
    let env = TestEnv::new("tap_bridge");
    let ns = env.netns();
    ip(&["-n", &ns.name, "link", "add", "br0", "type", "bridge"]);
    let c = conf(
        "1.1.0",
        json!({"bridge": "br0", "multiQueue": true, "owner": 4242, "group": 4343,
               "mtu": 1400, "mac": "0a:58:00:00:00:01",
               "runtimeConfig": {"mac": "0A-58-00-00-00-03"}}),
    );
    let att = env.attachment("tap", &cid("br"), &ns, &c);
    let r = att
        .call("ADD")
        .cni_args("IgnoreUnknown=1;MAC=0a:58:00:00:00:02;K8S_POD_NAME=x")
        .run()
        .result();
    let l = tap_link(&ns, "eth0");
    let info = &l["linkinfo"]["info_data"];
    assert_eq!(
        (&info["user"], &info["group"]),
        (&json!(4242), &json!(4343)),
        "{l}"
    );
    assert_eq!(info["multi_queue"], true, "{l}");
    assert_eq!(
        (&l["master"], &l["mtu"]),
        (&json!("br0"), &json!(1400)),
        "{l}"
    );
    assert_eq!(l["address"], "0a:58:00:00:00:03", "runtimeConfig.mac wins");
    assert!(has_flag(&l, "UP"), "{l}");
    assert_eq!(
        r,
        json!({"cniVersion": "1.1.0", "dns": {},
               "interfaces": [{"name": "eth0", "mac": "0a:58:00:00:00:03", "sandbox": ns.path}]})
    );
    att.check(&r);
    let mut other_mac = r.clone();
    other_mac["interfaces"][0]["mac"] = json!("0a:58:00:00:00:09");
    att.call("CHECK")
        .conf(&with_prev(&c, &other_mac))
        .run()
        .expect_err(100, &["MAC"]);
    ip(&["-n", &ns.name, "link", "set", "eth0", "nomaster"]);
    att.call("CHECK")
        .conf(&with_prev(&c, &r))
        .run()
        .expect_err(100, &["not a port of bridge br0"]);
    att.del_twice();
    assert_eq!(
        link_names(Some(&ns.name)),
        BTreeSet::from(["lo".into(), "br0".into()])
    );
    att.add();
    env.del_netns(&ns);
    att.del_twice();
    att.del_with_empty_netns();
    att.del_without_netns();
}

/// `ip -d link`'s tun details and the MTU of `ifname` in `ns`.
fn device(ns: &Netns, ifname: &str) -> Value {
    let l = tap_link(ns, ifname);
    json!({"info": l["linkinfo"]["info_data"], "mtu": l["mtu"], "address": l["address"]})
}

/// Proves: cnikit's tap is the device the reference's `ip tuntap add mode tap
/// [multi_queue] [user U] [group G]` + `ip link set mtu M address A` makes (packet
/// information off, no vnet header) for each way owner and group may be given but both;
/// with both (the reference's netlink path) the vnet header is on and, single-queue,
/// packet information too.
#[test]
fn the_device_ip_tuntap_makes() {
    let env = TestEnv::new("tap_ip_tuntap");
    let owners: [&[&str]; 3] = [&[], &["user", "4242"], &["group", "4343"]];
    for mq in [false, true] {
        for owner in owners {
            let mut extra = json!({"multiQueue": mq, "mtu": 1300, "mac": "0a:58:00:00:00:07"});
            let mut args = vec!["tuntap", "add", "mode", "tap", "name", "eth0"];
            if mq {
                args.push("multi_queue");
            }
            args.extend_from_slice(owner);
            if let [key, id] = owner {
                let key = if *key == "user" { "owner" } else { "group" };
                extra[key] = json!(id.parse::<u32>().unwrap());
            }
            let ours = env.new_attachment("tap", "tt", &conf("1.0.0", extra.clone()));
            ours.add();
            let theirs = env.netns();
            let n = theirs.name.as_str();
            ip(&[&["-n", n][..], &args[..]].concat());
            ip(&[
                "-n",
                n,
                "link",
                "set",
                "eth0",
                "mtu",
                "1300",
                "address",
                "0a:58:00:00:00:07",
            ]);
            assert_eq!(device(&ours.ns, "eth0"), device(&theirs, "eth0"), "{extra}");
        }
    }
    for (mq, pi) in [(false, true), (true, false)] {
        let extra = json!({"multiQueue": mq, "owner": 4242, "group": 4343});
        let att = env.new_attachment("tap", "nl", &conf("1.0.0", extra));
        att.add();
        let info = device(&att.ns, "eth0")["info"].clone();
        assert_eq!(
            (&info["vnet_hdr"], &info["pi"]),
            (&json!(true), &json!(pi)),
            "{info}"
        );
        assert_eq!(
            (&info["user"], &info["group"]),
            (&json!(4242), &json!(4343)),
            "{info}"
        );
    }
}

/// Proves: a taken name (a veth eth0) is code 102 and stays; a `bridge` the pod lacks is
/// code 7 and leaves only lo; an IPAM that fails ADD leaves no tap and gets the DEL; bad
/// values are code 7 before anything is made; `selinuxContext` without SELinux is no
/// label to give; STATUS passes; GC frees the leases of attachments not in its list.
#[test]
fn failures_leave_nothing_and_status_and_gc() {
    let env = TestEnv::new("tap_failures");
    let foreign = env.netns_with_foreign_eth0();
    let plain = conf("1.0.0", json!({}));
    env.attachment("tap", &cid("taken"), &foreign, &plain)
        .try_add()
        .expect_err(102, &["eth0"]);
    assert_eq!(
        link_kind(&link(Some(&foreign.name), "eth0").unwrap()),
        Some("veth")
    );
    let att = env.new_attachment("tap", "nobr", &conf("1.0.0", json!({"bridge": "br9"})));
    att.try_add().expect_err(7, &["br9"]);
    assert_only_lo(&att.ns, "bridge missing");
    let log = env.tmp.join("failipam.log");
    failing_plugin(&env.bin, "failipam", &log);
    let att = env.new_attachment(
        "tap",
        "ipamf",
        &conf("1.0.0", json!({"ipam": {"type": "failipam"}})),
    );
    att.try_add().expect_err(11, &["failipam refuses"]);
    assert_only_lo(&att.ns, "IPAM failed");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "ADD\nDEL\n");
    for bad in [
        json!({"mtu": 10}),
        json!({"owner": -1}),
        json!({"mac": "0a:58"}),
    ] {
        let att = env.new_attachment("tap", "bad", &conf("1.0.0", bad));
        att.try_add().expect_err(7, &[]);
        assert_only_lo(&att.ns, "bad value");
    }
    let selinux = conf(
        "1.0.0",
        json!({"selinuxContext": "system_u:system_r:container_t:s0"}),
    );
    if !std::path::Path::new("/sys/fs/selinux/enforce").exists() {
        let att = env.new_attachment("tap", "se", &selinux);
        att.add();
        att.del();
    }
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
    let c = conf("1.1.0", json!({"ipam": ipam}));
    env.plugin("tap")
        .command("STATUS")
        .conf(&c)
        .run()
        .ok_silent();
    assert_gc_frees_only_stale_leases(&env, "tap", &c, &ipam, NET);
    let garbled = conf(
        "1.0.0",
        json!({"ipam": {"subnet": 5}, "prevResult": {"ips": "x"}, "mtu": "x"}),
    );
    env.new_attachment("tap", "garbled", &garbled).del_twice();
}
