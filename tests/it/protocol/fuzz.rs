//! Fuzz-like runs: truncated, mutated, mistyped, huge, deep and binary
//! input, random environment values. Whatever comes in, the plugin must
//! exit 1 with one valid error object, never panic or die by a signal.

use super::*;

/// The test's world, and a netns path that does not exist: ADD/CHECK on it
/// can never succeed, so fuzzed configs cannot accidentally configure anything.
fn fuzz_env(test: &str) -> (TestEnv, String) {
    let env = TestEnv::new(test);
    (env, format!("/run/netns/cnikit-missing-{}", short_hash()))
}

/// A rich valid config of `plugin` to mutate (ipamd state in the test dir).
fn rich_conf(env: &TestEnv, plugin: &str) -> Value {
    let data = env.dir("fuzz-ipamd");
    let c = json!({
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
    merged(c, extra)
}

/// `verb` of `plugin` on the netns path `nsp` with `stdin`.
fn fuzz_call(env: &TestEnv, plugin: &str, verb: &str, nsp: &str, stdin: Vec<u8>) -> Call {
    env.plugin(plugin).attach_at(verb, "fuzz", nsp).stdin(stdin)
}

/// ADD on a netns that does not exist: whatever the config, the call must fail.
fn fuzz_add(env: &TestEnv, plugin: &str, stdin: Vec<u8>, nsp: &str) -> CniError {
    fuzz_call(env, plugin, "ADD", nsp, stdin).run().err()
}

fn fuzz_add_json(env: &TestEnv, plugin: &str, conf: &Value, nsp: &str) -> CniError {
    fuzz_add(env, plugin, serde_json::to_vec(conf).unwrap(), nsp)
}

/// A config error (7) whose message names `key`; `what` says which input.
fn assert_names_key(e: &CniError, key: &str, what: &str) {
    assert_eq!(e.code, 7, "{what}: {e:?}");
    assert!(
        e.msg.contains(key),
        "{what}: message must name the key: {}",
        e.msg
    );
}
/// Proves: truncated and randomly mutated configs (a few hundred, seeded)
/// always end in exit 1 with one valid error object, never a signal/panic.
#[test]
fn fuzz_truncated_and_mutated_configs() {
    let (env, nsp) = fuzz_env("fuzz_truncated_and_mutated_configs");
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
            let e = fuzz_call(&env, "bridge", verb, &nsp, base[..cut].to_vec())
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
    let (env, nsp) = fuzz_env("fuzz_wrong_types_in_every_known_key");
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
                let e = fuzz_add_json(&env, plugin, &c, &nsp);
                if !matches(kind, v) {
                    assert_names_key(&e, key, &format!("{plugin} {key}={v}"));
                }
                runs += 1;
            }
        }
        for key in common_keys {
            for v in &wrong {
                let mut c = base.clone();
                c[key] = v.clone();
                let e = fuzz_add_json(&env, plugin, &c, &nsp);
                if matches!(key, "cniVersion" | "name" | "type") && !v.is_string() {
                    assert_names_key(&e, key, &format!("{plugin} {key}={v}"));
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
                    fuzz_add_json(&env, plugin, &c, &nsp);
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
            let e = fuzz_add_json(&env, "ipamd", &c, &nsp);
            assert_names_key(&e, key, &format!("ipam.{key}={v}"));
            runs += 1;
        }
    }
    assert!(runs > 400, "only {runs} runs");
}

/// Proves: huge inputs (several MB of valid JSON, 17 MB over the limit,
/// 100 000-deep nesting, many keys) are handled with a clean error.
#[test]
fn fuzz_huge_and_deep_json() {
    let (env, nsp) = fuzz_env("fuzz_huge_and_deep_json");
    // 6 MB string value: valid JSON; the netns is missing so ADD fails with 3.
    let mut c =
        json!({"cniVersion": "1.0.0", "name": "fuzz", "type": "bridge", "bridge": "fuzzbr0"});
    c["x-blob"] = json!("a".repeat(6 << 20));
    let e = fuzz_add_json(&env, "bridge", &c, &nsp);
    assert_eq!(e.code, 3, "valid big config, missing netns: {e:?}");
    // 200 000 keys.
    let mut many = serde_json::Map::new();
    for i in 0..200_000 {
        many.insert(format!("k{i}"), json!(i));
    }
    let mut c = rich_conf(&env, "bridge");
    c["x-many"] = Value::Object(many);
    fuzz_add_json(&env, "bridge", &c, &nsp);
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
    let e = fuzz_call(&env, "bridge", "CHECK", &nsp, s.into_bytes())
        .run()
        .err();
    assert_eq!(e.code, 6, "{e:?}");
}

/// Proves: binary garbage on stdin (random bytes, invalid UTF-8 in strings,
/// NULs, a UTF-16 BOM) is code 6.
#[test]
fn fuzz_binary_garbage() {
    let (env, nsp) = fuzz_env("fuzz_binary_garbage");
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
    let (env, nsp) = fuzz_env("fuzz_env_values");
    let conf = rich_conf(&env, "bridge");
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let alphabet: Vec<char> = "aZ09_.-/: \t;=,é\u{7f}\u{202e}".chars().collect();
    for i in 0..120 {
        let len = rng.below(24);
        let s: String = (0..len).map(|_| *rng.pick(&alphabet)).collect();
        let var = ["CNI_IFNAME", "CNI_CONTAINERID", "CNI_ARGS", "CNI_PATH"][i % 4];
        env.plugin("bridge")
            .attach_at("ADD", "fuzz", &nsp)
            .env(var, &s)
            .conf(&conf)
            .run()
            .err();
    }
}
