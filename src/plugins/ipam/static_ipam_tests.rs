use super::*;
use crate::cni::args::CniArgs;
use crate::cni::{gojson, Command};
use crate::plugins::firewall_backend::test_request;
use serde_json::json;

/// A request of `command` for `conf` (a whole network configuration) with `cni_args`.
fn request(command: Command, conf: Value, cni_args: &str) -> Request {
    let mut r = test_request(command, conf);
    r.env.args = cni_args.to_string();
    r.args = CniArgs::parse(cni_args).expect("CNI_ARGS");
    r
}

/// A 1.0.0 configuration with `ipam` (type static added) and the `extra` top-level keys.
fn conf_with(version: &str, ipam: Value, extra: Value) -> Value {
    let mut ipam = ipam;
    ipam["type"] = json!("static");
    let mut c = json!({"cniVersion": version, "name": "n", "type": "macvlan", "ipam": ipam});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn add(conf: Value, cni_args: &str) -> Result<Value, Error> {
    let req = request(Command::Add, conf, cni_args);
    Static.add(&req).map(|r| r.to_value(req.conf.version))
}

/// `(address, gateway)` of each IP of an ADD's result, `-` for no gateway.
fn ips(conf: Value, cni_args: &str) -> Vec<(String, String)> {
    let r = add(conf, cni_args).unwrap();
    r["ips"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|ip| {
            let s = |k: &str| ip[k].as_str().unwrap_or("-").to_string();
            (s("address"), s("gateway"))
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, g)| (a.to_string(), g.to_string()))
        .collect()
}

const CONFIGURED: &str = r#"{"addresses": [
    {"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
    {"address": "3ffe:ffff:0:01ff::1/64", "gateway": "3ffe:ffff:0::1"}]}"#;

fn configured() -> Value {
    serde_json::from_str(CONFIGURED).unwrap()
}

#[test]
fn configured_addresses_routes_and_dns_are_the_result() {
    // Passed through as configured, every field kept.
    let v4_route = json!({"dst": "0.0.0.0/0", "gw": "10.10.0.254", "mtu": 1400, "advmss": 1360,
                          "priority": 100, "table": 100, "scope": 0});
    let dns = json!({"nameservers": ["8.8.8.8"], "domain": "example.com",
                     "search": ["example.com"], "options": ["ndots:2"]});
    let ipam = json!({
        "addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
                      {"address": "3ffe:ffff:0:01ff::1/64"}],
        "routes": [v4_route, {"dst": "3ffe:ffff:0:01ff::1/64", "gw": "3ffe:ffff:0::1"}],
        "dns": dns,
    });
    let r = add(conf_with("1.1.0", ipam, json!({})), "").unwrap();
    // IPv6 addresses come back in their canonical form.
    assert_eq!(
        r,
        json!({
            "cniVersion": "1.1.0",
            "ips": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
                    {"address": "3ffe:ffff:0:1ff::1/64"}],
            "routes": [v4_route, {"dst": "3ffe:ffff:0:1ff::1/64", "gw": "3ffe:ffff::1"}],
            "dns": dns,
        })
    );
}

#[test]
fn cni_args_ips_are_appended_and_gateway_reaches_only_them() {
    let conf = conf_with("1.0.0", configured(), json!({}));
    // The configured v4 address is in GATEWAY's subnet, but keeps its own gateway.
    let got = ips(
        conf.clone(),
        "IP=10.10.0.5/24, 11.0.0.1/8;GATEWAY=10.10.0.9,11.1.1.1",
    );
    assert_eq!(
        got,
        pairs(&[
            ("10.10.0.1/24", "10.10.0.254"),
            ("3ffe:ffff:0:1ff::1/64", "3ffe:ffff::1"),
            ("10.10.0.5/24", "10.10.0.9"),
            ("11.0.0.1/8", "11.1.1.1"),
        ])
    );
    // A later gateway in the same subnet wins; one in no subnet sets nothing.
    let bare = conf_with("1.0.0", json!({}), json!({}));
    let got = ips(
        bare,
        "IP=10.10.0.5/24,10.20.0.5/24;GATEWAY=10.10.0.1,10.10.0.2,192.0.2.1",
    );
    assert_eq!(
        got,
        pairs(&[("10.10.0.5/24", "10.10.0.2"), ("10.20.0.5/24", "-")])
    );
    // Empty values are no values (LoadArgs leaves the field unset).
    assert_eq!(ips(conf, "IP=;GATEWAY=").len(), 2);
}

#[test]
fn args_cni_ips_replace_config_and_cni_args_and_runtime_config_ips_replace_all() {
    let args = json!({"args": {"cni": {"ips": ["10.10.0.2/24", "3ffe:ffff:0:01ff::2/64"]}}});
    let runtime = json!({"runtimeConfig": {"ips": ["10.10.0.3/24"]}});
    let env = "IP=10.10.0.4/24;GATEWAY=10.10.0.254";
    let just_args = conf_with("1.0.0", configured(), args.clone());
    assert_eq!(
        ips(just_args, env),
        pairs(&[("10.10.0.2/24", "-"), ("3ffe:ffff:0:1ff::2/64", "-")])
    );
    let mut both = conf_with("1.0.0", configured(), args);
    both["runtimeConfig"] = runtime["runtimeConfig"].clone();
    assert_eq!(ips(both, env), pairs(&[("10.10.0.3/24", "-")]));
    // Empty lists replace nothing.
    let empty = conf_with(
        "1.0.0",
        configured(),
        json!({"args": {"cni": {"ips": []}}, "runtimeConfig": {"ips": []}}),
    );
    assert_eq!(ips(empty, env).len(), 3);
    // Go-spelled keys, as go-cni and the reference's own tests send them. (Not "Address":
    // in Go that is the name of another field of the reference's struct, and an error.)
    let go = conf_with(
        "1.0.0",
        json!({"Addresses": [{"ADDRESS": "10.9.0.1/24", "Gateway": "10.9.0.254"}]}),
        json!({}),
    );
    assert_eq!(ips(go, ""), pairs(&[("10.9.0.1/24", "10.9.0.254")]));
    let go = conf_with(
        "1.0.0",
        configured(),
        json!({"RuntimeConfig": {"IPs": ["10.10.0.7/24"]}}),
    );
    assert_eq!(ips(go, ""), pairs(&[("10.10.0.7/24", "-")]));
}

#[test]
fn an_address_without_a_prefix_is_refused_from_every_source() {
    let cases = [
        (
            conf_with(
                "1.0.0",
                json!({"addresses": [{"address": "10.10.0.1"}]}),
                json!({}),
            ),
            "",
            "ipam.addresses[0].address",
        ),
        (
            conf_with("1.0.0", json!({}), json!({})),
            "IP=10.10.0.1",
            "CNI_ARGS IP",
        ),
        (
            conf_with(
                "1.0.0",
                json!({}),
                json!({"args": {"cni": {"ips": ["10.10.0.1"]}}}),
            ),
            "",
            "args.cni.ips",
        ),
        (
            conf_with(
                "1.0.0",
                json!({}),
                json!({"runtimeConfig": {"ips": ["10.10.0.1"]}}),
            ),
            "",
            "runtimeConfig.ips",
        ),
        (
            conf_with("1.0.0", json!({}), json!({})),
            "IP=10.10.0.1/24,",
            "CNI_ARGS IP",
        ),
        (
            conf_with("1.0.0", json!({}), json!({})),
            "IP=10.10.0.1/24;GATEWAY=nope",
            "CNI_ARGS GATEWAY",
        ),
        (
            conf_with(
                "1.0.0",
                json!({"addresses": [{"address": "10.10.0.1/24", "gateway": "x"}]}),
                json!({}),
            ),
            "",
            "ipam.addresses[0].gateway",
        ),
    ];
    for (conf, env, needle) in cases {
        let e = add(conf.clone(), env).unwrap_err();
        assert_eq!(e.code, 7, "{conf} {env}: {e:?}");
        assert!(e.msg.contains(needle), "{needle}: {}", e.msg);
    }
}

#[test]
fn sources_are_checked_in_the_references_order() {
    // A bad configured address is never parsed once something replaces it.
    let replaced = conf_with(
        "1.0.0",
        json!({"addresses": [{"address": "bad"}]}),
        json!({"runtimeConfig": {"ips": ["10.10.0.3/24"]}}),
    );
    assert_eq!(ips(replaced, ""), pairs(&[("10.10.0.3/24", "-")]));
    // A bad args.cni.ips entry is an error even though runtimeConfig.ips wins.
    let shadowed = conf_with(
        "1.0.0",
        json!({}),
        json!({"args": {"cni": {"ips": ["bad"]}}, "runtimeConfig": {"ips": ["10.10.0.3/24"]}}),
    );
    assert!(add(shadowed, "").unwrap_err().msg.contains("args.cni.ips"));
    // So is a bad CNI_ARGS IP.
    let conf = conf_with(
        "1.0.0",
        json!({}),
        json!({"runtimeConfig": {"ips": ["10.10.0.3/24"]}}),
    );
    assert!(add(conf, "IP=bad").unwrap_err().msg.contains("CNI_ARGS IP"));
}

#[test]
fn versions_before_0_3_0_take_one_address_per_family() {
    let two_v4 = json!({"addresses": [{"address": "10.10.0.1/24"}, {"address": "10.10.1.1/24"}]});
    for version in ["0.1.0", "0.2.0"] {
        let e = add(conf_with(version, two_v4.clone(), json!({})), "").unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("one address per family"), "{}", e.msg);
        let e = add(
            conf_with(version, json!({}), json!({})),
            "IP=10.1.0.1/24,10.2.0.1/24",
        );
        assert!(e.is_err());
        // One of each family is a legacy result with both blocks.
        let r = add(conf_with(version, configured(), json!({})), "").unwrap();
        assert_eq!(r["ip4"]["ip"], "10.10.0.1/24");
        assert_eq!(r["ip6"]["gateway"], "3ffe:ffff::1");
        // No address at all cannot be a legacy result.
        let e = add(conf_with(version, json!({}), json!({})), "").unwrap_err();
        assert_eq!(e.code, 7);
    }
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let r = add(conf_with(version, two_v4.clone(), json!({})), "").unwrap();
        assert_eq!(r["ips"].as_array().unwrap().len(), 2, "{version}");
        let tagged = version.starts_with("0.");
        assert_eq!(r["ips"][0].get("version").is_some(), tagged, "{version}");
        // No address at all is a result with none.
        let r = add(conf_with(version, json!({}), json!({})), "").unwrap();
        assert_eq!(r, json!({"cniVersion": version, "dns": {}}));
    }
}

#[test]
fn a_missing_ipam_section_is_an_error() {
    // No key, and `null`, which Go reads as no key.
    for ipam in [None, Some(Value::Null)] {
        let mut c = json!({"cniVersion": "1.0.0", "name": "n", "type": "static"});
        if let Some(ipam) = ipam {
            c["ipam"] = ipam;
        }
        let e = add(c, "").unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("ipam"), "{}", e.msg);
    }
}

#[test]
fn cidrs_and_addresses_as_go_parses_them() {
    let ok = |s: &str| parse_cidr(s).map(|n| n.to_string());
    assert_eq!(ok("10.10.0.1/24").as_deref(), Some("10.10.0.1/24"));
    assert_eq!(ok("10.10.0.1/024").as_deref(), Some("10.10.0.1/24"));
    assert_eq!(ok("::ffff:10.10.0.1/120").as_deref(), Some("10.10.0.1/24"));
    assert_eq!(ok("fd00::1/64").as_deref(), Some("fd00::1/64"));
    for bad in [
        "10.10.0.1",
        "10.10.0.1/",
        "10.10.0.1/33",
        "10.10.0.1/+24",
        "010.10.0.1/24",
        "fe80::1%eth0/64",
        "fd00::1/129",
        " 10.10.0.1/24",
    ] {
        assert_eq!(ok(bad), None, "{bad}");
    }
    assert_eq!(
        parse_ip("::ffff:10.0.0.1"),
        Some("10.0.0.1".parse().unwrap())
    );
    assert_eq!(parse_ip("010.0.0.1"), None);
}

#[test]
fn check_wants_every_address_in_prev_result_with_its_gateway() {
    let conf = conf_with("1.0.0", configured(), json!({}));
    let check = |prev: Option<Value>, env: &str| {
        let mut c = conf.clone();
        if let Some(p) = prev {
            c["prevResult"] = p;
        }
        Static.check(&request(Command::Check, c, env))
    };
    let full = json!({"cniVersion": "1.0.0", "ips": [
        {"address": "10.10.0.1/24", "gateway": "10.10.0.254", "interface": 0},
        {"address": "3ffe:ffff:0:1ff::1/64", "gateway": "3ffe:ffff::1", "interface": 0}]});
    check(Some(full.clone()), "").unwrap();
    assert_eq!(check(None, "").unwrap_err().code, 7);
    let mut wrong_gw = full.clone();
    wrong_gw["ips"][0]["gateway"] = json!("10.10.0.2");
    let e = check(Some(wrong_gw), "").unwrap_err();
    assert!(e.msg.contains("gateway"), "{}", e.msg);
    let mut missing = full.clone();
    missing["ips"].as_array_mut().unwrap().remove(1);
    assert!(check(Some(missing), "").is_err());
    // An address from CNI_ARGS is configured too.
    assert!(check(Some(full.clone()), "IP=10.10.0.9/24").is_err());
    // A configured address without a gateway matches any.
    let no_gw = conf_with(
        "1.0.0",
        json!({"addresses": [{"address": "10.10.0.1/24"}]}),
        json!({"prevResult": full}),
    );
    Static.check(&request(Command::Check, no_gw, "")).unwrap();
}

#[test]
fn del_status_and_gc_always_succeed() {
    let broken = conf_with(
        "1.1.0",
        json!({"addresses": "nope", "routes": 5}),
        json!({"runtimeConfig": {"ips": 3}}),
    );
    assert!(add(broken.clone(), "").is_err());
    let req = request(Command::Del, broken, "");
    Static.del(&req).unwrap();
    Static.status(&req).unwrap();
    Static.gc(&req).unwrap();
}

#[test]
fn static_keys_get_go_matching() {
    use gojson::{assert_known, struct_fields};
    assert_known(&[
        struct_fields::<Dns>(),
        &[
            "addresses",
            "address",
            "gateway",
            "routes",
            "dns",
            "args",
            "cni",
            "ips",
            "runtimeConfig",
        ],
    ]);
}
