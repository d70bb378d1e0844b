//! bridge's configuration: keys, defaults and refusals (the kernel side is in
//! tests/it/bridge).

use super::*;
use crate::cni::gojson::{assert_known, struct_fields};
use crate::plugins::firewall_backend::test_request;

#[test]
fn config_keys_get_go_matching() {
    assert_known(&[
        struct_fields::<Conf>(),
        struct_fields::<Trunk>(),
        struct_fields::<MasqKeys>(),
    ]);
}

#[test]
fn the_default_vlan_is_not_preserved_by_default() {
    // The reference's default since v1.8.0 (the kernel side: tests/vm).
    let conf =
        serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge", "vlan": 10});
    let req = test_request(crate::cni::Command::Add, conf);
    assert!(!Conf::load(&req).unwrap().preserve_default_vlan);
}

fn load(extra: serde_json::Value) -> Result<Conf, Error> {
    let mut conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge"});
    conf.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    Conf::load(&test_request(crate::cni::Command::Add, conf))
}

#[test]
fn null_keys_are_unset_as_for_go() {
    let c = load(serde_json::json!({"bridge": null, "isGateway": null,
        "isDefaultGateway": null, "ipMasq": null, "mtu": null, "vlan": null,
        "vlanTrunk": null, "hairpinMode": null, "preserveDefaultVlan": null}))
    .unwrap();
    assert_eq!(c.bridge, "cni0");
    assert!(!c.is_gateway && !c.masq.ip_masq && !c.uses_vlans());
}

#[test]
fn vlan_trunk_shapes_are_the_references() {
    let ids = |trunk: serde_json::Value| load(serde_json::json!({"vlanTrunk": trunk}))?.trunk_ids();
    // id and a range in one entry both count; {} adds nothing; each VLAN once, in order.
    let got = ids(
        serde_json::json!([{"id": 5, "minID": 10, "maxID": 12}, {}, {"id": 11},
        {"minID": 3, "maxID": 5}, {"id": null, "minID": 20, "maxID": 20}]),
    );
    assert_eq!(got.unwrap(), [3, 4, 5, 10, 11, 12, 20]);
    assert_eq!(ids(serde_json::json!([{}])).unwrap(), Vec::<u16>::new());
    for bad in [
        serde_json::json!([{"minID": 10}]),
        serde_json::json!([{"maxID": 10, "id": 3}]),
        serde_json::json!([{"minID": 12, "maxID": 10}]),
        serde_json::json!([{"minID": 0, "maxID": 10}]),
        serde_json::json!([{"minID": 1, "maxID": 4095}]),
        serde_json::json!([{"id": 4095}]),
        serde_json::json!([{"id": 0}]),
    ] {
        assert_eq!(ids(bad.clone()).unwrap_err().code, 7, "{bad}");
    }
    // Present, even empty, turns VLAN filtering on as in the reference;
    // absent or null does not.
    for (trunk, on) in [
        (serde_json::json!([]), true),
        (serde_json::json!([{}]), true),
        (serde_json::json!(null), false),
    ] {
        let c = load(serde_json::json!({"vlanTrunk": trunk})).unwrap();
        assert_eq!(c.uses_vlans(), on, "{trunk}");
    }
}

#[test]
fn an_unknown_ip_masq_backend_fails_add_only_when_masquerading() {
    let masq = |extra: serde_json::Value| {
        let mut conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge",
            "ipam": {"type": "ipamd"}});
        conf.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let req = test_request(crate::cni::Command::Add, conf);
        Conf::load(&req)?.masq.check_backend("bridge", &req)
    };
    for ok in ["nftables", "iptables"] {
        masq(serde_json::json!({"ipMasq": true, "ipMasqBackend": ok})).unwrap();
    }
    masq(serde_json::json!({"ipMasq": true, "ipMasqBackend": null})).unwrap();
    masq(serde_json::json!({"ipMasq": false, "ipMasqBackend": "bogus"})).unwrap();
    let e = masq(serde_json::json!({"ipMasq": true, "ipMasqBackend": "bogus"})).unwrap_err();
    assert!(e.code == 7 && e.msg.contains("bogus"), "{e:?}");
    // Loading alone (CHECK, STATUS, GC) does not look at it, as in the reference.
    load(serde_json::json!({"ipMasq": true, "ipMasqBackend": "bogus"})).unwrap();
}

#[test]
fn bridge_names_follow_the_kernels_rules() {
    for bad in ["br%d", "a\u{0}b", "a/b", "br 0"] {
        let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge", "bridge": bad});
        let req = test_request(crate::cni::Command::Add, conf);
        assert_eq!(Conf::load(&req).unwrap_err().code, 7, "{bad:?}");
    }
    // The VLAN gateway's `<bridge>.<vid>` is a name too: 12 + 1 + 4 bytes is too long.
    let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge",
        "bridge": "br-123456789", "vlan": 4000, "isGateway": true});
    let req = test_request(crate::cni::Command::Add, conf);
    let e = Conf::load(&req).unwrap_err();
    assert_eq!(e.code, 7, "{e:?}");
    assert!(e.msg.contains("VLAN gateway"), "{e:?}");
}
