//! The command an operator runs about a network's files: named in the errors of the
//! journal, the snapshot and the store, and in fsck's report, so it lives below all of them.

use std::path::Path;

/// What to run about damage in the network whose directory is `dir`.
pub(crate) fn fsck_hint(dir: &Path) -> String {
    let cmd = command("fsck", dir);
    format!(
        "run `{cmd}` to see the damage, and `{cmd} --repair` to keep the valid records (the damaged files are kept beside them)"
    )
}

/// `cnikit ipamd <sub>` for the network whose directory is `dir`.
pub(crate) fn command(sub: &str, dir: &Path) -> String {
    let network = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let data_dir = dir.parent().unwrap_or(Path::new("."));
    let flag = if data_dir == Path::new(crate::config::DEFAULT_DATA_DIR) {
        String::new()
    } else {
        format!(" --data-dir {}", data_dir.display())
    };
    format!("cnikit ipamd {sub}{flag} --network {network}")
}
