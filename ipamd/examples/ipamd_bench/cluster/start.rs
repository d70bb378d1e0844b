//! Starting the bench's cluster: pools created and node daemons spawned through the
//! `cnikit` binary, as an operator would.

use std::path::Path;
use std::process::Command;

use super::{metric, Children, Node};

/// `cnikit ipamd pool create NAME --cidr CIDR --block-size BLOCK EXTRA…`.
pub(crate) fn pool_create(
    exe: &Path,
    etcd: &str,
    (name, cidr, block): (&str, &str, u8),
    extra: &[String],
) -> Result<(), String> {
    let out = Command::new(exe)
        .args(["ipamd", "pool", "create", name, "--cidr", cidr])
        .arg(format!("--block-size={block}"))
        .args(extra)
        .arg(format!("--etcd-endpoints={etcd}"))
        .output()
        .map_err(|e| format!("running cnikit ipamd pool create: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cnikit ipamd pool create {name} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

pub(crate) fn start_node(
    exe: &Path,
    root: &Path,
    name: &str,
    etcd: &str,
    kids: &mut Children,
) -> Result<Node, String> {
    let (node, i) = spawn_node(exe, root, (name, etcd), &[], kids)?;
    wait_node(kids, i, &node)?;
    Ok(node)
}

/// Start the daemon of node `name` (its own dir under `root`) with `extra` arguments; the
/// node and its child's index. It serves once [`wait_node`] returns.
pub(crate) fn spawn_node(
    exe: &Path,
    root: &Path,
    (name, etcd): (&str, &str),
    extra: &[String],
    kids: &mut Children,
) -> Result<(Node, usize), String> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let node = Node {
        name: name.to_string(),
        sock: dir.join("ipamd.sock"),
        data: dir.join("data"),
        log: dir.join("daemon.log"),
    };
    let mut cmd = Command::new(exe);
    // Info level: the daemon logs each block claim with its duration (step 3).
    cmd.args(["ipamd", "daemon", "--socket"])
        .arg(&node.sock)
        .arg("--data-dir")
        .arg(&node.data)
        .args(["--log-level", "info"])
        .arg(format!("--etcd-endpoints={etcd}"))
        .arg(format!("--node={name}"))
        .args(extra);
    let i = kids.spawn(cmd, &node.log)?;
    Ok((node, i))
}

/// Wait until the daemon of `node` (child `i`) holds its etcd session.
pub(crate) fn wait_node(kids: &mut Children, i: usize, node: &Node) -> Result<(), String> {
    kids.wait(i, &format!("daemon {}", node.name), &node.log, || {
        metric(&node.sock, "ipamd_cluster_session_up") == Some(1.0)
    })
}
