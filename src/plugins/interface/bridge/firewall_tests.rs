//! bridge's firewall requests (ipMasq, macspoofchk) for ADD, DEL and GC, with
//! a recording backend: no root, no kernel.

use super::firewall::{apply_add, del, gc};
use super::Conf;
use crate::cni::{Attachment, CniResult, Command, Request};
use crate::firewall::{self, macspoof, masq, Del, Gc, Recording};
use crate::plugins::firewall_backend::test_request;
use serde_json::{json, Value};
use std::sync::Arc;

const MAC: &str = "0a:58:0a:01:00:02";

fn conf(extra: Value) -> Value {
    let mut c = json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge"});
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c
}

fn request(command: Command, extra: Value) -> (Request, Conf) {
    let req = test_request(command, conf(extra));
    let conf = Conf::load(&req).expect("bridge conf");
    (req, conf)
}

fn result(addresses: &[&str]) -> CniResult {
    let ips: Vec<Value> = addresses.iter().map(|a| json!({"address": a})).collect();
    CniResult::from_value(&json!({"cniVersion": "1.1.0", "ips": ips})).expect("result")
}

fn att() -> Attachment {
    Attachment::new("n", "c1", "eth0")
}

fn failing() -> Arc<Recording> {
    Arc::new(Recording {
        fail_with: Some(firewall::Error::new(
            firewall::ErrorKind::Other,
            "netlink said no",
        )),
        ..Recording::default()
    })
}

#[test]
fn add_masquerades_every_address_except_to_its_subnet() {
    let fw = Arc::new(Recording::default());
    let (req, c) = request(Command::Add, json!({"ipMasq": true}));
    let res = result(&["10.1.0.2/24", "fd00::2/64"]);
    apply_add(&*fw, &req, &c, "veth1", None, &res).expect("add");
    assert_eq!(
        fw.taken(),
        vec![firewall::Request::from(masq::Op::Add {
            att: att(),
            addrs: vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            subnets: vec!["10.1.0.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()],
        })]
    );
}

/// `ipMasqExclude` (a cluster pool's CIDRs): pod-to-pod traffic between nodes keeps its
/// source; DEL by keys names the same structures ADD used.
#[test]
fn ip_masq_exclude_joins_the_subnets_kept_unmasqueraded() {
    let fw = Arc::new(Recording::default());
    let extra = json!({"ipMasq": true, "ipMasqExclude": ["10.244.0.0/16", "fd00:244::/104"]});
    let (req, c) = request(Command::Add, extra);
    let res = result(&["10.244.1.2/26"]);
    apply_add(&*fw, &req, &c, "veth1", None, &res).expect("add");
    assert_eq!(
        fw.taken(),
        vec![firewall::Request::from(masq::Op::Add {
            att: att(),
            addrs: vec!["10.244.1.2".parse().unwrap()],
            subnets: ["10.244.1.0/26", "10.244.0.0/16", "fd00:244::/104"]
                .iter()
                .map(|n| n.parse().unwrap())
                .collect(),
        })]
    );
}

#[test]
fn add_without_firewall_keys_or_addresses_asks_for_nothing() {
    let fw = Arc::new(Recording::default());
    add_with_mac(&fw, json!({})).expect("add");
    let (req, c) = request(Command::Add, json!({"ipMasq": true}));
    apply_add(&*fw, &req, &c, "veth1", None, &result(&[])).expect("add");
    assert_eq!(fw.taken(), vec![]);
}

#[test]
fn add_guards_the_host_port_with_the_container_mac() {
    let fw = Arc::new(Recording::default());
    add_with_mac(&fw, json!({"ipMasq": true, "macspoofchk": true})).expect("add");
    let second = macspoof::Op::add(&att(), "veth1", MAC).unwrap();
    assert_masq_add_then(&fw, second.into());
}

#[test]
fn a_failed_macspoofchk_takes_back_the_masquerade() {
    let fw = Arc::new(Recording::default());
    let extra = json!({"ipMasq": true, "macspoofchk": true});
    let (req, c) = request(Command::Add, extra);
    // No MAC could be read from the container's link: the check cannot be set up.
    assert!(apply_add(&*fw, &req, &c, "veth1", None, &result(&["10.1.0.2/24"])).is_err());
    assert_masq_add_then(&fw, masq::Op::Del(Del { att: att() }).into());
}

/// ADD with the `extra` keys, for a pod with one IPv4 address and a MAC.
fn add_with_mac(fw: &Recording, extra: Value) -> Result<(), crate::cni::Error> {
    let (req, c) = request(Command::Add, extra);
    apply_add(fw, &req, &c, "veth1", Some(MAC), &result(&["10.1.0.2/24"]))
}

/// Exactly two requests were made: a masquerade ADD, then `second`.
fn assert_masq_add_then(fw: &Recording, second: firewall::Request) {
    let got = fw.taken();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(matches!(
        &got[0],
        firewall::Request::Masq(masq::Op::Add { .. })
    ));
    assert_eq!(got[1], second);
}

#[test]
fn a_refused_masquerade_fails_add_before_anything_else() {
    let fw = failing();
    let err = add_with_mac(&fw, json!({"ipMasq": true, "macspoofchk": true})).unwrap_err();
    assert!(err.msg.contains("netlink said no"), "{}", err.msg);
    assert_eq!(fw.taken().len(), 1);
}

#[test]
fn del_removes_by_tag_what_the_config_enables() {
    let fw = Arc::new(Recording::default());
    let extra = json!({"ipMasq": true, "macspoofchk": true});
    let (req, c) = request(Command::Del, extra);
    del(&*fw, &req, &c).expect("del");
    assert_eq!(
        fw.taken(),
        vec![
            firewall::Request::from(masq::Op::Del(Del { att: att() })),
            firewall::Request::from(macspoof::Op::Del(Del { att: att() })),
        ]
    );
    let (req, c) = request(Command::Del, json!({"ipMasq": true}));
    del(&*fw, &req, &c).expect("del");
    assert_eq!(
        fw.taken(),
        vec![firewall::Request::from(masq::Op::Del(Del { att: att() }))]
    );
}

#[test]
fn gc_keeps_the_valid_whatever_the_config_says_now() {
    let fw = Arc::new(Recording::default());
    let extra = json!({"cni.dev/valid-attachments": [{"containerID": "c2", "ifname": "eth0"}]});
    let (req, _) = request(Command::Gc, extra);
    gc(&*fw, &req).expect("gc");
    let valid = vec![Attachment::new("n", "c2", "eth0")];
    assert_eq!(
        fw.taken(),
        vec![
            firewall::Request::from(masq::Op::Gc(Gc {
                network: "n".into(),
                valid: valid.clone(),
            })),
            firewall::Request::from(macspoof::Op::Gc(Gc {
                network: "n".into(),
                valid,
            })),
        ]
    );
    let (req, _) = request(Command::Gc, json!({}));
    gc(&*fw, &req).expect("gc without a valid list");
    assert_eq!(fw.taken(), vec![]);
}

#[test]
fn gc_tries_both_and_reports_both_failures() {
    let fw = failing();
    let extra = json!({"cni.dev/valid-attachments": []});
    let (req, _) = request(Command::Gc, extra);
    let err = gc(&*fw, &req).unwrap_err();
    assert_eq!(fw.taken().len(), 2);
    assert_eq!(err.msg.matches("netlink said no").count(), 2, "{}", err.msg);
}

#[test]
fn del_with_a_prev_result_goes_by_key() {
    let fw = Arc::new(Recording::default());
    let prev = json!({"cniVersion": "1.1.0",
        "interfaces": [{"name": "cni0"}, {"name": "veth1"},
                       {"name": "eth0", "mac": MAC, "sandbox": "/run/netns/x"}],
        "ips": [{"address": "10.1.0.2/24", "interface": 2}]});
    let extra = json!({"ipMasq": true, "macspoofchk": true, "bridge": "cni0", "prevResult": prev});
    let (req, c) = request(Command::Del, extra);
    del(&*fw, &req, &c).expect("del");
    assert_eq!(
        fw.taken(),
        vec![
            firewall::Request::from(masq::Op::DelKeys {
                att: att(),
                addrs: vec!["10.1.0.2".parse().unwrap()],
                subnets: vec!["10.1.0.0/24".parse().unwrap()],
            }),
            firewall::Request::from(macspoof::Op::DelKeys {
                att: att(),
                host_ifname: "veth1".into(),
                mac: MAC.into(),
            }),
        ]
    );
}

#[test]
fn check_asks_for_the_masquerade_of_the_pods_addresses() {
    use crate::plugins::masquerade;
    let fw = Arc::new(Recording::default());
    // A chain's result may list another plugin's interface and address too.
    let prev = CniResult::from_value(&json!({"cniVersion": "1.1.0",
        "interfaces": [{"name": "cni0"}, {"name": "veth1"},
                       {"name": "eth0", "mac": MAC, "sandbox": "/run/netns/x"},
                       {"name": "net1", "sandbox": "/run/netns/x"}],
        "ips": [{"address": "10.1.0.2/24", "interface": 2},
                {"address": "192.168.5.2/24", "interface": 3},
                {"address": "fd00::2/64"}]}))
    .expect("result");
    let (req, _) = request(Command::Check, json!({"ipMasq": true}));
    masquerade::check(&*fw, &req, &prev, &[]).expect("check");
    assert_eq!(
        fw.taken(),
        vec![firewall::Request::from(masq::Op::Check {
            att: att(),
            addrs: vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            subnets: vec!["10.1.0.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()],
        })]
    );
    masquerade::check(&*fw, &req, &result(&[]), &[]).expect("nothing to check");
    assert_eq!(fw.taken(), vec![]);
}

#[test]
fn a_missing_masquerade_fails_check_with_code_100() {
    let fw = Arc::new(Recording {
        fail_with: Some(firewall::Error::new(
            firewall::ErrorKind::Mismatch,
            "CHECK: masquerade of 10.1.0.2: set masq4-x of table inet cnikit is missing",
        )),
        ..Recording::default()
    });
    let (req, _) = request(Command::Check, json!({"ipMasq": true}));
    let err = crate::plugins::masquerade::check(&*fw, &req, &result(&["10.1.0.2/24"]), &[])
        .expect_err("a mismatch");
    assert_eq!(err.code, 100);
    assert!(err.msg.contains("masq4-x"), "{}", err.msg);
}
