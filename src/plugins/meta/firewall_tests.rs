//! firewall's configuration and the requests it makes, recorded instead of
//! applied.

use super::*;
use crate::cni::Command;
use crate::firewall::{Recording, Request as FwRequest};
use crate::plugins::firewall_backend::test_request;
use serde_json::{json, Value};
use std::sync::Arc;

fn conf(extra: Value) -> Value {
    let mut c = json!({
        "cniVersion": "1.0.0", "name": "podman", "type": "firewall",
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "cni-podman0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": [
                {"address": "10.88.0.2/16", "interface": 2},
                {"address": "fd00::2/64", "interface": 2}
            ]
        }
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// The plugin with a recording backend, and what `command` asked of it.
fn run(command: Command, c: Value) -> (Result<(), Error>, Vec<FwRequest>) {
    let rec = Arc::new(Recording::default());
    let plugin = FirewallPlugin {
        firewall: FirewallBackend::fixed(rec.clone()),
    };
    let req = test_request(command, c);
    (plugin.call(&req).map(drop), rec.taken())
}

#[test]
fn config_keys_get_go_matching() {
    use crate::cni::gojson::{assert_known, struct_fields};
    assert_known(&[struct_fields::<Conf>()]);
}

#[test]
fn podman_config_adds_both_addresses() {
    // Podman 4.3 writes an empty backend.
    let (out, reqs) = run(Command::Add, conf(json!({"backend": ""})));
    out.unwrap();
    let [FwRequest::Forward(Op::Add(spec))] = reqs.as_slice() else {
        panic!("{reqs:?}");
    };
    assert_eq!(spec.addrs.len(), 2);
    assert_eq!(spec.admin_chain, "CNI-ADMIN");
    assert_eq!(spec.isolation, None);
    assert_eq!(spec.att.tag(), "podman/c1/eth0");
}

#[test]
fn a_backend_the_reference_does_not_know_means_the_automatic_choice() {
    // The reference's getBackend falls back for any value but its two.
    for backend in ["nftables", "ebtables", "IPTABLES"] {
        let (out, reqs) = run(Command::Add, conf(json!({ "backend": backend })));
        out.unwrap();
        assert!(
            matches!(reqs.as_slice(), [FwRequest::Forward(Op::Add(_))]),
            "{backend}: {reqs:?}"
        );
    }
}

#[test]
fn ingress_policies_name_the_bridge() {
    for (policy, isolated) in [("same-bridge", false), ("isolated", true)] {
        let (out, reqs) = run(
            Command::Add,
            conf(json!({"ingressPolicy": policy, "iptablesAdminChainName": "MY-ADMIN"})),
        );
        out.unwrap();
        let [FwRequest::Forward(Op::Add(spec))] = reqs.as_slice() else {
            panic!("{reqs:?}");
        };
        let iso = spec.isolation.as_ref().unwrap();
        assert_eq!(
            (iso.bridge.as_str(), iso.isolated),
            ("cni-podman0", isolated)
        );
        assert_eq!(spec.admin_chain, "MY-ADMIN");
    }
    let mut c = conf(json!({"ingressPolicy": "same-bridge"}));
    c["prevResult"]["interfaces"] = json!([]);
    let (out, _) = run(Command::Add, c.clone());
    assert!(out.unwrap_err().msg.contains("chain firewall after bridge"));
    c["prevResult"]["interfaces"] = json!([{"name": "a-bridge-name-too-long"}]);
    let (out, reqs) = run(Command::Add, c);
    assert_eq!((out.unwrap_err().code, reqs.len()), (7, 0));
}

#[test]
fn bad_values_are_refused_before_any_request() {
    for (extra, code, needle) in [
        (json!({"backend": "firewalld"}), 2, "firewalld"),
        (json!({"ingressPolicy": "closed"}), 7, "ingressPolicy"),
        (
            json!({"iptablesAdminChainName": "has space"}),
            7,
            "iptablesAdminChainName",
        ),
        (
            json!({"iptablesAdminChainName": "A".repeat(29)}),
            7,
            "longer than 28",
        ),
        (json!({"iptablesAdminChainName": "ACCEPT"}), 7, "built-in"),
    ] {
        let (out, reqs) = run(Command::Add, conf(extra.clone()));
        let e = out.unwrap_err();
        assert_eq!((e.code, reqs.len()), (code, 0), "{extra}: {e}");
        assert!(e.msg.contains(needle), "{extra}: {}", e.msg);
    }
    let mut c = conf(json!({}));
    c.as_object_mut().unwrap().remove("prevResult");
    let (out, _) = run(Command::Add, c);
    assert_eq!(out.unwrap_err().code, 7);
}

#[test]
fn del_goes_by_tag_whatever_the_config() {
    let mut c = conf(json!({"backend": "firewalld", "ingressPolicy": 3}));
    c.as_object_mut().unwrap().remove("prevResult");
    let (out, reqs) = run(Command::Del, c);
    out.unwrap();
    let [FwRequest::Forward(Op::Del(del))] = reqs.as_slice() else {
        panic!("{reqs:?}");
    };
    assert_eq!(del.att.tag(), "podman/c1/eth0");
    assert!(del.addrs.is_empty());
    // With a prevResult, its addresses ride along (for the reference's rules).
    let (out, reqs) = run(Command::Del, conf(json!({})));
    out.unwrap();
    let [FwRequest::Forward(Op::Del(del))] = reqs.as_slice() else {
        panic!("{reqs:?}");
    };
    assert_eq!(del.addrs.len(), 2);
}

#[test]
fn gc_sends_the_valid_list() {
    let c = json!({
        "cniVersion": "1.1.0", "name": "podman", "type": "firewall",
        "cni.dev/valid-attachments": [{"containerID": "c2", "ifname": "eth0"}],
    });
    let (out, reqs) = run(Command::Gc, c);
    out.unwrap();
    let [FwRequest::Forward(Op::Gc(gc))] = reqs.as_slice() else {
        panic!("{reqs:?}");
    };
    assert_eq!(gc.valid.len(), 1);
}
