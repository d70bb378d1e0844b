//! tuning's configuration: keys, precedence, refusals (the kernel side is in
//! tests/it/tuning.rs).

use super::*;
use crate::cni::args::CniArgs;
use crate::cni::gojson::{assert_known, struct_fields};
use crate::cni::Command;
use crate::plugins::firewall_backend::test_request;
use serde_json::json;

fn request(extra: Value) -> Request {
    let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "tuning"});
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    test_request(Command::Add, conf)
}

fn load(extra: Value) -> Result<Settings, Error> {
    Settings::load(&request(extra), Path::new("/nonexistent/allowlist.conf"))
}

#[test]
fn config_keys_get_go_matching() {
    assert_known(&[struct_fields::<Conf>(), struct_fields::<Backup>()]);
}

#[test]
fn mac_precedence_is_the_references() {
    let mut req = request(json!({"mac": "0a:00:00:00:00:01"}));
    let allow = Path::new("/nonexistent");
    let mac = |req: &Request| Settings::load(req, allow).unwrap().link.mac.unwrap();
    assert_eq!(mac(&req), "0a:00:00:00:00:01");
    req.args = CniArgs::parse("MAC=0A:00:00:00:00:02").unwrap();
    assert_eq!(mac(&req), "0a:00:00:00:00:02");
    let mut rt = request(json!({"mac": "0a:00:00:00:00:01",
        "runtimeConfig": {"mac": "0a:00:00:00:00:03"}}));
    rt.args = req.args.clone();
    assert_eq!(mac(&rt), "0a:00:00:00:00:03");
    let mut all = request(json!({"mac": "0a:00:00:00:00:01",
        "runtimeConfig": {"mac": "0a:00:00:00:00:03"},
        "args": {"cni": {"mac": "0a:00:00:00:00:04"}}}));
    all.args = req.args.clone();
    assert_eq!(mac(&all), "0a:00:00:00:00:04");
}

#[test]
fn empty_and_null_macs_are_the_references() {
    let mac = |extra: Value, env: &str| {
        let mut req = request(extra);
        req.args = CniArgs::parse(env).unwrap();
        Settings::load(&req, Path::new("/nonexistent")).map(|s| s.link.mac)
    };
    // Empty is unset and the next in the order counts; Go's other MAC forms are taken.
    let rt = json!({"mac": "0a58.0000.0001", "runtimeConfig": {"mac": ""}});
    assert_eq!(
        mac(rt.clone(), "MAC=").unwrap().as_deref(),
        Some("0a:58:00:00:00:01")
    );
    assert_eq!(
        mac(rt, "MAC=0A-58-00-00-00-02").unwrap().as_deref(),
        Some("0a:58:00:00:00:02")
    );
    // args.cni.mac is a pointer in the reference: "" there leaves the MAC alone, null does not.
    let args = |m: Value| json!({"runtimeConfig": {"mac": "0a:58:00:00:00:03"}, "args": {"cni": {"mac": m}}});
    assert_eq!(mac(args(json!("")), "").unwrap(), None);
    assert_eq!(
        mac(args(Value::Null), "").unwrap().as_deref(),
        Some("0a:58:00:00:00:03")
    );
    let e = mac(json!({"mac": "02:00:5e:10:00:00:00:01"}), "").unwrap_err();
    assert!(e.code == 7 && e.msg.contains("6-byte"), "{e:?}");
}

#[test]
fn args_cni_overrides_and_merges_sysctls() {
    let s = load(json!({
        "sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1", "net.core.somaxconn": "100"},
        "mtu": 1400, "promisc": false, "txQLen": 100,
        "args": {"cni": {"sysctl": {"net.core.somaxconn": "200", "net.ipv6.conf.all.forwarding": "0"},
                         "mtu": 1300, "promisc": true, "allmulti": false, "txQLen": 0}}
    }))
    .unwrap();
    let sysctls: Vec<(&str, &str)> = s
        .sysctls
        .iter()
        .map(|(_, p, v)| (p.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        sysctls,
        [
            ("net/ipv4/conf/eth0/arp_notify", "1"),
            ("net/core/somaxconn", "200"),
            ("net/ipv6/conf/all/forwarding", "0")
        ]
    );
    assert_eq!(s.link.mtu, Some(1300));
    assert_eq!(s.link.promisc, Some(true));
    assert_eq!(s.link.allmulti, Some(false));
    assert_eq!(s.link.tx_qlen, Some(0));
    assert_eq!(s.dir, PathBuf::from("/run/cni/tuning"));
    assert!(load(json!({})).unwrap().link.is_empty());
    // mtu 0 and promisc false change nothing, as in the reference.
    assert!(load(json!({"mtu": 0, "promisc": false}))
        .unwrap()
        .link
        .is_empty());
}

#[test]
fn bad_values_are_refused_with_7() {
    for bad in [
        json!({"mtu": 10}),
        json!({"mtu": -1}),
        json!({"txQLen": -1}),
        json!({"mac": "zz"}),
        json!({"sysctl": {"kernel.shmmax": "1"}}),
        json!({"sysctl": {"net.core.somaxconn": 100}}),
        json!({"sysctl": ["net.a"]}),
        json!({"runtimeConfig": {"mac": 5}}),
        json!({"args": {"cni": {"mtu": "big"}}}),
    ] {
        let e = load(bad.clone()).unwrap_err();
        assert_eq!(e.code, 7, "{bad}: {e}");
    }
}

#[test]
fn add_needs_prev_result() {
    let req = request(json!({"mtu": 1400}));
    let e = Tuning.add(&req).unwrap_err();
    assert_eq!(e.code, 7);
    assert!(e.msg.contains("prevResult"), "{}", e.msg);
}
