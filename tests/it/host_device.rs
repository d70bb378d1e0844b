//! host-device plugin. Every call runs inside a netns of its own that plays the host
//! (`ip netns exec`, which also mounts that netns's sysfs, so `kernelpath` sees its
//! devices); the "device" is one end of a veth pair made there. Side by side with the
//! reference (/usr/lib/cni/host-device): the same result shape and end state.

use crate::support::*;
use serde_json::{json, Value};

const NET: &str = "hdnet";
const DEV: &str = "hd0";
const PEER: &str = "hdp0";
const IFNAME: &str = "net1";

/// A "host" netns holding the veth pair DEV–PEER (both up) and an empty pod netns.
struct Setup<'e> {
    env: &'e TestEnv,
    host: Netns,
    pod: Netns,
}

impl<'e> Setup<'e> {
    fn new(env: &'e TestEnv) -> Setup<'e> {
        let host = env.netns();
        let h = host.name.as_str();
        ip(&[
            "-n", h, "link", "add", DEV, "type", "veth", "peer", "name", PEER,
        ]);
        ip(&["-n", h, "link", "set", DEV, "up"]);
        ip(&["-n", h, "link", "set", PEER, "up"]);
        Setup {
            env,
            host,
            pod: env.netns(),
        }
    }

    fn call(&self, reference: bool, verb: &str, conf: &Value) -> Outcome {
        let plugin = if reference {
            self.env.ref_plugin("host-device")
        } else {
            self.env.plugin("host-device")
        };
        plugin
            .attach(verb, "ctr-hd", &self.pod, IFNAME)
            .conf(conf)
            .exec_in(&self.host)
            .run()
    }

    fn host_link(&self, name: &str) -> Option<Value> {
        link(Some(&self.host.name), name)
    }

    fn pod_link(&self, name: &str) -> Option<Value> {
        link(Some(&self.pod.name), name)
    }

    fn mac(&self) -> String {
        self.host_link(DEV).expect("device")["address"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

fn conf(version: &str, key: Value, ipam: Option<Value>) -> Value {
    let mut c = json!({"cniVersion": version, "name": NET, "type": "host-device"});
    for (k, v) in key.as_object().unwrap() {
        c[k] = v.clone();
    }
    if let Some(ipam) = ipam {
        c["ipam"] = ipam;
    }
    c
}

fn static_ipam(nets: &Subnets) -> Value {
    json!({"type": "static",
           "addresses": [{"address": format!("{}/24", nets.v4_addr(5)), "gateway": nets.v4_addr(1)}],
           // With its gateway: the reference's CHECK cannot find a gateway-less one.
           "routes": [{"dst": "192.168.99.0/24", "gw": nets.v4_addr(1)}]})
}

/// ADD, CHECK, DEL (twice) of `key`'s device; returns ADD's result. The device is in
/// the pod as IFNAME with its MAC and its name as alias, then back on the host under
/// its own name with the same MAC, down, alias cleared.
fn round_trip(s: &Setup, reference: bool, conf: &Value) -> Value {
    let mac = s.mac();
    let r = s.call(reference, "ADD", conf).result();
    let inside = s.pod_link(IFNAME).expect("device in the pod");
    assert_eq!(inside["address"], mac.as_str());
    assert_eq!(inside["ifalias"], DEV, "{inside}");
    assert!(has_flag(&inside, "UP"));
    assert!(s.host_link(DEV).is_none(), "still on the host");
    if conf["cniVersion"].as_str() >= Some("0.4.0") {
        let prev = with_prev(conf, &r);
        s.call(reference, "CHECK", &prev).ok_silent();
    }
    s.call(reference, "DEL", conf).ok_silent();
    // A repeated DEL succeeds; the reference 1.1.1 fails it ("failed to find net1").
    let again = s.call(reference, "DEL", conf);
    assert_eq!(again.success(), !reference, "{}", again.stdout);
    let back = s.host_link(DEV).expect("device back on the host");
    assert_eq!(back["address"], mac.as_str());
    // Down, as the reference leaves it; v1.9.1 clears the alias, 1.1.1 leaves it.
    assert!(!has_flag(&back, "UP"), "{back}");
    if !reference {
        assert!(back.get("ifalias").is_none(), "alias left: {back}");
    }
    assert!(s.pod_link(IFNAME).is_none());
    r
}

/// Proves: by `device`, without IPAM and with ipamd, at every spec version, ADD moves
/// the device in (result: the interface with its MAC and sandbox; with IPAM its
/// address on interface 0), CHECK passes, DEL brings it back by name, twice.
#[test]
fn by_device_round_trip_every_version() {
    let env = TestEnv::new("hd_by_device");
    let nets = env.subnets();
    for version in ["0.1.0", "0.2.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        for ipam in [None, Some(env.ipam(Ipam::Ipamd, nets.v4_ranges()))] {
            let s = Setup::new(&env);
            let c = conf(version, json!({"device": DEV}), ipam.clone());
            let r = round_trip(&s, false, &c);
            if version >= "0.3.0" {
                assert_eq!(r["interfaces"][0]["name"], IFNAME, "{r}");
                assert_eq!(r["interfaces"][0]["sandbox"], s.pod.path.as_str());
            }
            if let Some(ipam) = &ipam {
                assert_eq!(env.lease_count(ipam, NET), 0);
            }
        }
    }
}

/// Proves: the same results (shape and values but the MAC) and end state as the
/// reference, by `device`, `hwaddr` and `kernelpath=/sys/devices/virtual` (the first
/// device of its `net/` in the host's sysfs: hd0), with static IPAM and without.
#[test]
fn side_by_side_with_the_reference() {
    let env = TestEnv::new("hd_reference");
    let nets = env.subnets();
    for ipam in [None, Some(static_ipam(&nets))] {
        for key in ["device", "hwaddr", "kernelpath"] {
            let mut results = Vec::new();
            for reference in [true, false] {
                let s = Setup::new(&env);
                let value = match key {
                    "device" => DEV.to_string(),
                    "hwaddr" => s.mac().to_uppercase(),
                    _ => "/sys/devices/virtual".to_string(),
                };
                let c = conf("1.0.0", json!({ key: value }), ipam.clone());
                let mut r = round_trip(&s, reference, &c);
                assert_eq!(r["interfaces"][0]["mac"], s.mac().as_str());
                r["interfaces"][0]["mac"] = json!("");
                r["interfaces"][0]["sandbox"] = json!("");
                results.push(r);
            }
            assert_eq!(results[0], results[1], "{key} {ipam:?}");
        }
    }
}

/// Proves: `kernelpath` naming the net device's own sysfs directory (what
/// /sys/class/net/NAME resolves to) selects it: beyond the reference, which wants a
/// parent device with a `net/` directory and fails here.
#[test]
fn kernelpath_of_the_net_device_itself() {
    let env = TestEnv::new("hd_kernelpath");
    let s = Setup::new(&env);
    let c = conf(
        "1.0.0",
        json!({"kernelpath": format!("/sys/devices/virtual/net/{DEV}")}),
        None,
    );
    assert!(!s.call(true, "ADD", &c).success(), "the reference took it");
    assert!(s.host_link(DEV).is_some());
    round_trip(&s, false, &c);
}

/// Proves: with the pod's netns deleted, DEL succeeds and releases the lease (the
/// veth went with the netns); with ipamd.
#[test]
fn del_when_the_netns_is_gone_releases_the_lease() {
    let env = TestEnv::new("hd_netns_gone");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let s = Setup::new(&env);
    let c = conf("1.1.0", json!({"device": DEV}), Some(ipam.clone()));
    s.call(false, "ADD", &c).result();
    assert_eq!(env.lease_count(&ipam, NET), 1);
    env.del_netns(&s.pod);
    s.call(false, "DEL", &c).ok_silent();
    s.call(false, "DEL", &c).ok_silent();
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: a device the kernel returned from a dying netns (named like CNI_IFNAME,
/// its original name in its alias) is renamed back by DEL, alias cleared.
#[test]
fn del_with_the_netns_gone_renames_a_returned_device_back() {
    let env = TestEnv::new("hd_refund");
    let s = Setup::new(&env);
    let h = s.host.name.as_str();
    ip(&["-n", h, "link", "set", DEV, "down"]);
    ip(&["-n", h, "link", "set", DEV, "name", IFNAME]);
    ip(&["-n", h, "link", "set", IFNAME, "alias", DEV]);
    env.del_netns(&s.pod);
    let c = conf("1.0.0", json!({"device": DEV}), None);
    s.call(false, "DEL", &c).ok_silent();
    let back = s.host_link(DEV).expect("renamed back");
    assert!(back.get("ifalias").is_none(), "{back}");
    assert!(s.host_link(IFNAME).is_none());
}

/// Proves: when another link took the device's name on the host meanwhile, DEL
/// succeeds and the device comes back as hd0_0 (its alias still naming hd0), where the
/// reference fails DEL; ipamd's lease is released either way.
#[test]
fn del_when_the_name_was_taken_meanwhile() {
    let env = TestEnv::new("hd_name_taken");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let s = Setup::new(&env);
    let mac = s.mac();
    let c = conf("1.0.0", json!({"device": DEV}), Some(ipam.clone()));
    s.call(false, "ADD", &c).result();
    let h = s.host.name.as_str();
    ip(&[
        "-n", h, "link", "add", DEV, "type", "veth", "peer", "name", "hdx",
    ]);
    s.call(false, "DEL", &c).ok();
    s.call(false, "DEL", &c).ok_silent();
    let back = s.host_link("hd0_0").expect("back as hd0_0");
    assert_eq!(back["address"], mac.as_str());
    assert_eq!(back["ifalias"], DEV);
    assert!(s.pod_link(IFNAME).is_none());
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Proves: DEL with a configuration ADD would refuse (a `deviceID` that is gone, no
/// device key at all) still releases the lease and brings the device back by its alias.
#[test]
fn del_with_a_configuration_it_cannot_use() {
    let env = TestEnv::new("hd_bad_del_conf");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    for bad in [
        json!({"device": DEV, "runtimeConfig": {"deviceID": "0000:ff:1f.7"}}),
        json!({}),
    ] {
        let s = Setup::new(&env);
        let c = conf("1.0.0", json!({"device": DEV}), Some(ipam.clone()));
        s.call(false, "ADD", &c).result();
        let del_conf = conf("1.0.0", bad.clone(), Some(ipam.clone()));
        s.call(false, "DEL", &del_conf).ok();
        assert!(s.host_link(DEV).is_some(), "{bad}: not back");
        assert!(s.pod_link(IFNAME).is_none(), "{bad}");
        assert_eq!(env.lease_count(&ipam, NET), 0, "{bad}");
    }
}

/// Proves: ADD refuses a device another attachment holds (code 7, saying so) and an
/// interface name taken in the pod (102, the device staying on the host, up); a failed
/// IPAM after the move brings the device back under its name, up; CNI_NETNS being the
/// plugin's own netns is refused.
#[test]
fn refusals_and_rollback() {
    let env = TestEnv::new("hd_refusals");
    let s = Setup::new(&env);
    let c = conf("1.0.0", json!({"device": DEV}), None);
    s.call(false, "ADD", &c).result();
    let other = Setup {
        env: &env,
        host: s.host.clone(),
        pod: env.netns(),
    };
    other
        .call(false, "ADD", &c)
        .expect_err(7, &[DEV, "another attachment"]);
    s.call(false, "DEL", &c).ok_silent();

    let taken = Setup::new(&env);
    let p = taken.pod.name.as_str();
    ip(&[
        "-n", p, "link", "add", IFNAME, "type", "veth", "peer", "name", "x0",
    ]);
    taken.call(false, "ADD", &c).expect_err(102, &[IFNAME]);
    assert!(has_flag(&taken.host_link(DEV).expect("stays"), "UP"));

    let bad_ipam = Setup::new(&env);
    let failing = conf(
        "1.0.0",
        json!({"device": DEV}),
        Some(json!({"type": "nonexistent-ipam"})),
    );
    bad_ipam.call(false, "ADD", &failing).err();
    let back = bad_ipam.host_link(DEV).expect("back on the host");
    assert!(has_flag(&back, "UP"), "{back}");
    assert!(back.get("ifalias").is_none(), "{back}");
    assert_only_lo(&bad_ipam.pod, "failed ADD");
}

/// Proves (with the `fault-injection` feature, as `tests/run` builds): host-device over
/// in-process ipamd, every kernel send and every lease write and fsync of its ADD fails
/// once, and each failure leaves the device on the host under its own name, up, with
/// no alias, the pod empty and no lease; the runtime's DEL then succeeds.
#[cfg(feature = "fault-injection")]
#[test]
fn every_failure_point_of_an_add_puts_the_device_back() {
    let env = TestEnv::new("hd_fault");
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
    let c = conf("1.0.0", json!({"device": DEV}), Some(ipam.clone()));
    let s = Setup::new(&env);
    let mut points = Vec::new();
    for fault in ["CNIKIT_FAULT_NETLINK", "CNIKIT_FAULT_STORE"] {
        for n in 1..200 {
            let what = format!("ADD failing at {fault}={n}");
            // DEL leaves the device down (as the reference does): up, as before an ADD.
            ip(&["-n", &s.host.name, "link", "set", DEV, "up"]);
            let out = s
                .env
                .plugin("host-device")
                .attach("ADD", "ctr-hd", &s.pod, IFNAME)
                .conf(&c)
                .exec_in(&s.host)
                .env(fault, &n.to_string())
                .run();
            if out.success() {
                s.call(false, "DEL", &c).ok_silent();
                points.push(n - 1);
                break;
            }
            let e = out.err();
            assert!(e.msg.contains("injected failure"), "{what}: {e:?}");
            let back = s
                .host_link(DEV)
                .unwrap_or_else(|| panic!("{what}: not back"));
            assert!(has_flag(&back, "UP"), "{what}: {back}");
            assert!(back.get("ifalias").is_none(), "{what}: {back}");
            assert_only_lo(&s.pod, &what);
            assert_eq!(env.lease_count(&ipam, NET), 0, "{what}");
            s.call(false, "DEL", &c).ok_silent();
        }
    }
    eprintln!("host-device ADD: {points:?} failure points (netlink, store)");
    assert!(
        points.len() == 2 && points[0] > 3 && points[1] > 0,
        "{points:?}"
    );
}
