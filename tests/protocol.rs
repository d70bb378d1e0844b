//! The CNI protocol edge: environment validation, stdin decoding, version
//! rules, field validation, CNI_ARGS — and fuzz-like runs proving that no
//! input makes a plugin panic, die by a signal, or fail without a proper
//! error object.

mod common;

use common::*;
use serde_json::{json, Value};
use std::os::unix::ffi::OsStringExt;

/// A valid bridge config (L2 only, no IPAM) on a bridge the test owns.
fn bridge_conf(env: &TestEnv, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "proto",
        "type": "bridge",
        "bridge": env.link_name("pbr"),
    })
}

/// A netns path that does not exist: ADD/CHECK on it can never succeed, so
/// fuzzed configs cannot accidentally configure anything.
fn missing_netns() -> String {
    format!("/run/netns/cnikit-missing-{}", short_hash())
}

/// Full valid environment for `verb`.
fn full_env(call: Call, verb: &str, ns: &Netns) -> Call {
    call.command(verb)
        .container("ctr-proto")
        .netns(ns)
        .ifname("eth0")
}

/// Proves: for ADD, CHECK, DEL and GC every variable the spec requires is
/// checked; a missing one gives code 4 naming it, labelled with the config's version.
#[test]
fn each_required_env_var_missing_per_verb() {
    let env = TestEnv::new("each_required_env_var_missing_per_verb");
    let ns = env.netns();
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "ADD",
            "1.0.0",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
        ),
        (
            "CHECK",
            "1.0.0",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
        ),
        ("DEL", "1.0.0", &["CNI_CONTAINERID", "CNI_IFNAME"]),
        ("GC", "1.1.0", &["CNI_PATH"]),
    ];
    for (verb, version, required) in cases {
        let mut conf = bridge_conf(&env, version);
        if verb == "CHECK" {
            conf["prevResult"] = json!({"cniVersion": version, "interfaces": [], "ips": []});
        }
        for var in required {
            let e = full_env(env.plugin("bridge"), verb, &ns)
                .unset(var)
                .conf(&conf)
                .run()
                .expect_err(4, &[var]);
            assert_eq!(
                e.cni_version, version,
                "error labelled with the config's version"
            );
            // An empty value counts as missing too.
            full_env(env.plugin("bridge"), verb, &ns)
                .env(var, "")
                .conf(&conf)
                .run()
                .expect_err(4, &[var]);
        }
        // All missing at once: every culprit is named in one message.
        let mut call = env.plugin("bridge").command(verb).conf(&conf);
        for var in required {
            call = call.unset(var);
        }
        call.run().expect_err(4, required);
    }
}

/// Proves: DEL does not need CNI_NETNS, VERSION and STATUS need nothing but
/// CNI_COMMAND (the optional variables really are optional).
#[test]
fn optional_env_vars_are_optional() {
    let env = TestEnv::new("optional_env_vars_are_optional");
    env.plugin("bridge")
        .command("DEL")
        .container("ctr-opt")
        .ifname("eth0")
        .conf(&bridge_conf(&env, "1.0.0"))
        .run()
        .ok_silent();
    env.plugin("bridge")
        .command("STATUS")
        .unset("CNI_PATH")
        .conf(&bridge_conf(&env, "1.1.0"))
        .run()
        .ok_silent();
    env.plugin("bridge")
        .command("VERSION")
        .unset("CNI_PATH")
        .run()
        .ok();
}

/// Proves: an invalid CNI_CONTAINERID (charset of the spec) is code 4 naming the variable.
#[test]
fn invalid_container_id() {
    let env = TestEnv::new("invalid_container_id");
    let ns = env.netns();
    for bad in [
        "-abc", "_abc", ".abc", "a/b", "a b", "a:b", "a;b", "ctr\n", "é", "a\u{0}b",
    ] {
        if bad.contains('\0') {
            continue; // cannot be put in an environment
        }
        for verb in ["ADD", "DEL"] {
            full_env(env.plugin("bridge"), verb, &ns)
                .container(bad)
                .conf(&bridge_conf(&env, "1.0.0"))
                .run()
                .expect_err(4, &["CNI_CONTAINERID"]);
        }
    }
}

/// Proves: CNI_IFNAME must be non-empty, not . or .., < 16 bytes, without
/// '/', ':' or whitespace (code 4 naming it); 15 bytes is accepted.
#[test]
fn invalid_ifname() {
    let env = TestEnv::new("invalid_ifname");
    let ns = env.netns();
    for bad in [
        ".",
        "..",
        "0123456789abcdef",
        "eth0/1",
        "eth0:1",
        "eth 0",
        "eth\t0",
        "eth0\n",
        "ééééééééé",
    ] {
        for verb in ["ADD", "CHECK", "DEL"] {
            let mut conf = bridge_conf(&env, "1.0.0");
            conf["prevResult"] = json!({"cniVersion": "1.0.0"});
            full_env(env.plugin("bridge"), verb, &ns)
                .ifname(bad)
                .conf(&conf)
                .run()
                .expect_err(4, &["CNI_IFNAME"]);
        }
    }
    // Exactly 15 bytes works end to end (L2 bridge attachment).
    let conf = bridge_conf(&env, "1.0.0");
    let r = full_env(env.plugin("bridge"), "ADD", &ns)
        .ifname("abcdefghijklmno")
        .conf(&conf)
        .run()
        .result();
    assert_eq!(r["interfaces"][2]["name"], "abcdefghijklmno", "{r}");
    assert!(link(Some(&ns.name), "abcdefghijklmno").is_some());
    full_env(env.plugin("bridge"), "DEL", &ns)
        .ifname("abcdefghijklmno")
        .conf(&conf)
        .run()
        .ok_silent();
}

/// Proves: a non-UTF-8 environment value is a clean code 4, not a crash.
#[test]
fn non_utf8_env_values() {
    let env = TestEnv::new("non_utf8_env_values");
    let ns = env.netns();
    for var in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_ARGS"] {
        let o = full_env(env.plugin("bridge"), "ADD", &ns)
            .env_os(var, std::ffi::OsString::from_vec(b"bad\xff\xfe".to_vec()))
            .conf(&bridge_conf(&env, "1.0.0"))
            .run();
        let e = o.err();
        assert!(e.msg.contains(var) || e.code == 3, "{var}: {e:?}");
    }
}

/// Proves: an unknown CNI_COMMAND is code 4 naming the value.
#[test]
fn unknown_cni_command() {
    let env = TestEnv::new("unknown_cni_command");
    let ns = env.netns();
    for bad in ["PUT", "add", "ADD ", "DELETE", "version"] {
        full_env(env.plugin("bridge"), bad, &ns)
            .conf(&bridge_conf(&env, "1.0.0"))
            .run()
            .expect_err(4, &["CNI_COMMAND", bad.trim()]);
    }
}

/// Proves: malformed, truncated and empty stdin is code 6 (decoding failure).
#[test]
fn malformed_json_is_code_6() {
    let env = TestEnv::new("malformed_json_is_code_6");
    let ns = env.netns();
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
            full_env(env.plugin("bridge"), verb, &ns)
                .stdin(input.as_bytes())
                .run()
                .expect_err(6, &[]);
        }
    }
}

/// Proves: JSON that is not an object is code 6.
#[test]
fn non_object_json_is_code_6() {
    let env = TestEnv::new("non_object_json_is_code_6");
    let ns = env.netns();
    for input in [
        "[]",
        "[{\"cniVersion\":\"1.0.0\"}]",
        "3",
        "\"bridge\"",
        "null",
        "true",
    ] {
        full_env(env.plugin("bridge"), "ADD", &ns)
            .stdin(input)
            .run()
            .expect_err(6, &["object"]);
    }
}

/// Proves: an unknown cniVersion is code 1 naming the version (and the
/// supported ones); ADD, DEL and CHECK alike.
#[test]
fn unknown_cni_version_is_code_1() {
    let env = TestEnv::new("unknown_cni_version_is_code_1");
    let ns = env.netns();
    for v in ["9.9.9", "1.2.0", "0.5.0", "v1.0.0", "1.0", "1.0.0-rc1"] {
        for verb in ["ADD", "DEL", "CHECK"] {
            let e = full_env(env.plugin("bridge"), verb, &ns)
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
    let env = TestEnv::new("check_needs_0_4_0");
    let ns = env.netns();
    for v in ["0.1.0", "0.2.0", "0.3.0", "0.3.1"] {
        let mut conf = bridge_conf(&env, v);
        conf["prevResult"] = json!({"cniVersion": v});
        full_env(env.plugin("bridge"), "CHECK", &ns)
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

/// Proves: bad values of known keys are code 7 with a message naming the key
/// and the value; mutually exclusive keys are named both.
#[test]
fn bad_field_values_are_code_7() {
    let env = TestEnv::new("bad_field_values_are_code_7");
    let ns = env.netns();
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
        let mut conf = bridge_conf(&env, "1.0.0");
        conf["type"] = json!(plugin);
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        full_env(env.plugin(plugin), "ADD", &ns)
            .conf(&conf)
            .run()
            .expect_err(7, &needles);
    }
    // Nothing was attached by any of these.
    assert_eq!(
        link_names(Some(&ns.name)),
        ["lo".to_string()].into(),
        "a failed ADD left links in the netns"
    );
}

/// Proves: bad values in the IPAM section reach the user as code 7 naming the
/// key and value (our ipamd, called directly and through bridge).
#[test]
fn bad_ipam_values_are_code_7() {
    let env = TestEnv::new("bad_ipam_values_are_code_7");
    let ns = env.netns();
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
        let mut ipam = json!({"type": "ipamd", "dataDir": data, "socket": data.join("none.sock")});
        for (k, v) in ipam_extra.as_object().unwrap() {
            ipam[k] = v.clone();
        }
        let mut conf = bridge_conf(&env, "1.0.0");
        conf["type"] = json!("ipamd");
        conf["ipam"] = ipam;
        full_env(env.plugin("ipamd"), "ADD", &ns)
            .conf(&conf)
            .run()
            .expect_err(7, &needles);
        conf["type"] = json!("bridge");
        full_env(env.plugin("bridge"), "ADD", &ns)
            .conf(&conf)
            .run()
            .expect_err(7, &needles);
        assert_eq!(
            link_names(Some(&ns.name)),
            ["lo".to_string()].into(),
            "a failed ADD left links in the netns"
        );
    }
}

/// Proves: CNI_ARGS with an unknown key fails (code 4, key named) unless
/// IgnoreUnknown is set; a malformed pair fails too.
#[test]
fn cni_args_unknown_key() {
    let env = TestEnv::new("cni_args_unknown_key");
    let ns = env.netns();
    let conf = bridge_conf(&env, "1.0.0");
    full_env(env.plugin("bridge"), "ADD", &ns)
        .cni_args("K8S_POD_NAME=web-1")
        .conf(&conf)
        .run()
        .expect_err(4, &["K8S_POD_NAME"]);
    full_env(env.plugin("bridge"), "ADD", &ns)
        .cni_args("novalue")
        .conf(&conf)
        .run()
        .expect_err(4, &["novalue"]);
    assert_eq!(link_names(Some(&ns.name)), ["lo".to_string()].into());
    // With IgnoreUnknown the same call goes through.
    full_env(env.plugin("bridge"), "ADD", &ns)
        .cni_args("IgnoreUnknown=1;K8S_POD_NAME=web-1;K8S_POD_NAMESPACE=default")
        .conf(&conf)
        .run()
        .result();
    full_env(env.plugin("bridge"), "DEL", &ns)
        .cni_args("IgnoreUnknown=1;K8S_POD_NAME=web-1;K8S_POD_NAMESPACE=default")
        .conf(&conf)
        .run()
        .ok_silent();
}

/// Proves: a config without cniVersion is treated as 0.2.0: ADD prints the
/// 0.2.0 layout (ip4/ip6, no interfaces/ips) and errors say 0.2.0.
#[test]
fn missing_cni_version_means_0_2_0() {
    let env = TestEnv::new("missing_cni_version_means_0_2_0");
    let ns = env.netns();
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

    let r = full_env(env.plugin("bridge"), "ADD", &ns)
        .conf(&conf)
        .run()
        .result();
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
    full_env(env.plugin("bridge"), "DEL", &ns)
        .conf(&conf)
        .run()
        .ok_silent();
}

// ------------------------------------------------------------------ fuzz-like

/// Deterministic xorshift64* generator: the same inputs on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A rich valid config of `plugin` to mutate (ipamd state in the test dir).
fn rich_conf(env: &TestEnv, plugin: &str) -> Value {
    let data = env.dir("fuzz-ipamd");
    let mut c = json!({
        "cniVersion": "1.0.0",
        "name": "fuzz",
        "type": plugin,
        "ipam": {
            "type": "ipamd",
            "dataDir": data,
            "socket": data.join("none.sock"),
            "ranges": [[{"subnet": "10.250.0.0/24", "rangeStart": "10.250.0.10", "gateway": "10.250.0.1"}],
                       [{"subnet": "fd00:250::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00:250::1"}]
        },
        "runtimeConfig": {"mac": "0a:58:0a:fa:00:05", "ips": ["10.250.0.20"]},
        "args": {"cni": {"ips": ["10.250.0.21"]}},
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": "0a:58:0a:fa:00:05", "sandbox": "/run/netns/x"}],
            "ips": [{"address": "10.250.0.20/24", "gateway": "10.250.0.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.250.0.1"}],
            "dns": {"nameservers": ["10.250.0.1"], "search": ["example.com"]}
        },
        "dns": {"nameservers": ["1.1.1.1"]}
    });
    let extra = match plugin {
        "bridge" => json!({"bridge": "fuzzbr0", "isGateway": true, "isDefaultGateway": true,
                           "forceAddress": false, "ipMasq": true, "mtu": 1400, "hairpinMode": true,
                           "promiscMode": false, "vlan": 10, "vlanTrunk": [{"id": 20}, {"minID": 30, "maxID": 40}],
                           "preserveDefaultVlan": false, "enabledad": false, "macspoofchk": true,
                           "disableContainerInterface": false, "portIsolation": true}),
        "macvlan" => {
            json!({"master": "eth9", "mode": "bridge", "mtu": 1400, "mac": "0a:58:0a:fa:00:06",
                            "linkInContainer": false, "bcqueuelen": 100})
        }
        _ => json!({"master": "eth9", "mode": "l2", "mtu": 1400, "linkInContainer": false}),
    };
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// ADD on a netns that does not exist: whatever the config, the call must fail.
fn fuzz_add(env: &TestEnv, plugin: &str, stdin: Vec<u8>, nsp: &str) -> CniError {
    env.plugin(plugin)
        .command("ADD")
        .container("fuzz")
        .netns_path(nsp)
        .ifname("eth0")
        .stdin(stdin)
        .run()
        .err()
}

/// Proves: truncated and randomly mutated configs (a few hundred, seeded)
/// always end in exit 1 with one valid error object, never a signal/panic.
#[test]
fn fuzz_truncated_and_mutated_configs() {
    let env = TestEnv::new("fuzz_truncated_and_mutated_configs");
    let nsp = missing_netns();
    let mut rng = Rng(0x5eed_cafe_f00d_0001);
    let alphabet = b"{}[]\",:0123456789.-eE ntfrula\\/\x00\xff\xc3tx";
    let mut runs = 0;
    for plugin in ["bridge", "macvlan", "ipvlan"] {
        let base = serde_json::to_vec(&rich_conf(&env, plugin)).unwrap();
        // Every truncation point of a coarse grid, and the last 10 bytes one by one.
        let mut cuts: Vec<usize> = (0..base.len()).step_by(base.len() / 25 + 1).collect();
        cuts.extend(base.len() - 10..base.len());
        for cut in cuts {
            let e = fuzz_add(&env, plugin, base[..cut].to_vec(), &nsp);
            assert_eq!(e.code, 6, "a truncated config is a decode error: {e:?}");
            runs += 1;
        }
        // Random mutations: replace, insert or delete 1–4 bytes.
        for _ in 0..80 {
            let mut m = base.clone();
            for _ in 0..=rng.below(4) {
                let at = rng.below(m.len());
                match rng.below(3) {
                    0 => m[at] = *rng.pick(alphabet),
                    1 => m.insert(at, *rng.pick(alphabet)),
                    _ => {
                        m.remove(at);
                    }
                }
            }
            fuzz_add(&env, plugin, m, &nsp);
            runs += 1;
        }
    }
    // Mutated configs for the other verbs: only undecodable ones (a valid DEL
    // would legitimately succeed), must be code 6 everywhere.
    let base = serde_json::to_vec(&rich_conf(&env, "bridge")).unwrap();
    for verb in ["DEL", "CHECK", "STATUS", "GC"] {
        for _ in 0..10 {
            let cut = 1 + rng.below(base.len() - 2);
            let e = env
                .plugin("bridge")
                .command(verb)
                .container("fuzz")
                .netns_path(&nsp)
                .ifname("eth0")
                .stdin(base[..cut].to_vec())
                .run()
                .err();
            assert_eq!(e.code, 6, "{verb}: {e:?}");
            runs += 1;
        }
    }
    assert!(runs > 300, "only {runs} runs");
}

/// Proves: a wrong JSON type in every known key of every plugin's config is
/// code 7 naming the key (or, for keys a plugin does not decode, at least a
/// clean error) — never a panic.
#[test]
fn fuzz_wrong_types_in_every_known_key() {
    let env = TestEnv::new("fuzz_wrong_types_in_every_known_key");
    let nsp = missing_netns();
    let wrong: Vec<Value> = vec![
        json!(-1),
        json!(1.5),
        json!(4294967296u64),
        json!("str"),
        json!(true),
        json!([]),
        json!([1, "a", null]),
        json!({}),
        json!({"nested": {"deep": [1, 2, 3]}}),
    ];
    // key → JSON kind the plugin must insist on (None: not checked strictly).
    let typed: &[(&str, &[(&str, &str)])] = &[
        (
            "bridge",
            &[
                ("bridge", "string"),
                ("isGateway", "bool"),
                ("isDefaultGateway", "bool"),
                ("forceAddress", "bool"),
                ("ipMasq", "bool"),
                ("mtu", "u32"),
                ("hairpinMode", "bool"),
                ("promiscMode", "bool"),
                ("vlan", "u16"),
                ("vlanTrunk", "array"),
                ("preserveDefaultVlan", "bool"),
                ("enabledad", "bool"),
                ("macspoofchk", "bool"),
                ("disableContainerInterface", "bool"),
                ("portIsolation", "bool"),
            ],
        ),
        (
            "macvlan",
            &[
                ("master", "string"),
                ("mode", "string"),
                ("mtu", "u32"),
                ("mac", "string"),
                ("linkInContainer", "bool"),
                ("bcqueuelen", "u32"),
            ],
        ),
        (
            "ipvlan",
            &[
                ("master", "string"),
                ("mode", "string"),
                ("mtu", "u32"),
                ("linkInContainer", "bool"),
            ],
        ),
    ];
    let matches = |kind: &str, v: &Value| match kind {
        "string" => v.is_string(),
        "bool" => v.is_boolean(),
        "u32" => v.as_u64().is_some_and(|n| n <= u32::MAX as u64),
        "u16" => v.as_u64().is_some_and(|n| n <= u16::MAX as u64),
        "array" => v.is_array(),
        _ => true,
    };
    let common_keys = [
        "cniVersion",
        "name",
        "type",
        "ipam",
        "prevResult",
        "runtimeConfig",
        "args",
        "dns",
        "capabilities",
    ];
    let mut runs = 0;
    for (plugin, keys) in typed {
        let base = rich_conf(&env, plugin);
        for (key, kind) in keys.iter() {
            for v in &wrong {
                let mut c = base.clone();
                c[*key] = v.clone();
                let e = fuzz_add(&env, plugin, serde_json::to_vec(&c).unwrap(), &nsp);
                if !matches(kind, v) {
                    assert_eq!(e.code, 7, "{plugin} {key}={v}: {e:?}");
                    assert!(
                        e.msg.contains(key),
                        "{plugin} {key}={v}: message must name the key: {}",
                        e.msg
                    );
                }
                runs += 1;
            }
        }
        for key in common_keys {
            for v in &wrong {
                let mut c = base.clone();
                c[key] = v.clone();
                let e = fuzz_add(&env, plugin, serde_json::to_vec(&c).unwrap(), &nsp);
                if matches!(key, "cniVersion" | "name" | "type") && !v.is_string() {
                    assert_eq!(e.code, 7, "{plugin} {key}={v}: {e:?}");
                    assert!(e.msg.contains(key), "{plugin} {key}={v}: {}", e.msg);
                }
                runs += 1;
            }
        }
        // Wrong types one level down, in the IPAM section and the prevResult.
        for sub in ["ipam", "prevResult", "runtimeConfig"] {
            let inner: Vec<String> = base[sub].as_object().unwrap().keys().cloned().collect();
            for k in inner {
                for v in &wrong {
                    let mut c = base.clone();
                    c[sub][&k] = v.clone();
                    fuzz_add(&env, plugin, serde_json::to_vec(&c).unwrap(), &nsp);
                    runs += 1;
                }
            }
        }
    }
    // The ipamd plugin itself (no netns needed, so every wrong type must be 7).
    let base = rich_conf(&env, "ipamd");
    let ipam_keys = [
        "ranges",
        "routes",
        "dataDir",
        "socket",
        "resolvConf",
        "subnet",
        "rangeStart",
        "rangeEnd",
        "gateway",
    ];
    for key in ipam_keys {
        for v in &wrong {
            let mut c = base.clone();
            c.as_object_mut().unwrap().remove("prevResult");
            c["ipam"][key] = v.clone();
            if matches!(key, "rangeStart" | "rangeEnd" | "gateway") {
                // These only make sense next to `subnet`.
                c["ipam"]["subnet"] = json!("10.251.0.0/24");
            }
            if v.is_string() && matches!(key, "dataDir" | "socket" | "resolvConf") {
                continue; // a string path is a valid value
            }
            if *v == json!([]) && matches!(key, "ranges" | "routes") {
                continue; // an empty list has the right type
            }
            let e = env
                .plugin("ipamd")
                .command("ADD")
                .container("fuzz")
                .netns_path(&nsp)
                .ifname("eth0")
                .conf(&c)
                .run()
                .err();
            assert_eq!(e.code, 7, "ipam.{key}={v}: {e:?}");
            assert!(
                e.msg.contains(key),
                "ipam.{key}={v}: message must name the key: {}",
                e.msg
            );
            runs += 1;
        }
    }
    assert!(runs > 400, "only {runs} runs");
}

/// Proves: huge inputs (several MB of valid JSON, 17 MB over the limit,
/// 100 000-deep nesting, many keys) are handled with a clean error.
#[test]
fn fuzz_huge_and_deep_json() {
    let env = TestEnv::new("fuzz_huge_and_deep_json");
    let nsp = missing_netns();
    // 6 MB string value: valid JSON; the netns is missing so ADD fails with 3.
    let mut c =
        json!({"cniVersion": "1.0.0", "name": "fuzz", "type": "bridge", "bridge": "fuzzbr0"});
    c["x-blob"] = json!("a".repeat(6 << 20));
    let e = fuzz_add(&env, "bridge", serde_json::to_vec(&c).unwrap(), &nsp);
    assert_eq!(e.code, 3, "valid big config, missing netns: {e:?}");
    // 200 000 keys.
    let mut many = serde_json::Map::new();
    for i in 0..200_000 {
        many.insert(format!("k{i}"), json!(i));
    }
    let mut c = rich_conf(&env, "bridge");
    c["x-many"] = Value::Object(many);
    fuzz_add(&env, "bridge", serde_json::to_vec(&c).unwrap(), &nsp);
    // Over the stdin limit (17 MB).
    let mut big = b"{\"cniVersion\":\"1.0.0\",\"x\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'b', 17 << 20));
    big.extend(b"\"}");
    let e = fuzz_add(&env, "bridge", big, &nsp);
    assert!((5..=7).contains(&e.code), "{e:?}");
    // Deep nesting: must not overflow the stack.
    for depth in [1_000usize, 100_000] {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let mut s = String::from("{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"x\":");
            s += &open.repeat(depth);
            s += "1";
            s += &close.repeat(depth);
            s += "}";
            let e = fuzz_add(&env, "bridge", s.into_bytes(), &nsp);
            assert!(matches!(e.code, 3 | 6), "depth {depth}: {e:?}");
        }
    }
    // Deep nesting inside the prevResult of a CHECK.
    let mut s = String::from("{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"prevResult\":");
    s += &"[".repeat(50_000);
    s += &"]".repeat(50_000);
    s += "}";
    let e = env
        .plugin("bridge")
        .command("CHECK")
        .container("fuzz")
        .netns_path(&nsp)
        .ifname("eth0")
        .stdin(s)
        .run()
        .err();
    assert_eq!(e.code, 6, "{e:?}");
}

/// Proves: binary garbage on stdin (random bytes, invalid UTF-8 in strings,
/// NULs, a UTF-16 BOM) is code 6.
#[test]
fn fuzz_binary_garbage() {
    let env = TestEnv::new("fuzz_binary_garbage");
    let nsp = missing_netns();
    let mut rng = Rng(0xdead_beef_1234_5678);
    let mut inputs: Vec<Vec<u8>> = vec![
        b"\xff\xfe{\x00\"\x00".to_vec(),
        b"\xef\xbb\xbf{\"cniVersion\":\"1.0.0\"}".to_vec(),
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"\xff\xfe\"}".to_vec(),
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"a\\ud800\"}".to_vec(),
        b"\x00\x00\x00\x00".to_vec(),
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00".to_vec(),
    ];
    for _ in 0..60 {
        let len = 1 + rng.below(4096);
        inputs.push((0..len).map(|_| rng.next() as u8).collect());
    }
    for (i, input) in inputs.into_iter().enumerate() {
        let plugin = PLUGINS[i % 4]; // bridge, macvlan, ipvlan, portmap
        let e = fuzz_add(&env, plugin, input, &nsp);
        assert!(matches!(e.code, 6 | 7), "{plugin}: {e:?}");
    }
}

/// Proves: random CNI_IFNAME / CNI_CONTAINERID / CNI_ARGS / CNI_PATH values
/// never crash a plugin; invalid names are code 4.
#[test]
fn fuzz_env_values() {
    let env = TestEnv::new("fuzz_env_values");
    let nsp = missing_netns();
    let conf = rich_conf(&env, "bridge");
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let alphabet: Vec<char> = "aZ09_.-/: \t;=,é\u{7f}\u{202e}".chars().collect();
    for i in 0..120 {
        let len = rng.below(24);
        let s: String = (0..len).map(|_| *rng.pick(&alphabet)).collect();
        let var = ["CNI_IFNAME", "CNI_CONTAINERID", "CNI_ARGS", "CNI_PATH"][i % 4];
        env.plugin("bridge")
            .command("ADD")
            .container("fuzz")
            .netns_path(&nsp)
            .ifname("eth0")
            .env(var, &s)
            .conf(&conf)
            .run()
            .err();
    }
}

/// Proves: an unreadable stdin (a directory: read fails with EISDIR) is code
/// 5 with a clean error object, not a crash.
#[test]
fn unreadable_stdin_is_code_5() {
    let env = TestEnv::new("unreadable_stdin_is_code_5");
    let ns = env.netns();
    let out = std::process::Command::new(env.bin.join("bridge"))
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "ctr-stdin")
        .env("CNI_NETNS", &ns.path)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &env.bin)
        .stdin(std::fs::File::open("/").expect("open /"))
        .output()
        .expect("run bridge");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "stdout: {stdout}");
    let e = parse_error_object(&stdout, false).unwrap_or_else(|why| panic!("{why}: {stdout}"));
    assert_eq!(e.code, 5, "{e:?}");
    assert!(e.msg.contains("stdin"), "{e:?}");
}
