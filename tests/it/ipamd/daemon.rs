//! The daemon as a guard of the store: peers it refuses, leases of previous
//! boots, dying mid-request, and a dataDir that is not its own.

use super::*;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The daemon's test hook for a fake boot ID (see ipamd/README.md).
const BOOT_ID_FILE_ENV: &str = "CNIKIT_IPAMD_BOOT_ID_FILE";

/// Run `argv` as uid/gid 65534 with no supplementary groups.
fn as_nobody(argv: &[&str], env: &[(&str, String)], stdin: &[u8]) -> std::process::Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(SETPRIV_NOBODY)
        .args(argv)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run setpriv");
    let mut input = child.stdin.take().expect("stdin");
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().expect("wait for setpriv")
}

/// `curl` against the daemon's socket, as root or as nobody: (success, HTTP status).
fn curl(sock: &str, as_root: bool, method: &str, path: &str) -> (bool, String) {
    let url = format!("http://ipamd{path}");
    let mut argv = vec![
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        method,
        "--unix-socket",
        sock,
        &url,
    ];
    if method == "POST" {
        argv.extend(["-H", "Content-Type: application/json", "-d", "{}"]);
    }
    let out = if as_root {
        Command::new(argv[0])
            .args(&argv[1..])
            .output()
            .expect("run curl")
    } else {
        as_nobody(&argv, &[], b"")
    };
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Proves: the daemon refuses a non-root peer with 403 even when the socket
/// file lets it connect; the plugin run as that user fails with a clear error
/// (no in-process fallback behind the daemon's back) and leases nothing;
/// with the default 0600 socket it cannot even connect.
#[test]
fn non_root_peer_refused() {
    let fix = Fix::new("nonroot", Mode::Daemon);
    let conf = fix.conf_24();
    let sock = fix.sock.to_string_lossy().into_owned();
    let mode = std::fs::metadata(&fix.sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let has_curl = Command::new("curl").arg("--version").output().is_ok();
    if has_curl {
        let (ok, code) = curl(&sock, false, "GET", "/healthz");
        assert!(
            !ok && code == "000",
            "nobody connected to a 0600 socket: {code}"
        );
    }

    let plugin_env: Vec<(&str, String)> = vec![
        ("CNI_COMMAND", "ADD".to_string()),
        ("CNI_CONTAINERID", "nobody-ctr".to_string()),
        ("CNI_NETNS", NO_NETNS.to_string()),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_PATH", fix.env.bin.to_string_lossy().into_owned()),
    ];
    let plugin = fix.env.bin.join("ipamd").to_string_lossy().into_owned();
    let stdin = serde_json::to_vec(&conf).expect("conf");
    let run_plugin = || {
        let out = as_nobody(&[&plugin], &plugin_env, &stdin);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(1),
            "ADD as nobody must fail: {stdout}"
        );
        parse_error_object(&stdout, false)
            .unwrap_or_else(|e| panic!("not an error object ({e}): {stdout}"))
    };
    let e = run_plugin();
    assert_eq!(e.code, 11, "{e:?}");

    // Make the socket connectable for everyone: SO_PEERCRED still says no.
    std::fs::set_permissions(&fix.sock, std::fs::Permissions::from_mode(0o666))
        .expect("chmod socket");
    if has_curl {
        assert_eq!(curl(&sock, false, "GET", "/healthz").1, "403");
        assert_eq!(curl(&sock, false, "GET", "/v1/leases").1, "403");
        assert_eq!(curl(&sock, false, "POST", "/v1/release").1, "403");
        assert_eq!(curl(&sock, true, "GET", "/healthz").1, "200");
    }
    let e = run_plugin();
    assert_eq!(e.code, 11, "{e:?}");
    assert!(e.msg.contains("refuses uid 65534"), "{e:?}");
    assert!(fix.leases().is_empty(), "a refused peer got a lease");
}

/// A fake boot ID file: leases made under the real one look like another boot's.
fn fake_boot_id(fix: &Fix) -> PathBuf {
    let boot = fix.env.dir("boot").join("boot_id");
    std::fs::write(&boot, "11111111-2222-3333-4444-555555555555\n").expect("write boot id");
    boot
}

/// Proves: leases of a previous boot are reclaimed when the daemon starts
/// (simulated with the daemon's boot-ID test hook), but kept with
/// `--reclaim-previous-boot=false`; meanwhile a full pool's error says why.
#[test]
fn reboot_reclaim() {
    let mut fix = Fix::new("reboot", Mode::InProcess);
    let (conf, _) = fix.conf_29();
    // Leases of "the previous boot": made in-process with the real boot ID.
    for i in 0..5 {
        fix.add(&format!("old-{i}"), &conf).result();
    }
    let boot = fake_boot_id(&fix);
    let fake_boot = [(BOOT_ID_FILE_ENV, boot.as_path())];

    fix.start_daemon(&["--reclaim-previous-boot=false"], &fake_boot);
    assert_eq!(
        fix.leases().len(),
        5,
        "reclaim is off: nothing may be freed"
    );
    fix.add("new-0", &conf)
        .expect_err(103, &["no free address", "before the last reboot"]);
    fix.stop_daemon();

    fix.start_daemon(&[], &fake_boot);
    assert!(
        fix.leases().is_empty(),
        "the previous boot's leases must be reclaimed"
    );
    fix.add("new-0", &conf).result();
    fix.stop_daemon();
    // Same boot again: the new lease is kept.
    fix.start_daemon(&[], &fake_boot);
    let leases = fix.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].cid, "new-0");
}

/// Proves: with no daemon, a full pool whose leases were made under another
/// boot makes room by freeing those (their netns died with that boot), so
/// host-local's "no IP addresses available" after a reboot cannot happen.
#[test]
fn in_process_full_pool_reclaims_previous_boot() {
    let mut fix = Fix::new("reboot_inproc", Mode::InProcess);
    let (conf, _) = fix.conf_29();
    // Fill the pool "in the previous boot": a daemon with a fake boot ID that
    // does not reclaim.
    let boot = fake_boot_id(&fix);
    fix.start_daemon(
        &["--reclaim-previous-boot=false"],
        &[(BOOT_ID_FILE_ENV, &boot)],
    );
    for i in 0..5 {
        fix.add(&format!("old-{i}"), &conf).result();
    }
    fix.stop_daemon();
    // This boot, no daemon: the ADD succeeds by reclaiming.
    fix.add("new-0", &conf).result();
    let leases = fix.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].cid, "new-0");
}

/// Proves: a daemon that accepts the connection and dies before answering
/// does not hang the plugin or half-make the lease: the plugin redoes the
/// operation in-process and the lease is in the files.
#[test]
fn daemon_dies_mid_request() {
    let fix = Fix::new("dies_mid", Mode::InProcess);
    let conf = fix.conf_24();
    let listener = UnixListener::bind(&fix.sock).expect("bind fake daemon");
    let accepted = Arc::new(AtomicUsize::new(0));
    let acc = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { break };
            // Read part of the request, then "crash".
            let mut buf = [0u8; 16];
            let _ = s.read(&mut buf);
            acc.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    let started = Instant::now();
    let r = fix.add("mid", &conf).result();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the plugin hung"
    );
    assert!(
        accepted.load(Ordering::SeqCst) >= 1,
        "the fake daemon was not asked"
    );
    std::fs::remove_file(&fix.sock).expect("remove fake socket");
    let leases = fix.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].addr, only_addr(&r));
}

/// Proves: a config whose `dataDir` is not the daemon's `--data-dir` is
/// refused by the daemon (error 7 naming both) instead of being served from
/// the daemon's store — otherwise the in-process fallback (daemon down) would
/// allocate from another store and hand out the same address twice.
#[test]
fn data_dir_must_match_the_daemon() {
    let fix = Fix::new("datadir_mismatch", Mode::Daemon);
    let with_data_dir = |dir: &Path| {
        let mut ipam = fix.ipam(fix.nets.v4_ranges());
        ipam["dataDir"] = json!(dir);
        fix.conf("1.0.0", ipam)
    };
    let other = fix.env.dir("other-data");
    let e = fix
        .add("mm-1", &with_data_dir(&other))
        .expect_err(7, &["dataDir"]);
    assert!(
        e.msg.contains(&*other.to_string_lossy()) && e.msg.contains(&*fix.data.to_string_lossy()),
        "the error should name both directories: {e:?}"
    );
    assert!(
        fix.leases().is_empty(),
        "nothing may be allocated in the daemon's store"
    );
    assert!(
        list_leases(&other, &fix.sock.with_file_name("none.sock"), NET).is_empty(),
        "nothing may be allocated in the config's store"
    );
    // The same directory under another name (a symlink) is the same store.
    let link = fix.env.dir("links").join("data-link");
    std::os::unix::fs::symlink(&fix.data, &link).expect("symlink");
    let r = fix.add("mm-2", &with_data_dir(&link)).result();
    assert_eq!(fix.leases().len(), 1);
    let _ = only_addr(&r);
}
