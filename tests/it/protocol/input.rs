//! The configuration on stdin: decoding, version rules, and invalid values
//! of known keys.

use super::*;

/// Proves: malformed, truncated and empty stdin is code 6 (decoding failure).
#[test]
fn malformed_json_is_code_6() {
    let (env, ns) = TestEnv::with_netns("malformed_json_is_code_6");
    let valid = serde_json::to_string(&bridge_conf(&env, "1.0.0")).unwrap();
    let mut inputs: Vec<String> = vec![
        "".into(),
        "{".into(),
        "{\"cniVersion\":".into(),
        "{\"cniVersion\": \"1.0.0\",}".into(),
        "{'cniVersion': '1.0.0'}".into(),
        "{\"a\":1}}".into(),
        "{\"a\":1} {\"b\":2}".into(),
        "nul".into(),
        "{\"name\": \"x\" \"type\": \"bridge\"}".into(),
    ];
    for cut in [1, 10, valid.len() / 2, valid.len() - 1] {
        inputs.push(valid[..cut].to_string());
    }
    for verb in ["ADD", "DEL", "CHECK"] {
        for input in &inputs {
            full_env(&env, "bridge", verb, &ns)
                .stdin(input.as_bytes())
                .run()
                .expect_err(6, &[]);
        }
    }
}

/// Proves: JSON that is not an object is code 6.
#[test]
fn non_object_json_is_code_6() {
    let (env, ns) = TestEnv::with_netns("non_object_json_is_code_6");
    for input in [
        "[]",
        "[{\"cniVersion\":\"1.0.0\"}]",
        "3",
        "\"bridge\"",
        "null",
        "true",
    ] {
        full_env(&env, "bridge", "ADD", &ns)
            .stdin(input)
            .run()
            .expect_err(6, &["object"]);
    }
}

/// Proves: an unknown cniVersion is code 1 naming the version (and the
/// supported ones); ADD, DEL and CHECK alike.
#[test]
fn unknown_cni_version_is_code_1() {
    let (env, ns) = TestEnv::with_netns("unknown_cni_version_is_code_1");
    for v in ["9.9.9", "1.2.0", "0.5.0", "v1.0.0", "1.0", "1.0.0-rc1"] {
        for verb in ["ADD", "DEL", "CHECK"] {
            let e = full_env(&env, "bridge", verb, &ns)
                .conf(&bridge_conf(&env, v))
                .run()
                .expect_err(1, &[v]);
            assert!(
                e.msg.contains("1.1.0"),
                "the message should list the supported versions: {}",
                e.msg
            );
        }
    }
}

/// Proves: CHECK with a version before 0.4.0 is code 1.
#[test]
fn check_needs_0_4_0() {
    let (env, ns) = TestEnv::with_netns("check_needs_0_4_0");
    for v in ["0.1.0", "0.2.0", "0.3.0", "0.3.1"] {
        let mut conf = bridge_conf(&env, v);
        conf["prevResult"] = json!({"cniVersion": v});
        full_env(&env, "bridge", "CHECK", &ns)
            .conf(&conf)
            .run()
            .expect_err(1, &["CHECK", v]);
    }
}

/// Proves: STATUS and GC need 1.1.0 (code 1 with 1.0.0 and older); with 1.1.0 they work.
#[test]
fn status_and_gc_need_1_1_0() {
    let env = TestEnv::new("status_and_gc_need_1_1_0");
    for name in ["bridge", "macvlan", "ipamd"] {
        for verb in ["STATUS", "GC"] {
            for v in ["1.0.0", "0.4.0"] {
                let mut conf = bridge_conf(&env, v);
                conf["type"] = json!(name);
                env.plugin(name)
                    .command(verb)
                    .conf(&conf)
                    .run()
                    .expect_err(1, &[verb, v]);
            }
        }
    }
    let conf = bridge_conf(&env, "1.1.0");
    env.plugin("bridge")
        .command("STATUS")
        .conf(&conf)
        .run()
        .ok_silent();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    env.plugin("bridge")
        .command("GC")
        .conf(&gc)
        .run()
        .ok_silent();
}

/// ADD of `conf` by `plugin` (its `type` set so) fails with 7 naming every needle.
fn assert_invalid(env: &TestEnv, ns: &Netns, plugin: &str, conf: &Value, needles: &[&str]) {
    let conf = merged(conf.clone(), json!({"type": plugin}));
    full_env(env, plugin, "ADD", ns)
        .conf(&conf)
        .run()
        .expect_err(7, needles);
}

/// Proves: bad values of known keys are code 7 with a message naming the key
/// and the value; mutually exclusive keys are named both.
#[test]
fn bad_field_values_are_code_7() {
    let (env, ns) = TestEnv::with_netns("bad_field_values_are_code_7");
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        ("bridge", json!({"mtu": "big"}), vec!["mtu", "big"]),
        ("bridge", json!({"mtu": -5}), vec!["mtu", "-5"]),
        (
            "bridge",
            json!({"isGateway": "yes"}),
            vec!["isGateway", "yes"],
        ),
        (
            "bridge",
            json!({"hairpinMode": true, "promiscMode": true}),
            vec!["hairpinMode", "promiscMode"],
        ),
        ("bridge", json!({"vlan": 5000}), vec!["vlan", "5000"]),
        ("bridge", json!({"vlan": "ten"}), vec!["vlan", "ten"]),
        (
            "bridge",
            json!({"bridge": "a-bridge-name-too-long"}),
            vec!["bridge", "a-bridge-name-too-long"],
        ),
        ("bridge", json!({"bridge": "br/0"}), vec!["bridge", "br/0"]),
        (
            "bridge",
            json!({"vlanTrunk": [{"minID": 10, "maxID": 5}]}),
            vec!["vlanTrunk"],
        ),
        (
            "bridge",
            json!({"runtimeConfig": {"mac": "zz:zz"}}),
            vec!["mac", "zz:zz"],
        ),
        ("bridge", json!({"name": "../etc"}), vec!["name", "../etc"]),
        ("bridge", json!({"ipam": "host-local"}), vec!["ipam"]),
        (
            "bridge",
            json!({"ipam": {"subnet": "10.0.0.0/24"}}),
            vec!["ipam.type"],
        ),
        ("macvlan", json!({"mode": "weird"}), vec!["mode", "weird"]),
        ("macvlan", json!({"mtu": "big"}), vec!["mtu", "big"]),
        // Out of the kernel's range: refused before any link is made.
        ("bridge", json!({"mtu": 10}), vec!["mtu", "10", "68"]),
        (
            "macvlan",
            json!({"mtu": 70000}),
            vec!["mtu", "70000", "65535"],
        ),
        (
            "ipvlan",
            json!({"mtu": 67, "ipam": {"type": "ipamd"}}),
            vec!["mtu", "67"],
        ),
        (
            "macvlan",
            json!({"mac": "not-a-mac"}),
            vec!["mac", "not-a-mac"],
        ),
        (
            "ipvlan",
            json!({"mode": "l9", "ipam": {"type": "ipamd"}}),
            vec!["mode", "l9"],
        ),
    ];
    for (plugin, extra, needles) in cases {
        let conf = merged(bridge_conf(&env, "1.0.0"), extra);
        assert_invalid(&env, &ns, plugin, &conf, &needles);
    }
    // Nothing was attached by any of these.
    assert_only_lo(&ns, "a failed ADD left links in the netns");
}

/// Proves: bad values in the IPAM section reach the user as code 7 naming the
/// key and value (our ipamd, called directly and through bridge).
#[test]
fn bad_ipam_values_are_code_7() {
    let (env, ns) = TestEnv::with_netns("bad_ipam_values_are_code_7");
    let data = env.dir("ipamd");
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (
            json!({"ranges": [[{"subnet": "10.0.0.0/33"}]]}),
            vec!["subnet", "10.0.0.0/33"],
        ),
        (
            json!({"ranges": [[{"subnet": "nonsense"}]]}),
            vec!["subnet", "nonsense"],
        ),
        (json!({"ranges": "10.0.0.0/24"}), vec!["ranges"]),
        (
            json!({"ranges": [[{"subnet": "10.9.0.0/24", "rangeStart": "10.8.0.5"}]]}),
            vec!["rangeStart", "10.8.0.5"],
        ),
        (
            json!({"ranges": [[{"subnet": "10.9.0.0/24"}]], "routes": [{"dst": "default"}]}),
            vec!["dst", "default"],
        ),
    ];
    for (ipam_extra, needles) in cases {
        let ipam = merged(
            json!({"type": "ipamd", "dataDir": data, "socket": data.join("none.sock")}),
            ipam_extra,
        );
        let mut conf = bridge_conf(&env, "1.0.0");
        conf["ipam"] = ipam;
        for plugin in ["ipamd", "bridge"] {
            assert_invalid(&env, &ns, plugin, &conf, &needles);
        }
        assert_only_lo(&ns, "a failed ADD left links in the netns");
    }
}

/// Proves: an error about a configuration is labelled with the version the
/// configuration declares, including errors found while decoding it.
#[test]
fn config_errors_carry_the_declared_version() {
    let (env, ns) = TestEnv::with_netns("config_errors_carry_the_declared_version");
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        // One error of the plugin's own keys, one of the common ones (found
        // while the configuration itself is decoded).
        for (key, value) in [("mtu", json!("big")), ("ipam", json!(5))] {
            let mut conf = bridge_conf(&env, version);
            conf[key] = value.clone();
            let e = full_env(&env, "bridge", "ADD", &ns)
                .conf(&conf)
                .run()
                .expect_err(7, &[key, &value.to_string().replace('"', "")]);
            assert_eq!(e.cni_version, version, "{e:?}");
        }
    }
}

/// Proves: `"ipam": {}` means no IPAM, as with the reference bridge and
/// macvlan: ADD attaches at L2 with no addresses, and CHECK and DEL agree.
#[test]
fn an_empty_ipam_section_means_l2_only() {
    let (env, ns) = TestEnv::with_netns("an_empty_ipam_section_means_l2_only");
    let mut conf = bridge_conf(&env, "1.0.0");
    conf["ipam"] = json!({});
    let att = env.attachment("bridge", "ctr-proto", &ns, &conf);
    let r = att.add();
    assert!(r["ips"].as_array().is_none_or(Vec::is_empty), "{r}");
    assert!(
        r["interfaces"].as_array().is_some_and(|i| !i.is_empty()),
        "{r}"
    );
    att.check(&r);
    att.del_twice();
}

/// Proves: the configuration's `dns` is reported in the result when IPAM
/// returns none (Podman writes it into the container's resolv.conf), in the
/// layouts that have `dns`; an L2-only attachment reports it too.
#[test]
fn the_configured_dns_is_reported() {
    let (env, ns) = TestEnv::with_netns("the_configured_dns_is_reported");
    let dns = json!({"nameservers": ["10.9.9.9"], "domain": "pods.example", "search": ["example"]});
    for (i, with_ipam) in [true, false].into_iter().enumerate() {
        let mut conf = bridge_conf(&env, "1.0.0");
        conf["dns"] = dns.clone();
        if with_ipam {
            conf["ipam"] = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
        }
        let att = env.attachment("bridge", &format!("ctr-dns{i}"), &ns, &conf);
        let r = att.add();
        assert_eq!(r["dns"], dns, "{r}");
        att.del();
    }
}

/// Proves: when the IPAM plugin's ADD fails, bridge and macvlan call its DEL
/// (so an IPAM that allocated part of the request can let go), report the
/// IPAM's error, and leave no link behind.
#[test]
fn a_failed_ipam_add_is_followed_by_ipam_del() {
    let (env, ns) = TestEnv::with_netns("a_failed_ipam_add_is_followed_by_ipam_del");
    let fake = env.dir("fake-ipam");
    let log = fake.join("log");
    failing_plugin(&fake, "ipamfail", &log);
    let (master, _) = env.veth_pair();
    let path = std::env::join_paths([fake.as_path(), env.bin_dir()]).expect("CNI_PATH");
    for plugin in ["bridge", "macvlan"] {
        let mut conf = merged(
            bridge_conf(&env, "1.0.0"),
            json!({"type": plugin, "master": master}),
        );
        conf["ipam"] = json!({"type": "ipamfail"});
        full_env(&env, plugin, "ADD", &ns)
            .env("CNI_PATH", &path.to_string_lossy())
            .conf(&conf)
            .run()
            .expect_err(11, &["ipamfail refuses"]);
        let calls = std::fs::read_to_string(&log).expect("log");
        assert_eq!(calls, "ADD\nDEL\n", "{plugin}");
        std::fs::remove_file(&log).expect("reset log");
        assert_only_lo(&ns, plugin);
    }
}

/// Proves: a config without cniVersion is treated as 0.2.0: ADD prints the
/// 0.2.0 layout (ip4/ip6, no interfaces/ips) and errors say 0.2.0.
#[test]
fn missing_cni_version_means_0_2_0() {
    let (env, ns) = TestEnv::with_netns("missing_cni_version_means_0_2_0");
    let nets = env.subnets();
    let mut conf = bridge_conf(&env, "x");
    conf.as_object_mut().unwrap().remove("cniVersion");
    conf["isGateway"] = json!(true);
    conf["ipam"] = env.ipam(Ipam::Ipamd, nets.dual_ranges());

    let e = env
        .plugin("bridge")
        .command("ADD")
        .conf(&conf)
        .run()
        .expect_err(4, &[]);
    assert_eq!(
        e.cni_version, "0.2.0",
        "error of a version-less config labelled 0.2.0"
    );

    let att = env.attachment("bridge", "ctr-proto", &ns, &conf);
    let r = att.add();
    assert_eq!(r["cniVersion"], "0.2.0", "{r}");
    assert!(
        r.get("interfaces").is_none() && r.get("ips").is_none(),
        "0.2.0 has no interfaces/ips: {r}"
    );
    let v4_prefix = nets.v4.trim_end_matches("0/24");
    assert!(
        r["ip4"]["ip"].as_str().unwrap_or("").starts_with(v4_prefix),
        "{r}"
    );
    assert_eq!(r["ip4"]["gateway"], nets.v4_addr(1), "{r}");
    assert!(r["ip6"]["ip"].is_string(), "{r}");
    att.del();
}
