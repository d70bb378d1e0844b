//! The multicall binary and its admin commands: `cnikit install`, dispatch on
//! argv[0] and on `cnikit <plugin>`, VERSION, help, `cnikit version`.

use crate::support::*;
use serde_json::{json, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

fn install(dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(cnikit_exe())
        .args(["install", "--dir"])
        .arg(dir)
        .args(extra)
        .env_clear()
        .output()
        .expect("run cnikit install")
}

/// `cnikit install --dir DIR EXTRA…`, which must succeed.
fn install_ok(dir: &Path, extra: &[&str]) {
    let out = install(dir, extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn canonical_exe() -> std::path::PathBuf {
    cnikit_exe().canonicalize().expect("canonicalize cnikit")
}

/// Every plugin name in `dir` is a symlink resolving to the cnikit binary.
fn assert_links(dir: &Path) {
    for name in PLUGINS {
        let p = dir.join(name);
        let meta = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            meta.file_type().is_symlink(),
            "{} is not a symlink",
            p.display()
        );
        assert_eq!(
            p.canonicalize().unwrap(),
            canonical_exe(),
            "{} points elsewhere",
            p.display()
        );
    }
}

/// The names in `dir` that are not plugin names.
fn leftovers(dir: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| !PLUGINS.contains(&n.to_str().unwrap_or("")))
        .collect()
}

fn version_answer(o: &Outcome) -> Value {
    let v = o.result();
    assert_eq!(
        v["supportedVersions"],
        json!(ALL_VERSIONS),
        "VERSION must list the seven versions:\n{}",
        o.stdout
    );
    v
}

/// A help text must mention each of `needles`.
fn assert_mentions(what: &str, help: &str, needles: &[&str]) {
    for n in needles {
        assert!(help.contains(n), "{what} should mention {n}: {help}");
    }
}

/// Proves: `install --dir` creates exactly one symlink per plugin, pointing at the binary.
#[test]
fn install_makes_one_link_per_plugin() {
    let env = TestEnv::new("install_makes_one_link_per_plugin");
    let dir = env.dir("cni-bin");
    install_ok(&dir, &[]);
    assert_links(&dir);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = PLUGINS.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(
        names, want,
        "install must create exactly one link per plugin (no temp files left)"
    );
}

/// Proves: a second install into the same dir succeeds and changes nothing.
#[test]
fn install_is_idempotent() {
    let env = TestEnv::new("install_is_idempotent");
    let dir = env.dir("cni-bin");
    for _ in 0..3 {
        install_ok(&dir, &[]);
        assert_links(&dir);
    }
    // Creating a missing directory is part of install.
    let nested = env.tmp.join("a/b/c");
    install_ok(&nested, &[]);
    assert_links(&nested);
}

/// Proves: a foreign file (regular file, or a symlink to another binary) is
/// not replaced without --force, the message says what and how; --force replaces it.
#[test]
fn install_refuses_foreign_files_without_force() {
    let env = TestEnv::new("install_refuses_foreign_files_without_force");
    let dir = env.dir("cni-bin");
    let foreign = dir.join("bridge");
    std::fs::write(&foreign, "#!/bin/sh\necho foreign\n").unwrap();
    std::os::unix::fs::symlink(Path::new(REF_DIR).join("macvlan"), dir.join("macvlan")).unwrap();

    let out = install(&dir, &[]);
    assert!(
        !out.status.success(),
        "install must refuse to overwrite a foreign file"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&foreign.display().to_string()) && stderr.contains("--force"),
        "the message must name the file and mention --force: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&foreign).unwrap(),
        "#!/bin/sh\necho foreign\n",
        "the foreign file must be left untouched"
    );
    assert_eq!(
        std::fs::read_link(dir.join("macvlan")).unwrap(),
        Path::new(REF_DIR).join("macvlan"),
        "a foreign symlink must be left untouched"
    );

    install_ok(&dir, &["--force"]);
    assert_links(&dir);
}

/// `install --dir DIR --copy` fails on `path`, a foreign file holding
/// `contents`: the message names it and --force, and the file is left as it was.
fn assert_copy_refused(dir: &Path, path: &Path, contents: &str) {
    let out = install(dir, &["--copy"]);
    assert!(
        !out.status.success(),
        "install --copy replaced {}",
        path.display()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&path.display().to_string()) && stderr.contains("--force"),
        "the message must name the file and mention --force: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(path).unwrap(),
        contents,
        "{} must be left untouched",
        path.display()
    );
}

/// `main` is a regular executable file identical to the binary, every plugin
/// name in `dir` is a hard link of it and answers VERSION, and nothing else is there.
fn assert_hard_links(dir: &Path, main: &Path) {
    let meta = std::fs::symlink_metadata(main).unwrap();
    assert!(
        meta.file_type().is_file(),
        "{} should be a regular file",
        main.display()
    );
    assert!(
        meta.permissions().mode() & 0o111 != 0,
        "{} is not executable",
        main.display()
    );
    assert!(
        std::fs::read(main).unwrap() == std::fs::read(canonical_exe()).unwrap(),
        "{} differs from the binary",
        main.display()
    );
    for name in PLUGINS {
        let p = dir.join(name);
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(
            m.file_type().is_file() && (m.dev(), m.ino()) == (meta.dev(), meta.ino()),
            "{} should be a hard link of {}",
            p.display(),
            main.display()
        );
        version_answer(&Call::new(p).command("VERSION").run());
    }
    let leftovers: Vec<_> = leftovers(dir)
        .into_iter()
        .filter(|n| n != "cnikit")
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary files left behind: {leftovers:?}"
    );
}

/// Proves, with at most two copies of the binary on disk at a time: --copy puts
/// one regular executable copy of the binary in DIR, as `cnikit`, and makes
/// every plugin name a hard link of it, which works as the plugin (VERSION);
/// what an earlier install left (a symlink to the binary, a per-name copy) is
/// replaced without --force; a foreign `cnikit` or plugin name is not, and the
/// message says which file and how, until --force; a further run rewrites
/// nothing; no temporary files are left.
#[test]
fn install_copy_copies_once_and_hard_links_the_names() {
    let env = TestEnv::new("install_copy_copies_once_and_hard_links_the_names");
    let dir = env.dir("cni-bin-copy");
    let main = dir.join("cnikit");
    let foreign = "#!/bin/sh\necho foreign\n";

    std::fs::write(&main, foreign).unwrap();
    assert_copy_refused(&dir, &main, foreign);
    std::fs::remove_file(&main).unwrap();

    std::os::unix::fs::symlink(canonical_exe(), dir.join("macvlan")).unwrap();
    std::fs::copy(canonical_exe(), dir.join("ipvlan")).unwrap();
    install_ok(&dir, &["--copy"]);
    assert_hard_links(&dir, &main);

    let bridge = dir.join("bridge");
    std::fs::remove_file(&bridge).unwrap();
    std::fs::write(&bridge, foreign).unwrap();
    assert_copy_refused(&dir, &bridge, foreign);
    install_ok(&dir, &["--copy", "--force"]);

    // A rewrite changes the copy's inode or mtime; a new hard link or one
    // renamed over a name changes its ctime.
    let stamp = || {
        let m = std::fs::symlink_metadata(&main).unwrap();
        (
            m.ino(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    };
    let before = stamp();
    install_ok(&dir, &["--copy"]);
    assert_eq!(
        before,
        stamp(),
        "a further install must leave the copy and its links alone"
    );
    assert_hard_links(&dir, &main);
}

/// Proves: every link answers VERSION with the seven versions, with or
/// without a config on stdin, echoing the requested cniVersion.
#[test]
fn each_link_answers_version() {
    let env = TestEnv::new("each_link_answers_version");
    for name in PLUGINS {
        let v = version_answer(&env.plugin(name).command("VERSION").run());
        assert!(v["cniVersion"].is_string(), "{v}");
        for asked in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
            let v = version_answer(
                &env.plugin(name)
                    .command("VERSION")
                    .conf(&json!({"cniVersion": asked}))
                    .run(),
            );
            assert_eq!(
                v["cniVersion"], asked,
                "{name} VERSION should answer in {asked}"
            );
        }
    }
}

/// Proves: `cnikit bridge` with CNI_COMMAND behaves like the `bridge` link
/// (same VERSION answer, same validation errors).
#[test]
fn cnikit_subcommand_runs_the_plugin() {
    let env = TestEnv::new("cnikit_subcommand_runs_the_plugin");
    for name in PLUGINS {
        let via_link = env.plugin(name).command("VERSION").run();
        let via_sub = Call::cnikit(&[name]).command("VERSION").run();
        assert_eq!(via_link.result(), via_sub.result(), "{name}");
    }
    let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge"});
    let [e_link, e_sub] = [env.plugin("bridge"), Call::cnikit(&["bridge"])].map(|call| {
        call.command("ADD")
            .conf(&conf)
            .run()
            .expect_err(4, &["CNI_CONTAINERID"])
    });
    assert_eq!(e_link.msg, e_sub.msg);
}

/// Proves: a plugin run by hand (no CNI_COMMAND) prints a help naming itself
/// and the spec versions, exit 0; so does `cnikit` alone, naming all plugins.
#[test]
fn no_cni_command_prints_help() {
    let env = TestEnv::new("no_cni_command_prints_help");
    for name in PLUGINS {
        let o = env.plugin(name).run();
        o.ok();
        assert_mentions(&format!("{name} help"), &o.stdout, &[name]);
        assert_mentions(&format!("{name} help"), &o.stdout, &ALL_VERSIONS);
    }
    let o = Call::cnikit(&[]).run();
    o.ok();
    assert_mentions("cnikit help", &o.stdout, PLUGINS);
    assert_mentions("cnikit help", &o.stdout, &ALL_VERSIONS);
    // Any other argv[0] prints the help too.
    let other = env.tmp.join("not-a-plugin");
    std::os::unix::fs::symlink(cnikit_exe(), &other).unwrap();
    let o = Call::new(other).run();
    o.ok();
    assert_mentions("help of another argv[0]", &o.stdout, &["bridge", "1.1.0"]);
}

/// Proves: `cnikit version` prints the build version.
#[test]
fn cnikit_version() {
    let _env = TestEnv::new("cnikit_version");
    let o = Call::cnikit(&["version"]).run();
    o.ok();
    assert!(
        o.stdout.contains(env!("CARGO_PKG_VERSION")),
        "expected {} in {:?}",
        env!("CARGO_PKG_VERSION"),
        o.stdout
    );
}

/// Proves: `cnikit man --dir DIR` writes cnikit.1 and one page per
/// subcommand (nested ones too), each a non-empty roff page, mode 0644, and
/// writing them again replaces them.
#[test]
fn man_pages_for_every_subcommand() {
    let env = TestEnv::new("man_pages");
    let dir = env.dir("man");
    for _ in 0..2 {
        let o = Call::cnikit(&["man", "--dir", dir.to_str().unwrap()]).run();
        o.ok();
        assert!(o.stdout.contains("cnikit-doctor.1"), "{}", o.stdout);
    }
    for page in [
        "cnikit.1",
        "cnikit-install.1",
        "cnikit-doctor.1",
        "cnikit-net.1",
        "cnikit-ipamd-daemon.1",
        "cnikit-completions.1",
    ] {
        let path = dir.join(page);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH "),
            "{page}: {text}"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{page}");
    }
    assert!(!dir.join("cnikit-help.1").exists());
}

/// Proves: `cnikit completions bash|zsh|fish` prints a non-empty script
/// naming the subcommands; an unknown shell is a usage error.
#[test]
fn completions_for_bash_zsh_and_fish() {
    let _env = TestEnv::new("completions");
    for shell in ["bash", "zsh", "fish"] {
        let o = Call::cnikit(&["completions", shell]).run();
        o.ok();
        assert_mentions(shell, &o.stdout, &["cnikit", "doctor", "ipamd", "leases"]);
    }
    let o = Command::new(cnikit_exe())
        .args(["completions", "tcsh"])
        .output()
        .expect("run cnikit completions");
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}
