//! kind's own network list, which kindnetd writes on every node of a kind cluster
//! (`10-kindnet.conflist`: ptp + host-local + portmap at cniVersion 0.3.1), run by
//! containerd with only cnikit's plugins: pods reach each other, the node and a
//! hostPort, and leave nothing.

use crate::checks::{nothing_left, ping, Report};
use crate::cri::{Cri, Pod};
use crate::probe::hostport;
use crate::scenarios::{expect, remove_all, spec, stop_remove, wait_serving};
use k8s_cri::v1::Protocol;

/// host-local's `dataDir` in kind's list.
const KIND_IPAM_DIR: &str = "/run/cni-ipam-state";

/// Two pods on kind's network: A's hostPort answers; B reaches A directly and the node.
pub async fn kind_pods(cri: &Cri, rep: &mut Report, network: &str, node_ip: &str, cnikit: &str) {
    let w = "kind's conflist";
    let names = ["kind-a", "kind-b"];
    let a = rep.check(
        &format!("{w}: pod A starts"),
        cri.run_pod(&spec(names[0], &[(Protocol::Tcp, 80, 8280)]))
            .await,
    );
    let b = rep.check(
        &format!("{w}: pod B starts"),
        // (cri-echo, the container, serves its ports: with none it exits)
        cri.run_pod(&spec(names[1], &[(Protocol::Tcp, 80, 8281)]))
            .await,
    );
    let (Some(a), Some(b)) = (a, b) else {
        return remove_all(cri, &names).await;
    };
    let (Some(a_ip), Some(b_ip)) = (a.ips.first(), b.ips.first()) else {
        rep.fail(
            &format!("{w}: both pods have an address"),
            &format!("{a:?} {b:?}"),
        );
        return remove_all(cri, &names).await;
    };
    rep.check(
        &format!("{w}: A serves on {a_ip}"),
        wait_serving(a_ip, 80).await,
    );
    rep.check(&format!("{w}: the node pings B ({b_ip})"), ping(b_ip));
    expect(rep, w, "kind-a", "tcp", &hostport(a_ip, 80));
    expect(rep, w, "kind-a", "tcp", "127.0.0.1:8280");
    expect(rep, w, "kind-a", "tcp", &hostport(node_ip, 8280));
    in_pod(
        cri,
        rep,
        w,
        &b,
        &["cri-echo", "probe", "tcp", &hostport(a_ip, 80)],
        "kind-a",
    )
    .await;
    in_pod(
        cri,
        rep,
        w,
        &b,
        &["ping", "-c", "1", "-W", "2", node_ip],
        "",
    )
    .await;
    for pod in [&a, &b] {
        stop_remove(cri, rep, w, &pod.id).await;
    }
    nothing_left(rep, cnikit, w);
    let leases = host_local_leases(network);
    rep.eq(
        &format!("{w}: no host-local lease left"),
        "",
        leases.as_str(),
    );
}

/// `cmd` in `pod`'s container succeeds (and prints `want`, when one is given).
async fn in_pod(cri: &Cri, rep: &mut Report, w: &str, pod: &Pod, cmd: &[&str], want: &str) {
    let what = format!("{w}: `{}` in {}", cmd.join(" "), pod.name);
    match cri.exec(&pod.container, cmd).await {
        Ok((0, out, _)) if want.is_empty() || out.trim() == want => rep.ok(&what),
        Ok((code, out, e)) => rep.fail(&what, &format!("exit {code}: {out} {e}")),
        Err(e) => rep.fail(&what, &e),
    }
}

/// The lease files under host-local's network directory (not its lock or round-robin state).
fn host_local_leases(network: &str) -> String {
    let dir = format!("{KIND_IPAM_DIR}/{network}");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
        .collect();
    names.sort();
    names.join(" ")
}
