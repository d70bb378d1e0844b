//! vlan's configuration: every key, the reference's bounds, Go's key matching.

use super::*;
use crate::cni::gojson::{assert_known, struct_fields};
use crate::cni::Code;
use crate::plugins::firewall_backend::test_request;
use serde_json::{json, Value};

fn conf(extra: Value) -> Value {
    let mut c = json!({"cniVersion": "1.1.0", "name": "n", "type": "vlan",
        "master": "eth0", "ipam": {"type": "ipamd"}});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn load(extra: Value) -> Result<Loaded, Error> {
    Conf::load(&test_request(Command::Add, conf(extra)))
}

#[test]
fn config_keys_get_go_matching() {
    assert_known(&[struct_fields::<Conf>()]);
}

#[test]
fn every_key_is_read() {
    let l = load(json!({"vlanId": 42, "mtu": 1400, "linkInContainer": true})).unwrap();
    assert_eq!(
        l,
        Loaded {
            master: "eth0".into(),
            id: 42,
            mtu: Some(1400),
            link_in_container: true
        }
    );
    // Go's matching: any case of a known key.
    let c = json!({"cniVersion": "1.1.0", "name": "n", "type": "vlan", "ipam": {"type": "ipamd"},
        "VLANID": 7, "Master": "eth1", "MTU": 0, "LinkInContainer": false});
    let l = Conf::load(&test_request(Command::Add, c)).unwrap();
    assert_eq!((l.master.as_str(), l.id, l.mtu), ("eth1", 7, None));
}

#[test]
fn defaults_are_the_references() {
    // No vlanId is Go's 0, which the reference (and the kernel) take.
    let l = load(json!({})).unwrap();
    assert_eq!((l.id, l.mtu, l.link_in_container), (0, None, false));
    let l = load(json!({"vlanId": null, "mtu": null})).unwrap();
    assert_eq!((l.id, l.mtu), (0, None));
}

#[test]
fn bad_values_are_code_7() {
    for (extra, needle) in [
        (json!({"master": ""}), "\"master\" field is required"),
        (json!({"master": null}), "\"master\" field is required"),
        (json!({"master": "a/b"}), "master"),
        (json!({"vlanId": -1}), "invalid VLAN ID -1"),
        (json!({"vlanId": 4095}), "invalid VLAN ID 4095"),
        (json!({"vlanId": "5"}), "vlanId"),
        (json!({"mtu": -1}), "MTU"),
        (json!({"mtu": 67}), "mtu"),
        (json!({"linkInContainer": "yes"}), "linkInContainer"),
    ] {
        let e = load(extra.clone()).expect_err(&extra.to_string());
        assert_eq!(e.code, 7, "{extra}: {e:?}");
        assert!(e.msg.contains(needle), "{extra}: {}", e.msg);
    }
    assert_eq!(load(json!({"vlanId": 4094})).unwrap().id, 4094);
}

/// ADD, CHECK and STATUS without IPAM fail before any netns or kernel call.
#[test]
fn ipam_is_required() {
    for ipam in [json!(null), json!({}), json!({"type": ""})] {
        let c = conf(json!({"ipam": ipam}));
        for command in [Command::Add, Command::Check, Command::Status] {
            let e = Vlan
                .call(&test_request(command, c.clone()))
                .expect_err("no IPAM");
            assert_eq!(e.code, 7, "{command:?}: {e:?}");
            assert!(e.msg.contains("requires an IPAM"), "{}", e.msg);
        }
        Vlan.gc(&test_request(Command::Gc, c)).unwrap();
    }
}

fn link(kind: &str, mtu: u32) -> Link {
    Link {
        index: 3,
        name: "eth0".into(),
        kind: Some(kind.into()),
        mac: Some("ee:2d:0a:58:01:02".into()),
        mtu,
        master: None,
        up: true,
        promisc: false,
        allmulti: false,
        txqlen: 1000,
        link: Some(2),
        macvlan_mode: None,
        ipvlan_mode: None,
        alias: None,
        bridge_default_pvid: None,
    }
}

#[test]
fn check_wants_a_vlan_of_the_configured_id_mac_and_mtu() {
    let c = load(json!({"vlanId": 5, "mtu": 1400})).unwrap();
    let mac = "EE:2D:0A:58:01:02";
    expect_vlan(&link("vlan", 1400), Some(5), &c, mac).unwrap();
    expect_vlan(&link("vlan", 1400), Some(5), &c, "").unwrap();
    for (l, id, m, needle) in [
        (link("veth", 1400), Some(5), mac, "not a vlan"),
        (link("vlan", 1400), Some(6), mac, "VLAN id 6"),
        (link("vlan", 1400), None, mac, "VLAN id none"),
        (link("vlan", 1500), Some(5), mac, "MTU 1500"),
        (link("vlan", 1400), Some(5), "ee:2d:0a:58:01:03", "MAC"),
    ] {
        let e = expect_vlan(&l, id, &c, m).unwrap_err();
        assert_eq!(e.code, Code::Kernel as u32);
        assert!(e.msg.contains(needle), "{needle}: {}", e.msg);
    }
    // No mtu configured: any MTU.
    let c = load(json!({"vlanId": 5})).unwrap();
    expect_vlan(&link("vlan", 9000), Some(5), &c, mac).unwrap();
}
