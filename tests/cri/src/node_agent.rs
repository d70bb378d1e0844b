//! The DaemonSet's pod (contrib/kubernetes/cnikit.yaml) as kubelet runs it: the image's
//! `cnikit node-agent` in a hostNetwork pod with the manifest's capabilities (not
//! privileged), the host's CNI dirs and /run/cnikit mounted in. It installs the plugins
//! (over an older cnikit's copy) and the ConfigMap's list, runs the daemon; ordinary pods
//! then get their network from what it installed, through the daemon; once the agent's pod
//! is gone, new pods still work (the plugins in-process) and the old ones are deleted.

use crate::checks::{nothing_left, ping, Report};
use crate::cri::{Cri, PodSpec};
use crate::probe::hostport;
use crate::scenarios::{expect, remove_all, spec, stop_remove, wait_serving};
use k8s_cri::v1::*;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

const SOCKET: &str = "/run/cnikit/ipamd.sock";
const POD: &str = "cnikit-agent";

/// How run.sh describes the agent's pod: read from the manifest, paths of the suite's node.
#[derive(Clone, Debug, Default)]
pub struct Agent {
    pub image: String,
    pub caps: Vec<String>,
    pub host_pid: bool,
    /// The node's CNI bin dir, conf dir, and the ConfigMap's volume (kubelet's layout).
    pub bin_dir: String,
    pub conf_dir: String,
    pub net_conf: String,
    /// The list's file name in the ConfigMap.
    pub list: String,
}

pub async fn node_agent(cri: &Cri, rep: &mut Report, a: &Agent, network: &str, node_ip: &str) {
    let w = "node-agent";
    let (sandbox, container) = match start(cri, a).await {
        Ok(ids) => {
            rep.ok(&format!(
                "{w}: the agent's pod starts (hostNetwork, hostPID {}, capabilities {:?} only, not privileged, read-only root)",
                a.host_pid, a.caps
            ));
            ids
        }
        Err(e) => {
            rep.fail(&format!("{w}: the agent's pod starts"), &e);
            return remove_all(cri, &[POD]).await;
        }
    };
    let up = wait_for(|| installed(a).and_then(|()| daemon_get("/healthz").map(drop))).await;
    rep.check(
        &format!("{w}: plugins installed, list written, daemon answering on {SOCKET}"),
        up.clone(),
    );
    if up.is_ok() {
        rep.check(&format!("{w}: the bin dir: one copy, every plugin a hard link of it, the older copy replaced"), installed(a));
        rep.check(
            &format!(
                "{w}: {} in the conf dir: 0644, the ConfigMap's bytes",
                a.list
            ),
            list_written(a),
        );
    }
    rep.check(
        &format!("{w}: containerd loads network {network}"),
        cri.wait_network(network).await,
    );
    let mut pods = Vec::new();
    for (name, hport) in [("agent-a", 8380), ("agent-b", 8381)] {
        let s = spec(name, &[(Protocol::Tcp, 80, hport)]);
        if let Some(p) = rep.check(&format!("{w}: pod {name} starts"), cri.run_pod(&s).await) {
            pods.push((p, hport));
        }
    }
    for (p, hport) in &pods {
        let ip = p.ips.first().cloned().unwrap_or_default();
        rep.check(
            &format!("{w}: {} serves on {ip}", p.name),
            wait_serving(&ip, 80).await,
        );
        expect(rep, w, &p.name, "tcp", &format!("127.0.0.1:{hport}"));
        expect(rep, w, &p.name, "tcp", &hostport(node_ip, *hport));
        rep.check(&format!("{w}: the node pings {} ({ip})", p.name), ping(&ip));
    }
    let ids: Vec<&str> = pods.iter().map(|(p, _)| p.id.as_str()).collect();
    rep.check(
        &format!("{w}: the daemon holds both pods' leases (GET /v1/leases)"),
        daemon_get("/v1/leases").and_then(|l| holds_all(&l, &ids)),
    );
    rep.check(
        &format!(
            "{w}: the daemon did the allocations and firewall changes, none refused (/metrics)"
        ),
        daemon_get("/metrics").and_then(|m| served(&m)),
    );
    rep.check(
        &format!("{w}: the plugins containerd ran reported their calls (ipamd_plugin_*)"),
        daemon_get("/metrics").and_then(|m| reported(&m, pods.len())),
    );

    // kubectl delete pod / the DaemonSet: kubelet stops the container (SIGTERM), then the sandbox
    rep.check(
        &format!("{w}: StopContainer of the agent (SIGTERM)"),
        cri.stop_container(&container, 10).await,
    );
    rep.eq(
        &format!("{w}: the agent exited 0 on SIGTERM"),
        Ok((ContainerState::ContainerExited as i32, 0)),
        cri.container_state(&container).await,
    );
    stop_remove(cri, rep, &format!("{w}: the agent's pod"), &sandbox).await;
    rep.eq(
        &format!("{w}: no daemon answers any more"),
        true,
        daemon_get("/healthz").is_err(),
    );

    let s = spec("agent-c", &[(Protocol::Tcp, 80, 8382)]);
    let c = rep.check(
        &format!("{w}: without the agent, pod agent-c starts (plugins in-process)"),
        cri.run_pod(&s).await,
    );
    if let Some(c) = &c {
        let ip = c.ips.first().cloned().unwrap_or_default();
        let taken: Vec<&String> = pods.iter().filter_map(|(p, _)| p.ips.first()).collect();
        rep.eq(
            &format!("{w}: agent-c's address {ip} is not one of the earlier pods'"),
            false,
            taken.contains(&&ip),
        );
        rep.check(
            &format!("{w}: agent-c serves on {ip}"),
            wait_serving(&ip, 80).await,
        );
        expect(rep, w, "agent-c", "tcp", "127.0.0.1:8382");
        pods.push((c.clone(), 8382));
    }
    for (p, _) in &pods {
        stop_remove(cri, rep, &format!("{w}: {}", p.name), &p.id).await;
    }
    remove_all(cri, &["agent-a", "agent-b", "agent-c", POD]).await;
    nothing_left(rep, &format!("{}/cnikit", a.bin_dir), w);
}

/// The agent's sandbox and container, as kubelet makes them from the DaemonSet's spec.
async fn start(cri: &Cri, a: &Agent) -> Result<(String, String), String> {
    let mut sandbox = cri.sandbox_config(&PodSpec {
        name: POD.into(),
        host_network: true,
        ..Default::default()
    });
    let ns = NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: if a.host_pid {
            NamespaceMode::Node
        } else {
            NamespaceMode::Container
        } as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    };
    if let Some(sc) = sandbox
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.namespace_options = Some(ns.clone());
    }
    let id = cri.run_sandbox_with(sandbox.clone()).await?;
    let mount = |host: &str, at: &str, readonly: bool| Mount {
        container_path: at.into(),
        host_path: host.into(),
        readonly,
        ..Default::default()
    };
    let config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "cnikit".into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: a.image.clone(),
            ..Default::default()
        }),
        // The manifest's args; the image's entrypoint is `cnikit node-agent`.
        args: vec![
            "--cni-bin-dir=/host/opt/cni/bin".into(),
            "--cni-conf-dir=/host/etc/cni/net.d".into(),
            "--net-conf=/etc/cnikit/net.d".into(),
        ],
        mounts: vec![
            mount(&a.bin_dir, "/host/opt/cni/bin", false),
            mount(&a.conf_dir, "/host/etc/cni/net.d", false),
            mount(&a.net_conf, "/etc/cnikit/net.d", true),
            mount("/run/cnikit", "/run/cnikit", false),
            mount("/var/lib/cni/ipamd", "/var/lib/cni/ipamd", false),
        ],
        log_path: "cnikit.log".into(),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                capabilities: Some(Capability {
                    add_capabilities: a.caps.clone(),
                    drop_capabilities: vec!["ALL".into()],
                    ..Default::default()
                }),
                privileged: false,
                namespace_options: Some(ns),
                readonly_rootfs: true,
                no_new_privs: true,
                seccomp: Some(SecurityProfile {
                    profile_type: security_profile::ProfileType::RuntimeDefault as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let container = cri.start_container(&id, sandbox, config).await?;
    Ok((id, container))
}

/// Until `ready` is Ok (20 s): the agent's image is started from scratch.
async fn wait_for(ready: impl Fn() -> Result<(), String>) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..200 {
        match ready() {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("not after 20 s: {last}"))
}

/// The bin dir holds `cnikit`, one regular file, and every other name is a hard link of it
/// (the older copy run.sh left there, a different file, replaced).
fn installed(a: &Agent) -> Result<(), String> {
    let main = std::fs::symlink_metadata(format!("{}/cnikit", a.bin_dir))
        .map_err(|e| format!("{}/cnikit: {e}", a.bin_dir))?;
    if main.permissions().mode() & 0o7777 != 0o755 {
        return Err(format!("cnikit has mode {:o}", main.mode() & 0o7777));
    }
    let mut names = 0;
    for e in std::fs::read_dir(&a.bin_dir).map_err(|e| e.to_string())? {
        let e = e.map_err(|e| e.to_string())?;
        let m = e.metadata().map_err(|e| e.to_string())?;
        if (m.dev(), m.ino()) != (main.dev(), main.ino()) {
            return Err(format!("{:?} is not a hard link of cnikit", e.file_name()));
        }
        names += 1;
    }
    if names < 20 {
        return Err(format!("only {names} names in the bin dir"));
    }
    list_written(a)
}

fn list_written(a: &Agent) -> Result<(), String> {
    let path = format!("{}/{}", a.conf_dir, a.list);
    let m = std::fs::symlink_metadata(&path).map_err(|e| format!("{path}: {e}"))?;
    let want = std::fs::read(format!("{}/{}", a.net_conf, a.list)).map_err(|e| e.to_string())?;
    match (m.is_file(), m.mode() & 0o7777, std::fs::read(&path)) {
        (true, 0o644, Ok(got)) if got == want => Ok(()),
        (file, mode, _) => Err(format!(
            "{path}: file {file}, mode {mode:o}, or other bytes"
        )),
    }
}

/// GET `path` from the daemon: the body of a 200 answer.
fn daemon_get(path: &str) -> Result<String, String> {
    let mut s = std::os::unix::net::UnixStream::connect(SOCKET)
        .map_err(|e| format!("connect {SOCKET}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: ipamd\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    match out.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(format!("GET {path}: {}", out.lines().next().unwrap_or(""))),
    }
}

fn holds_all(leases: &str, ids: &[&str]) -> Result<(), String> {
    match ids.iter().find(|id| !leases.contains(*id)) {
        None if !ids.is_empty() => Ok(()),
        _ => Err(format!("want {ids:?} in: {leases}")),
    }
}

/// Each pod's bridge and portmap ADD reached the daemon as a report of the plugin's call.
fn reported(metrics: &str, pods: usize) -> Result<(), String> {
    let adds = |plugin: &str| {
        let series =
            format!("ipamd_plugin_duration_seconds_count{{plugin=\"{plugin}\",verb=\"ADD\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series)?.trim().parse::<usize>().ok())
            .unwrap_or(0)
    };
    match (adds("bridge"), adds("portmap")) {
        (b, p) if b >= pods && p >= pods => Ok(()),
        (b, p) => Err(format!(
            "bridge ADD reports {b}, portmap ADD reports {p}, want {pods} each"
        )),
    }
}

/// Allocations and firewall operations succeeded at the daemon, and none was refused
/// (403 to a peer it could not judge, and the plugin's ADD fails; 421 to one it saw in
/// another network namespace, which then does the work itself).
fn served(metrics: &str) -> Result<(), String> {
    let count = |prefix: &str, want: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(want))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    };
    let allocated = count("ipamd_requests_total", "verb=\"allocate\",outcome=\"ok\"");
    let firewall = count("ipamd_ext_requests_total", "outcome=\"ok\"");
    let refused = count("ipamd_requests_total", "forbidden")
        + count("ipamd_ext", "forbidden")
        + count("ipamd_ext", "declined");
    if allocated >= 2 && firewall > 0 && refused == 0 {
        return Ok(());
    }
    let ours: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ipamd_requests_total") || l.starts_with("ipamd_ext"))
        .collect();
    Err(format!(
        "allocate ok {allocated}, firewall ok {firewall}, refused {refused}:\n{}",
        ours.join("\n")
    ))
}
