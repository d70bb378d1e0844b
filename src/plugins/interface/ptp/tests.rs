//! ptp's configuration and its checks of the IPAM result (the kernel side is
//! in tests/it/ptp.rs).

use super::routing::hops;
use super::*;
use crate::cni::gojson::{assert_known, struct_fields};
use crate::cni::Code;
use crate::firewall::{self, masq, Del, Recording};
use crate::plugins::firewall_backend::test_request;
use serde_json::{json, Value};
use std::sync::Arc;

fn request(command: Command, extra: Value) -> Request {
    let mut conf = json!({"cniVersion": "1.1.0", "name": "n", "type": "ptp",
        "ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}});
    conf.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    test_request(command, conf)
}

fn load(extra: Value) -> Result<Conf, Error> {
    Conf::load(&request(Command::Add, extra))
}

#[test]
fn config_keys_get_go_matching() {
    assert_known(&[struct_fields::<Conf>(), struct_fields::<MasqKeys>()]);
}

#[test]
fn defaults_and_null_keys_are_the_references() {
    let c = load(json!({})).unwrap();
    assert!(!c.masq.ip_masq && c.mtu.is_none() && c.masq.ip_masq_backend.is_none());
    let c = load(json!({"ipMasq": null, "mtu": null, "ipMasqBackend": null})).unwrap();
    assert!(!c.masq.ip_masq && c.mtu.is_none());
    // Go's decoder matches keys without regard to case.
    let c = load(json!({"IPMasq": true, "MTU": 1400})).unwrap();
    assert!(c.masq.ip_masq);
    assert_eq!(c.mtu, Some(1400));
    assert_eq!(load(json!({"mtu": 0})).unwrap().mtu, None);
    assert_eq!(load(json!({"mtu": 40})).unwrap_err().code, 7);
    assert_eq!(load(json!({"ipMasq": "yes"})).unwrap_err().code, 7);
}

#[test]
fn ipam_is_required_but_del_goes_on_without_it() {
    let e = load(json!({"ipam": null})).unwrap_err();
    assert_eq!(e.code, 7);
    assert!(e.msg.contains("IPAM"), "{}", e.msg);
    let del = request(
        Command::Del,
        json!({"ipam": null, "daemonSocket": "/x.sock"}),
    );
    let c = del
        .conf_or_del_fallback(Conf::load, Conf::del_fallback)
        .unwrap();
    assert!(c.masq.ip_masq, "DEL still removes masquerade entries");
    assert_eq!(c.daemon_socket.as_deref(), Some(Path::new("/x.sock")));
}

#[test]
fn an_unknown_masquerade_backend_is_refused_only_when_masquerading() {
    let check = |extra: Value| {
        let req = request(Command::Add, extra);
        let c = Conf::load(&req).unwrap();
        c.masq.check_backend(PLUGIN, &req)
    };
    assert!(check(json!({"ipMasqBackend": "pf"})).is_ok());
    let e = check(json!({"ipMasq": true, "ipMasqBackend": "pf"})).unwrap_err();
    assert_eq!(e.code, 7);
    for ok in ["iptables", "nftables"] {
        assert!(check(json!({"ipMasq": true, "ipMasqBackend": ok})).is_ok());
    }
}

fn result(ips: Value) -> CniResult {
    CniResult::from_value(&json!({"cniVersion": "1.1.0", "ips": ips})).expect("result")
}

#[test]
fn every_address_needs_a_gateway_of_its_family() {
    let ok = result(json!([
        {"address": "10.1.0.5/24", "gateway": "10.1.0.1"},
        {"address": "fd00::5/64", "gateway": "fe80::1"},
    ]));
    let got = hops(&ok).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].gateway.to_string(), "fe80::1");
    let none = hops(&result(json!([]))).unwrap_err();
    assert_eq!(none.code, Code::Delegate as u32);
    let no_gw = hops(&result(json!([{"address": "10.1.0.5/24"}]))).unwrap_err();
    assert!(no_gw.msg.contains("no gateway"), "{}", no_gw.msg);
    let mixed = result(json!([{"address": "10.1.0.5/24", "gateway": "fd00::1"}]));
    assert!(hops(&mixed).is_err());
}

/// A DEL whose configuration cannot be used (here: no IPAM) still takes
/// the attachment's masquerade entries away, by tag; with no netns there is
/// nothing else to do.
#[test]
fn a_del_with_an_unusable_config_removes_the_masquerade_by_tag() {
    let fw = Arc::new(Recording::default());
    let plugin = Ptp {
        firewall: FirewallBackend::fixed(fw.clone()),
    };
    let mut req = request(Command::Del, json!({"ipam": null}));
    req.env.netns = String::new();
    plugin.del(&req).expect("del");
    let att = req.attachment();
    assert_eq!(
        fw.taken(),
        vec![firewall::Request::from(masq::Op::Del(Del { att }))]
    );
}
