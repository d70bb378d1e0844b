//! The plain pieces every other support module builds on: the binary under
//! test, a command's checked output, a named network namespace. Nothing here
//! depends on another support module.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn cnikit_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cnikit"))
}

/// The output of the command `what`, which must have succeeded (else panic
/// with its stdout and stderr): its stdout.
pub fn stdout_ok(what: &str, out: &Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cnikit install --dir DIR`, which must succeed: our links in `dir`.
pub fn install_links(dir: &Path) {
    let out = Command::new(cnikit_exe())
        .args(["install", "--dir"])
        .arg(dir)
        .output()
        .expect("run cnikit install");
    stdout_ok(&format!("cnikit install --dir {}", dir.display()), &out);
}

/// A named network namespace (`ip netns add`); `path` is what CNI_NETNS gets.
#[derive(Debug, Clone)]
pub struct Netns {
    pub name: String,
    pub path: String,
}
