//! The CNI_* environment: required and optional variables, their values,
//! CNI_ARGS, and stdin that cannot be read.

use super::*;
use std::os::unix::ffi::OsStringExt;

/// Proves: for ADD, CHECK, DEL and GC every variable the spec requires is
/// checked; a missing one gives code 4 naming it, labelled with the config's version.
#[test]
fn each_required_env_var_missing_per_verb() {
    let (env, ns) = TestEnv::with_netns("each_required_env_var_missing_per_verb");
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
            let e = full_env(&env, "bridge", verb, &ns)
                .unset(var)
                .conf(&conf)
                .run()
                .expect_err(4, &[var]);
            assert_eq!(
                e.cni_version, version,
                "error labelled with the config's version"
            );
            // An empty value counts as missing too.
            full_env(&env, "bridge", verb, &ns)
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
    let (env, ns) = TestEnv::with_netns("invalid_container_id");
    for bad in [
        "-abc", "_abc", ".abc", "a/b", "a b", "a:b", "a;b", "ctr\n", "é", "a\u{0}b",
    ] {
        if bad.contains('\0') {
            continue; // cannot be put in an environment
        }
        for verb in ["ADD", "DEL"] {
            full_env(&env, "bridge", verb, &ns)
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
    let (env, ns) = TestEnv::with_netns("invalid_ifname");
    let too_long = "0123456789abcdef";
    for bad in [
        ".",
        "..",
        too_long,
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
            full_env(&env, "bridge", verb, &ns)
                .ifname(bad)
                .conf(&conf)
                .run()
                .expect_err(4, &["CNI_IFNAME"]);
        }
    }
    // Exactly 15 bytes works end to end (L2 bridge attachment).
    let att = env
        .attachment("bridge", "ctr-proto", &ns, &bridge_conf(&env, "1.0.0"))
        .with_ifname("abcdefghijklmno");
    let r = att.add();
    assert_eq!(r["interfaces"][2]["name"], "abcdefghijklmno", "{r}");
    assert!(link(Some(&ns.name), "abcdefghijklmno").is_some());
    att.del();
}

/// Proves: a non-UTF-8 environment value is a clean code 4, not a crash.
#[test]
fn non_utf8_env_values() {
    let (env, ns) = TestEnv::with_netns("non_utf8_env_values");
    for var in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_ARGS"] {
        let o = full_env(&env, "bridge", "ADD", &ns)
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
    let (env, ns) = TestEnv::with_netns("unknown_cni_command");
    for bad in ["PUT", "add", "ADD ", "DELETE", "version"] {
        full_env(&env, "bridge", bad, &ns)
            .conf(&bridge_conf(&env, "1.0.0"))
            .run()
            .expect_err(4, &["CNI_COMMAND", bad.trim()]);
    }
}

/// Proves: CNI_ARGS with an unknown key fails (code 4, key named) unless
/// IgnoreUnknown is set; a malformed pair fails too.
#[test]
fn cni_args_unknown_key() {
    let (env, ns) = TestEnv::with_netns("cni_args_unknown_key");
    let att = env.attachment("bridge", "ctr-proto", &ns, &bridge_conf(&env, "1.0.0"));
    att.call("ADD")
        .cni_args("K8S_POD_NAME=web-1")
        .run()
        .expect_err(4, &["K8S_POD_NAME"]);
    att.call("ADD")
        .cni_args("novalue")
        .run()
        .expect_err(4, &["novalue"]);
    assert_only_lo(&ns, "refused ADD");
    // With IgnoreUnknown the same call goes through.
    let k8s = "IgnoreUnknown=1;K8S_POD_NAME=web-1;K8S_POD_NAMESPACE=default";
    att.call("ADD").cni_args(k8s).run().result();
    att.call("DEL").cni_args(k8s).run().ok_silent();
}

/// Proves: an unreadable stdin (a directory: read fails with EISDIR) is code
/// 5 with a clean error object, not a crash.
#[test]
fn unreadable_stdin_is_code_5() {
    let (env, ns) = TestEnv::with_netns("unreadable_stdin_is_code_5");
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
