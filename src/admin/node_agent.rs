//! `cnikit node-agent`: the container of the CNI DaemonSet (contrib/kubernetes/cnikit.yaml,
//! docs/kubernetes.md). In order: the plugins into the host's CNI bin dir (`install
//! --copy`, so the host never runs anything from the image's filesystem), the mounted
//! network lists (a ConfigMap) into the host's CNI conf dir, then the ipamd daemon in this
//! process until SIGTERM. The runtime starts using the network only once its list is in
//! the conf dir, and by then every plugin it names is in the bin dir.

use super::{install, ipamd_daemon};
use crate::safe_dir;
use clap::Args;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A network list is public configuration: the runtime (root) reads it, and so may
/// anyone (the reference's conf dirs hold 0644 files).
const LIST_MODE: u32 = 0o644;
/// Larger than any network list; a bound on what is read from the mounted directory.
const MAX_LIST_BYTES: u64 = 1 << 20;

#[derive(Args)]
pub(crate) struct NodeAgentArgs {
    /// The host's CNI bin dir as mounted in this container (hostPath /opt/cni/bin).
    #[arg(long, default_value = "/host/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    /// Replace plugins of the same names that are not cnikit's (another project's
    /// `bridge`, `loopback`, …); without it they are left alone and the agent stops.
    #[arg(long)]
    force: bool,
    /// Where the network lists are mounted (a ConfigMap): each *.conflist, *.conf and
    /// *.json in it is written into --cni-conf-dir. None mounted: the conf dir is left alone.
    #[arg(long, default_value = "/etc/cnikit/net.d")]
    net_conf: PathBuf,
    /// The host's CNI conf dir as mounted in this container (hostPath /etc/cni/net.d).
    #[arg(long, default_value = "/host/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// Install and write the lists, then exit instead of running the daemon (an init
    /// container, or nodes whose daemon runs elsewhere).
    #[arg(long)]
    install_only: bool,
    /// The daemon's flags, as `cnikit ipamd daemon` takes them.
    #[command(flatten)]
    daemon: ipamd_daemon::DaemonArgs,
}

pub(crate) fn run(args: NodeAgentArgs) -> Result<(), String> {
    host_dir(&args.cni_bin_dir, "--cni-bin-dir", "/opt/cni/bin")?;
    install::run(&args.cni_bin_dir, args.force, true).map_err(|e| {
        format!(
            "installing the plugins into {}: {e} (the host's CNI bin dir must be mounted there read-write)",
            args.cni_bin_dir.display()
        )
    })?;
    write_lists(&args.net_conf, &args.cni_conf_dir)?;
    if args.install_only {
        return Ok(());
    }
    println!("running the ipamd daemon");
    ipamd_daemon::run(args.daemon)
}

/// A host directory mounted into the container must be there: were it created here, the
/// plugins or lists would go into the container's own filesystem and vanish with it.
fn host_dir(dir: &Path, flag: &str, host_path: &str) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{flag} {} is not a directory", dir.display())),
        Err(e) => Err(format!(
            "{flag} {}: {e}; mount the host's {host_path} there (a hostPath volume)",
            dir.display()
        )),
    }
}

/// Every list in `from` into `to` (replaced atomically, 0644, never through a link),
/// unless `to` already holds the same bytes: a runtime reloads its conf dir on every write.
fn write_lists(from: &Path, to: &Path) -> Result<(), String> {
    let lists = match read_lists(from)? {
        None => {
            println!(
                "no network list mounted at {}; {} left as it is",
                from.display(),
                to.display()
            );
            return Ok(());
        }
        Some(l) if l.is_empty() => {
            println!(
                "no *.conflist, *.conf or *.json in {}; {} left as it is",
                from.display(),
                to.display()
            );
            return Ok(());
        }
        Some(l) => l,
    };
    host_dir(to, "--cni-conf-dir", "/etc/cni/net.d")?;
    let open_err = |e: std::io::Error| format!("--cni-conf-dir {}: {e}", to.display());
    let parts = safe_dir::components(to).map_err(open_err)?;
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let dir = safe_dir::open_dir(Path::new("/"), &parts, false)
        .map_err(open_err)?
        .ok_or_else(|| format!("--cni-conf-dir {} does not exist", to.display()))?;
    for (name, bytes) in lists {
        let target = to.join(&name);
        let current = safe_dir::read_at(&dir, &name, MAX_LIST_BYTES)
            .ok()
            .flatten();
        if current.as_deref() == Some(bytes.as_slice()) {
            println!("{} unchanged", target.display());
            continue;
        }
        safe_dir::write_at_mode(&dir, &name, &bytes, LIST_MODE).map_err(|e| {
            format!(
                "cannot write {}: {e} (the host's CNI conf dir must be mounted there read-write)",
                target.display()
            )
        })?;
        println!(
            "{} written from {}",
            target.display(),
            from.join(&name).display()
        );
    }
    Ok(())
}

/// The lists in `dir` by name, sorted, each checked to be one; None when `dir` does not
/// exist. Dot names are skipped: a ConfigMap volume keeps its data under `..data` and
/// timestamped `..2024_…` directories, and each key is a link into them, so the links are
/// followed here (they are the kubelet's, in this container's own mount).
fn read_lists(dir: &Path) -> Result<Option<Vec<List>>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("--net-conf {}: {e}", dir.display())),
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && list_kind(n).is_some())
        .collect();
    names.sort();
    let mut lists = Vec::new();
    for name in names {
        let path = dir.join(&name);
        let bytes = read_list(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        lists.push((name, bytes));
    }
    Ok(Some(lists))
}

/// A list's file name and bytes.
type List = (String, Vec<u8>);

#[derive(Debug, PartialEq)]
enum ListKind {
    /// `.conflist`: a list with `plugins`.
    List,
    /// `.conf`, `.json`: one plugin's configuration, as libcni reads them.
    Single,
}

fn list_kind(name: &str) -> Option<ListKind> {
    if name.ends_with(".conflist") {
        Some(ListKind::List)
    } else if name.ends_with(".conf") || name.ends_with(".json") {
        Some(ListKind::Single)
    } else {
        None
    }
}

/// The file's bytes, if it is JSON shaped as its name says: a broken list in the conf dir
/// would stop every pod of the node, so it never gets there.
fn read_list(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_LIST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_LIST_BYTES {
        return Err(format!("larger than {MAX_LIST_BYTES} bytes"));
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    check_list(&bytes, list_kind(name).unwrap_or(ListKind::Single))?;
    Ok(bytes)
}

fn check_list(bytes: &[u8], kind: ListKind) -> Result<(), String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    if !v["name"].is_string() {
        return Err("no \"name\": a network list names its network".into());
    }
    match kind {
        ListKind::List if v["plugins"].as_array().is_none_or(|p| p.is_empty()) => {
            Err("a .conflist needs a non-empty \"plugins\" array".into())
        }
        ListKind::Single if !v["type"].is_string() => {
            Err("a .conf or .json needs the plugin's \"type\"".into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn lists_are_checked_by_their_kind() {
        let list = br#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"}]}"#;
        assert_eq!(check_list(list, ListKind::List), Ok(()));
        assert!(check_list(list, ListKind::Single).is_err());
        let single = br#"{"cniVersion":"1.0.0","name":"pods","type":"bridge"}"#;
        assert_eq!(check_list(single, ListKind::Single), Ok(()));
        assert!(check_list(single, ListKind::List).is_err());
        assert!(check_list(b"{", ListKind::List).is_err());
        assert!(check_list(br#"{"plugins":[{}]}"#, ListKind::List).is_err());
        assert_eq!(list_kind("10-a.conflist"), Some(ListKind::List));
        assert_eq!(list_kind("a.json"), Some(ListKind::Single));
        assert_eq!(list_kind("a.conflist.tmp"), None);
    }

    /// A ConfigMap volume as the kubelet lays it out: the key a link into `..data`, a
    /// link to a timestamped directory. The key is read through them, the dot names not.
    #[test]
    fn a_configmap_volume_is_read_through_its_links() {
        let base = std::env::temp_dir().join(format!("cnikit-agent-{}", std::process::id()));
        let stamped = base.join("..2024_01_01_00_00_00.1");
        std::fs::create_dir_all(&stamped).expect("mkdir");
        let list = br#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"}]}"#;
        std::fs::write(stamped.join("10-pods.conflist"), list).expect("write");
        std::fs::write(stamped.join("README"), "not a list").expect("write");
        std::os::unix::fs::symlink("..2024_01_01_00_00_00.1", base.join("..data")).expect("ln");
        for n in ["10-pods.conflist", "README"] {
            std::os::unix::fs::symlink(format!("..data/{n}"), base.join(n)).expect("ln");
        }
        let got = read_lists(&base).expect("read").expect("a directory");
        assert_eq!(got, vec![("10-pods.conflist".to_string(), list.to_vec())]);
        std::fs::write(stamped.join("10-pods.conflist"), "{").expect("write");
        let err = read_lists(&base).expect_err("broken list");
        assert!(
            err.contains("10-pods.conflist") && err.contains("not JSON"),
            "{err}"
        );
        assert_eq!(read_lists(&base.join("missing")), Ok(None));
        std::fs::remove_dir_all(&base).expect("clean up");
    }

    /// The conf dir's copy is 0644 whatever the umask, replaced atomically, and a link
    /// planted under its name is replaced, not written through.
    #[test]
    fn lists_are_written_0644_never_through_a_link() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: the conf dir must be root's");
            return;
        }
        let base = std::env::temp_dir().join(format!("cnikit-agent-w-{}", std::process::id()));
        let (from, to) = (base.join("cm"), base.join("net.d"));
        for d in [&base, &from, &to] {
            std::fs::create_dir_all(d).expect("mkdir");
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let list = br#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"}]}"#;
        std::fs::write(from.join("10-pods.conflist"), list).expect("write");
        let victim = base.join("victim");
        std::fs::write(&victim, "keep").expect("write");
        std::os::unix::fs::symlink(&victim, to.join("10-pods.conflist")).expect("ln");
        // SAFETY: umask cannot fail; the test restores it.
        let old = unsafe { libc::umask(0o077) };
        let written = write_lists(&from, &to);
        unsafe { libc::umask(old) };
        written.expect("write_lists");
        let meta = std::fs::symlink_metadata(to.join("10-pods.conflist")).expect("stat");
        assert!(meta.is_file(), "the link must be replaced by a file");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        assert_eq!(
            std::fs::read(to.join("10-pods.conflist")).expect("read"),
            list
        );
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "keep");
        let names: Vec<_> = std::fs::read_dir(&to).expect("ls").flatten().collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        let missing = write_lists(&from, &base.join("absent")).expect_err("missing conf dir");
        assert!(
            missing.contains("hostPath") || missing.contains("mount"),
            "{missing}"
        );
        std::fs::remove_dir_all(&base).expect("clean up");
    }
}
