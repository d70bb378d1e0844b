//! `logFile`: every call of a plugin whose configuration names one appends
//! its stderr and one line (time, plugin, command, container, ifname,
//! outcome) to that file, while the runtime gets stdout and stderr as ever;
//! the file is opened safely, and one that cannot be used never fails a call.

use crate::support::*;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A bridge + ipamd (in-process) network on a new bridge, logging to `log`.
fn conf(env: &TestEnv, log: &Path) -> Value {
    let nets = env.subnets();
    json!({
        "cniVersion": "1.0.0",
        "name": "logged",
        "type": "bridge",
        "bridge": env.link_name("lbr"),
        "isGateway": true,
        "LogFile": log,
        "ipam": env.ipam(Ipam::Ipamd, nets.v4_ranges()),
    })
}

/// A test's world for one logged network: the log file (not made yet), the network's
/// config logging to it, and a netns.
fn logged(test: &str) -> (TestEnv, PathBuf, Value, Netns) {
    let env = TestEnv::new(test);
    let log = env.dir("logs").join("cni.log");
    let conf = conf(&env, &log);
    let ns = env.netns();
    (env, log, conf, ns)
}

/// `plugin` of the test bin dir, run through `sh` with umask 000 (the mode
/// of a new log file must not depend on it) and `redirect` on its exec.
fn wrapped(env: &TestEnv, plugin: &str, redirect: &str) -> Call {
    let wrapper = env.dir("wrap").join(plugin);
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\numask 000\nexec '{}' \"$@\" {redirect}\n",
            env.bin.join(plugin).display()
        ),
    )
    .expect("write wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = std::env::join_paths([&env.bin, &env.ref_bin]).expect("CNI_PATH");
    Call::new(wrapper).env("CNI_PATH", &path.to_string_lossy())
}

fn under_umask_000(env: &TestEnv, plugin: &str) -> Call {
    wrapped(env, plugin, "")
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// `time plugin[pid] TEXT`: the time is RFC 3339 in UTC; returns (pid, TEXT).
fn parse_line(line: &str, plugin: &str) -> (String, String) {
    let (time, rest) = line
        .split_once(' ')
        .unwrap_or_else(|| panic!("no time: {line:?}"));
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "not RFC 3339 UTC: {line:?}"
    );
    let rest = rest
        .strip_prefix(&format!("{plugin}["))
        .unwrap_or_else(|| panic!("no {plugin}[pid]: {line:?}"));
    let (pid, text) = rest.split_once("] ").expect("pid");
    (pid.to_string(), text.to_string())
}

/// Proves: ADD, a DEL that ignores malformed CNI_ARGS (a warning on stderr)
/// and a failing ADD each append their stderr lines and one outcome line; the
/// file is created 0600 under umask 000; stdout is exactly what the same call
/// prints without `logFile`, and the runtime's stderr is what the file got.
#[test]
fn every_call_appends_its_stderr_and_outcome() {
    let (env, log, conf, ns) = logged("logfile_calls");
    let id = cid("log");

    let add = under_umask_000(&env, "bridge")
        .attach("ADD", &id, &ns, "eth0")
        .conf(&conf)
        .run();
    add.result();
    assert_eq!(
        std::fs::metadata(&log)
            .expect("log file made")
            .permissions()
            .mode()
            & 0o7777,
        0o600
    );
    let lines: Vec<String> = read(&log).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let (_, text) = parse_line(&lines[0], "bridge");
    assert_eq!(text, format!("ADD containerID={id} ifname=eth0: ok"));

    let del = env
        .plugin("bridge")
        .attach("DEL", &id, &ns, "eth0")
        .cni_args("IgnoreUnknown=1;broken")
        .conf(&conf)
        .run();
    del.ok_silent();
    assert!(
        del.stderr.contains("DEL: "),
        "expected a warning: {}",
        del.stderr
    );
    let lines: Vec<String> = read(&log).lines().skip(1).map(str::to_string).collect();
    let parsed: Vec<(String, String)> = lines.iter().map(|l| parse_line(l, "bridge")).collect();
    let (last, warnings) = parsed.split_last().expect("DEL lines");
    assert_eq!(last.1, format!("DEL containerID={id} ifname=eth0: ok"));
    let copied: Vec<&str> = warnings
        .iter()
        .map(|(pid, t)| {
            assert_eq!(pid, &last.0, "all lines of one call carry its pid");
            t.strip_prefix("stderr: ").expect("a stderr line")
        })
        .collect();
    assert_eq!(
        copied,
        del.stderr.lines().collect::<Vec<_>>(),
        "the file gets what stderr got"
    );

    // A failing call: the same error object and stderr as without logFile.
    let mut bad = conf.clone();
    bad["mtu"] = json!(-5);
    let mut unlogged = bad.clone();
    unlogged.as_object_mut().unwrap().remove("LogFile");
    let call = |c: &Value| {
        env.plugin("bridge")
            .attach("ADD", &id, &ns, "eth0")
            .conf(c)
            .run()
    };
    let (logged, plain) = (call(&bad), call(&unlogged));
    let e = logged.err();
    assert_eq!(logged.stdout, plain.stdout);
    assert_eq!(logged.stderr, plain.stderr);
    let last = read(&log).lines().last().expect("a line").to_string();
    let (_, text) = parse_line(&last, "bridge");
    assert_eq!(
        text,
        format!(
            "ADD containerID={id} ifname=eth0: error {}: {}",
            e.code, e.msg
        )
    );
    assert!(read(&log).contains(&format!("stderr: {}", logged.stderr.trim())));
}

/// Proves: a symbolic link planted at the log path is not followed (the
/// target is untouched), a relative path and a missing directory are
/// refused, and in each case the call itself succeeds as without `logFile`,
/// with a note on stderr.
#[test]
fn an_unusable_log_file_never_fails_the_call() {
    let env = TestEnv::new("logfile_refused");
    let dir = env.dir("logs");
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let planted = dir.join("cni.log");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let ns = env.netns();
    let cases: [(PathBuf, &str); 3] = [
        (planted, "symbolic link"),
        (PathBuf::from("relative/cni.log"), "absolute path"),
        (dir.join("missing/cni.log"), "cannot open"),
    ];
    for (path, why) in cases {
        let c = conf(&env, &path);
        let add = env
            .plugin("bridge")
            .attach("ADD", &cid("refused"), &ns, "eth0")
            .conf(&c);
        let out = add.clone().run();
        out.result();
        assert!(
            out.stderr.contains("logFile") && out.stderr.contains(why),
            "{path:?}: stderr should say {why:?}: {}",
            out.stderr
        );
        let del = add.command("DEL").run();
        del.ok_silent();
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(!dir.join("missing").exists());
}

/// Proves: a plugin started with stderr closed still logs whole lines: its
/// warning and its outcome (Rust's start-up puts /dev/null on a closed fd 2,
/// so the file never becomes stderr itself).
#[test]
fn a_closed_stderr_still_logs_whole_lines() {
    let (env, log, conf, ns) = logged("logfile_no_stderr");
    wrapped(&env, "bridge", "2>&-")
        .attach("DEL", "no-stderr", &ns, "eth0")
        .cni_args("IgnoreUnknown=1;broken")
        .conf(&conf)
        .run()
        .ok_silent();
    let text = read(&log);
    let lines: Vec<String> = text.lines().map(|l| parse_line(l, "bridge").1).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("stderr: DEL: "), "{text}");
    assert_eq!(lines[1], "DEL containerID=no-stderr ifname=eth0: ok");
}

/// Proves: concurrent calls sharing one log file each get their own whole
/// outcome line (one write per line on an O_APPEND file).
#[test]
fn concurrent_calls_do_not_tear_lines() {
    let (env, log, conf, ns) = logged("logfile_concurrent");
    std::thread::scope(|s| {
        for i in 0..12 {
            let (env, conf, ns) = (&env, &conf, &ns);
            s.spawn(move || {
                env.plugin("bridge")
                    .attach("DEL", &format!("gone-{i}"), ns, "eth0")
                    .conf(conf)
                    .run()
                    .ok_silent();
            });
        }
    });
    let text = read(&log);
    let mut ids: Vec<String> = text
        .lines()
        .map(|l| parse_line(l, "bridge").1)
        .filter_map(|t| {
            let rest = t.strip_prefix("DEL containerID=")?;
            Some(
                rest.strip_suffix(" ifname=eth0: ok")
                    .expect("whole line")
                    .to_string(),
            )
        })
        .collect();
    ids.sort();
    let mut want: Vec<String> = (0..12).map(|i| format!("gone-{i}")).collect();
    want.sort();
    assert_eq!(ids, want, "{text}");
}
