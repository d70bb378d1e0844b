//! vrf's configuration and its pure choices.

use super::*;
use crate::cni::gojson::{assert_known, struct_fields};
use crate::cni::Command;
use crate::plugins::firewall_backend::test_request;
use serde_json::{json, Value};

fn load(extra: Value) -> Result<Loaded, Error> {
    let mut c = json!({"cniVersion": "1.1.0", "name": "n", "type": "vrf"});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    Conf::load(&test_request(Command::Add, c))
}

#[test]
fn config_keys_get_go_matching() {
    assert_known(&[struct_fields::<Conf>()]);
}

#[test]
fn every_key_is_read() {
    let l = load(json!({"vrfname": "blue", "table": 100})).unwrap();
    assert_eq!(
        l,
        Loaded {
            vrf: "blue".into(),
            table: Some(100)
        }
    );
    // Go's matching, and table 0 (or none) is unset.
    let l = load(json!({"VRFName": "red", "Table": 0})).unwrap();
    assert_eq!((l.vrf.as_str(), l.table), ("red", None));
    assert_eq!(load(json!({"vrfname": "red"})).unwrap().table, None);
}

#[test]
fn bad_values_are_code_7() {
    for (extra, needle) in [
        (json!({}), "vrf name"),
        (json!({"vrfname": ""}), "vrf name"),
        (json!({"vrfname": "a/b"}), "vrfname"),
        (json!({"vrfname": "0123456789abcdef"}), "vrfname"),
        (json!({"vrfname": "v", "table": -1}), "table"),
        (json!({"vrfname": "v", "table": "5"}), "table"),
    ] {
        let e = load(extra.clone()).expect_err(&extra.to_string());
        assert_eq!(e.code, 7, "{extra}: {e:?}");
        assert!(e.msg.contains(needle), "{extra}: {}", e.msg);
    }
}

#[test]
fn add_and_check_need_prev_result() {
    let c = json!({"cniVersion": "1.1.0", "name": "n", "type": "vrf", "vrfname": "blue"});
    for command in [Command::Add, Command::Check] {
        let e = Vrf.call(&test_request(command, c.clone())).unwrap_err();
        assert_eq!(e.code, 7, "{e:?}");
        assert!(e.msg.contains("prevResult"), "{}", e.msg);
    }
    Vrf.status(&test_request(Command::Status, c.clone()))
        .unwrap();
    Vrf.gc(&test_request(Command::Gc, c)).unwrap();
}

#[test]
fn the_first_free_table_is_the_lowest_unused_from_1() {
    assert_eq!(first_free(&[]), 1);
    assert_eq!(first_free(&[1, 2, 4]), 3);
    assert_eq!(first_free(&[2]), 1);
}

#[test]
fn only_global_ipv6_addresses_are_restored() {
    let net = |s: &str| s.parse::<IpNet>().unwrap();
    assert!(is_global_v6(&net("2001:db8::5/64")));
    assert!(is_global_v6(&net("fd00::5/64")));
    assert!(!is_global_v6(&net("fe80::1/64")));
    assert!(!is_global_v6(&net("10.0.0.5/24")));
}
