//! `cnikit node-agent` (the DaemonSet's container) without a cluster: it upgrades an older
//! cnikit in the bin dir without --force, writes the mounted lists, and says which host
//! path is missing. The whole pod under containerd is tests/cri (node_agent.rs).

use crate::support::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

fn agent(bin: &Path, net_conf: &Path, conf: &Path, extra: &[&str]) -> Output {
    Command::new(cnikit_exe())
        .arg("node-agent")
        .arg("--cni-bin-dir")
        .arg(bin)
        .arg("--net-conf")
        .arg(net_conf)
        .arg("--cni-conf-dir")
        .arg(conf)
        .arg("--install-only")
        .args(extra)
        .env_clear()
        .output()
        .expect("run cnikit node-agent")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every plugin name in `dir` is a hard link of `dir/cnikit`, mode 0755, our bytes.
fn assert_installed(dir: &Path) {
    let main = std::fs::symlink_metadata(dir.join("cnikit")).expect("cnikit");
    assert_eq!(main.permissions().mode() & 0o7777, 0o755);
    assert!(std::fs::read(dir.join("cnikit")).unwrap() == std::fs::read(cnikit_exe()).unwrap());
    for name in PLUGINS {
        let m = std::fs::symlink_metadata(dir.join(name)).expect(name);
        assert_eq!((m.dev(), m.ino()), (main.dev(), main.ino()), "{name}");
    }
}

/// Proves: an older cnikit's `--copy` install (another build: other bytes, its plugin
/// names hard links of it, one name a separate older copy) is upgraded without --force,
/// while another project's binary under a plugin name is still refused.
#[test]
fn install_copy_upgrades_an_older_cnikit_without_force() {
    let env = TestEnv::new("install_copy_upgrades_an_older_cnikit");
    let dir = env.dir("cni-bin-old");
    let mut older = std::fs::read(cnikit_exe()).unwrap();
    older.extend_from_slice(b"an older build");
    std::fs::write(dir.join("cnikit"), &older).unwrap();
    for name in ["bridge", "portmap", "loopback"] {
        std::fs::hard_link(dir.join("cnikit"), dir.join(name)).unwrap();
    }
    std::fs::write(dir.join("macvlan"), &older).unwrap();
    let o = Command::new(cnikit_exe())
        .args(["install", "--copy", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_installed(&dir);

    // An ELF of someone else's (any binary that is not cnikit) under a plugin name.
    std::fs::remove_file(dir.join("bridge")).unwrap();
    std::fs::copy("/bin/true", dir.join("bridge")).unwrap();
    let o = Command::new(cnikit_exe())
        .args(["install", "--copy", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!o.status.success(), "another binary was replaced");
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert!(std::fs::read(dir.join("bridge")).unwrap() == std::fs::read("/bin/true").unwrap());
}

/// Proves: node-agent --install-only installs the plugins and writes the mounted list
/// 0644 (a second run leaves it alone); a missing host dir or a broken list is an error
/// naming it and what to do, and a broken list never reaches the conf dir.
#[test]
fn node_agent_installs_and_writes_the_list() {
    let env = TestEnv::new("node_agent_installs_and_writes_the_list");
    let (bin, cm, conf) = (env.dir("host-bin"), env.dir("cm"), env.dir("net.d"));
    let list = r#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"}]}"#;
    std::fs::write(cm.join("10-pods.conflist"), list).unwrap();
    for _ in 0..2 {
        let o = agent(&bin, &cm, &conf, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_installed(&bin);
        let written = conf.join("10-pods.conflist");
        assert_eq!(std::fs::read_to_string(&written).unwrap(), list);
        let mode = std::fs::metadata(&written).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
    }

    let missing = env.tmp.join("not-mounted");
    let o = agent(&missing, &cm, &conf, &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--cni-bin-dir") && stderr(&o).contains("hostPath"),
        "{}",
        stderr(&o)
    );
    assert!(!missing.exists(), "a missing host dir must not be created");
    let o = agent(&bin, &cm, &missing, &[]);
    assert!(
        !o.status.success() && stderr(&o).contains("--cni-conf-dir"),
        "{}",
        stderr(&o)
    );

    std::fs::write(cm.join("20-broken.conflist"), "{").unwrap();
    let o = agent(&bin, &cm, &conf, &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("20-broken.conflist"), "{}", stderr(&o));
    assert!(!conf.join("20-broken.conflist").exists());
}
