//! portmap's firewall requests for ADD, DEL and GC, with a recording backend.

use super::portmap::Portmap;
use crate::cni::Command;
use crate::cni::Plugin;
use crate::firewall::conntrack::{self, UdpPort};
use crate::firewall::portmap::{Op, Spec};
use crate::firewall::Attachment;
use crate::firewall::{Del, Gc, Recording, Request};
use crate::plugins::firewall_backend::{test_request, FirewallBackend};
use ipnet::IpNet;
use serde_json::json;
use std::sync::Arc;

fn conf(extra: serde_json::Value) -> serde_json::Value {
    let mut c = json!({
        "cniVersion": "1.0.0", "name": "n", "type": "portmap", "snat": false,
        "runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "udp"}
        ]},
        "prevResult": {
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": [{"address": "10.1.0.2/24", "interface": 0}]
        }
    });
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c
}

fn att() -> Attachment {
    Attachment::new("n", "c1", "eth0")
}

#[test]
fn add_maps_then_flushes_udp_conntrack() {
    let got = requests(Command::Add, conf(json!({})));
    assert_eq!(got.len(), 2, "{got:?}");
    let Request::Portmap(Op::Add(Spec {
        att: a,
        container,
        mappings,
        masq,
    })) = &got[0]
    else {
        panic!("{got:?}")
    };
    assert_eq!(a, &att());
    assert_eq!(container, &["10.1.0.2/24".parse::<IpNet>().unwrap()]);
    assert_eq!(mappings[0].host_port, 8080);
    assert!(!masq.snat && !masq.masq_all);
    let Request::Conntrack(conntrack::Op::FlushUdp { targets }) = &got[1] else {
        panic!("{got:?}")
    };
    assert_eq!(
        targets,
        &[UdpPort {
            port: 8080,
            dst: None,
            ipv6: false
        }]
    );
}

#[test]
fn a_refused_mapping_fails_add_and_flushes_nothing() {
    let fw = Arc::new(Recording {
        fail_with: Some(crate::firewall::Error::new(
            crate::firewall::ErrorKind::Conflict,
            "host port udp/8080 belongs to another container",
        )),
        ..Recording::default()
    });
    let req = test_request(Command::Add, conf(json!({})));
    assert!(with(&fw).add(&req).is_err());
    assert_eq!(fw.taken().len(), 1);
}

#[test]
fn del_removes_by_tag_and_gc_keeps_the_valid() {
    let fw = Arc::new(Recording::default());
    let req = test_request(Command::Del, conf(json!({"prevResult": null})));
    with(&fw).del(&req).expect("del");
    assert_eq!(fw.taken(), vec![Request::from(Op::Del(Del { att: att() }))]);

    let gc = json!({"cniVersion": "1.1.0", "name": "n", "type": "portmap",
        "cni.dev/valid-attachments": [{"containerID": "c2", "ifname": "eth0"}]});
    let req = test_request(Command::Gc, gc);
    with(&fw).gc(&req).expect("gc");
    assert_eq!(
        fw.taken(),
        vec![Request::from(Op::Gc(Gc {
            network: "n".into(),
            valid: vec![Attachment::new("n", "c2", "eth0")],
        }))]
    );
}

/// portmap with its firewall requests recorded by `fw`.
fn with(fw: &Arc<Recording>) -> Portmap {
    Portmap {
        firewall: FirewallBackend::fixed(fw.clone()),
    }
}

/// What portmap asks of its firewall for `command`, which must succeed.
fn requests(command: Command, conf: serde_json::Value) -> Vec<Request> {
    let fw = Arc::new(Recording::default());
    with(&fw)
        .call(&test_request(command, conf))
        .expect("portmap");
    fw.taken()
}

#[test]
fn del_with_mappings_and_prev_result_goes_by_key() {
    let got = requests(Command::Del, conf(json!({})));
    let [Request::Portmap(Op::DelKeys(spec))] = got.as_slice() else {
        panic!("{got:?}")
    };
    assert_eq!(spec.att, att());
    assert_eq!(spec.container, ["10.1.0.2/24".parse::<IpNet>().unwrap()]);
    assert_eq!(spec.mappings[0].host_port, 8080);
}

#[test]
fn null_keys_and_empty_conditions_are_unset_as_in_the_reference() {
    let got = requests(
        Command::Add,
        conf(
            json!({"snat": null, "masqAll": null, "markMasqBit": null, "backend": null,
            "conditionsV4": [""], "conditionsV6": null, "externalSetMarkChain": "KUBE-MARK-MASQ"}),
        ),
    );
    let Request::Portmap(Op::Add(spec)) = &got[0] else {
        panic!("{got:?}")
    };
    // snat defaults to true, as for an absent key.
    assert!(spec.masq.snat && !spec.masq.masq_all);
    for (key, list) in [
        ("conditionsV4", json!(["-s", "192.0.2.0/24"])),
        ("conditionsV6", json!(["", "ip6 saddr ::1"])),
    ] {
        let req = test_request(Command::Add, conf(json!({ key: list })));
        let e = with(&Arc::new(Recording::default())).add(&req).unwrap_err();
        assert_eq!(e.code, 2, "{key}: {e:?}");
    }
}

#[test]
fn no_ip_on_the_interface_maps_nothing_and_returns_prev_result() {
    let prev = json!({
        "interfaces": [{"name": "br0"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
        "ips": [{"address": "10.1.0.1/24", "interface": 0}]
    });
    for command in [Command::Add, Command::Check] {
        let fw = Arc::new(Recording::default());
        let req = test_request(command, conf(json!({ "prevResult": prev })));
        let out = with(&fw).call(&req).expect("portmap");
        if command == Command::Add {
            let want = crate::cni::CniResult::from_value(&prev).unwrap();
            assert_eq!(out, Some(want));
        }
        assert_eq!(fw.taken(), vec![], "{command:?}");
    }
    // L2 only: no IPs at all.
    let l2 = json!({"interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}]});
    let fw = Arc::new(Recording::default());
    let req = test_request(Command::Add, conf(json!({ "prevResult": l2 })));
    with(&fw).add(&req).expect("portmap");
    assert_eq!(fw.taken(), vec![]);
}
