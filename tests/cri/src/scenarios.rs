//! The scenarios: each starts from an empty node and must leave it empty.

use crate::checks::{cached_gateways, node_state, nothing_left, ping, Report};
use crate::cri::{Cri, Pod, PodSpec};
use crate::probe::{hostport, probe};
use k8s_cri::v1::Protocol;
use std::collections::BTreeSet;
use tokio::task::JoinSet;

pub(crate) fn spec(name: &str, ports: &[(Protocol, u16, u16)]) -> PodSpec {
    PodSpec {
        name: name.into(),
        ports: ports.to_vec(),
        host_network: false,
    }
}

/// Until the pod's TCP server answers (the container has just been started).
pub(crate) async fn wait_serving(ip: &str, port: u16) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..50 {
        match probe("tcp", &hostport(ip, port)) {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(last)
}

pub(crate) fn expect(rep: &mut Report, what: &str, want: &str, proto: &str, addr: &str) {
    match probe(proto, addr) {
        Ok(got) => rep.eq(
            &format!("{what}: {proto} {addr} answers"),
            want,
            got.as_str(),
        ),
        Err(e) => rep.fail(&format!("{what}: {proto} {addr} answers"), &e),
    }
}

/// From inside the pod's container (CRI ExecSync): `cri-echo probe`.
async fn expect_in_pod(
    cri: &Cri,
    rep: &mut Report,
    what: &str,
    pod: &Pod,
    proto: &str,
    addr: &str,
) {
    let what = format!("{what}: {proto} {addr} from inside the pod (ExecSync) answers");
    match cri
        .exec(&pod.container, &["cri-echo", "probe", proto, addr])
        .await
    {
        Ok((0, out, _)) => rep.eq(&what, pod.name.as_str(), out.as_str()),
        Ok((code, out, e)) => rep.fail(&what, &format!("exit {code}: {out} {e}")),
        Err(e) => rep.fail(&what, &e),
    }
}

pub(crate) async fn stop_remove(cri: &Cri, rep: &mut Report, what: &str, id: &str) {
    rep.check(&format!("{what}: StopPodSandbox"), cri.stop(id).await);
    rep.check(&format!("{what}: RemovePodSandbox"), cri.remove(id).await);
}

/// Best effort after a failure, so that the next scenario starts from an empty node.
pub(crate) async fn remove_all(cri: &Cri, names: &[&str]) {
    for n in names {
        for (id, _) in cri.find(n).await.unwrap_or_default() {
            let _ = cri.stop(&id).await;
            let _ = cri.remove(&id).await;
        }
    }
}

/// A pod with a TCP and a UDP hostPort: pod IP, 127.0.0.1, gateway and node IP from the node,
/// hairpin from inside the pod; StopPodSandbox then RemovePodSandbox leave nothing.
pub async fn hostport_pod(cri: &Cri, rep: &mut Report, network: &str, node_ip: &str, cnikit: &str) {
    let w = "hostport pod";
    let s = spec(
        "hostport",
        &[(Protocol::Tcp, 80, 8080), (Protocol::Udp, 53, 8053)],
    );
    let Some(pod) = rep.check(
        &format!("{w}: RunPodSandbox + CreateContainer + StartContainer"),
        cri.run_pod(&s).await,
    ) else {
        return remove_all(cri, &["hostport"]).await;
    };
    let ip = pod.ips.first().cloned().unwrap_or_default();
    rep.eq(
        &format!("{w}: PodSandboxStatus reports one IPv4 address ({ip})"),
        (1, true),
        (pod.ips.len(), ip.starts_with("10.77.0.")),
    );
    rep.check(
        &format!("{w}: server up on the pod IP"),
        wait_serving(&ip, 80).await,
    );
    let gw = rep
        .check(
            &format!("{w}: libcni cache holds the result with a gateway"),
            cached_gateways(network, &pod.id),
        )
        .and_then(|g| g.first().cloned())
        .unwrap_or_default();
    for (proto, cport, hport) in [("tcp", 80, 8080), ("udp", 53, 8053)] {
        expect(rep, w, "hostport", proto, &hostport(&ip, cport));
        expect(rep, w, "hostport", proto, &hostport("127.0.0.1", hport));
        expect(rep, w, "hostport", proto, &hostport(&gw, hport));
        expect(rep, w, "hostport", proto, &hostport(node_ip, hport));
        for host in [gw.as_str(), node_ip] {
            let target = hostport(host, hport);
            expect_in_pod(cri, rep, &format!("{w} hairpin"), &pod, proto, &target).await;
        }
    }
    match node_state(cnikit) {
        Ok(st) => rep.eq(
            &format!("{w}: while running: 1 veth, 1 lease, nft elements tagged with the ID, 1 marker, 1 netns, cache entry {network}-ID-eth0"),
            (1, 1, true, 1, 1, true),
            (
                st.veths.len(),
                st.leases.len(),
                !st.nft_elements.is_empty() && st.nft_elements.iter().all(|e| e.contains(&pod.id)),
                st.markers.len(),
                st.netns.len(),
                st.cache.contains(&format!("{network}-{}-eth0", pod.id)),
            ),
        ),
        Err(e) => rep.fail(&format!("{w}: node state readable"), &e),
    }
    rep.check(&format!("{w}: StopPodSandbox"), cri.stop(&pod.id).await);
    nothing_left(rep, cnikit, &format!("{w}: after StopPodSandbox"));
    rep.check(
        &format!("{w}: StopPodSandbox again"),
        cri.stop(&pod.id).await,
    );
    rep.check(&format!("{w}: RemovePodSandbox"), cri.remove(&pod.id).await);
    nothing_left(rep, cnikit, &format!("{w}: after RemovePodSandbox"));
}

/// `n` pods started concurrently: all up, distinct addresses, every mapping reaches its pod;
/// stopped and removed concurrently, nothing left.
pub async fn parallel_pods(cri: &Cri, rep: &mut Report, n: u16, cnikit: &str) {
    let w = format!("{n} parallel pods");
    let mut set = JoinSet::new();
    for i in 0..n {
        let (cri, s) = (
            cri.clone(),
            spec(
                &format!("par-{i}"),
                &[(Protocol::Tcp, 80, 9000 + i), (Protocol::Udp, 53, 9100 + i)],
            ),
        );
        set.spawn(async move { (i, cri.run_pod(&s).await) });
    }
    let (mut pods, mut errors) = (Vec::new(), Vec::new());
    while let Some(r) = set.join_next().await {
        match r {
            Ok((i, Ok(p))) => pods.push((i, p)),
            Ok((i, Err(e))) => errors.push(format!("par-{i}: {e}")),
            Err(e) => errors.push(e.to_string()),
        }
    }
    pods.sort_by_key(|(i, _)| *i);
    if errors.is_empty() {
        rep.ok(&format!("{w}: all started"));
    } else {
        rep.fail(&format!("{w}: all started"), &errors.join("\n"));
    }
    let ips: BTreeSet<&String> = pods.iter().filter_map(|(_, p)| p.ips.first()).collect();
    rep.eq(&format!("{w}: distinct addresses"), pods.len(), ips.len());
    let mut bad = Vec::new();
    for (i, p) in &pods {
        if let Err(e) = wait_serving(&p.ips[0], 80).await {
            bad.push(format!("{}: server: {e}", p.name));
            continue;
        }
        for (proto, hport) in [("tcp", 9000 + i), ("udp", 9100 + i)] {
            match probe(proto, &hostport("127.0.0.1", hport)) {
                Ok(got) if got == p.name => {}
                r => bad.push(format!(
                    "{proto} 127.0.0.1:{hport} → {r:?}, want {}",
                    p.name
                )),
            }
        }
    }
    if bad.is_empty() {
        rep.ok(&format!(
            "{w}: every tcp and udp hostPort mapping reaches its own pod"
        ));
    } else {
        rep.fail(
            &format!("{w}: every tcp and udp hostPort mapping reaches its own pod"),
            &bad.join("\n"),
        );
    }
    if let Ok(st) = node_state(cnikit) {
        rep.eq(
            &format!("{w}: one lease and one host veth per pod"),
            (pods.len(), pods.len()),
            (st.leases.len(), st.veths.len()),
        );
    }
    let mut set = JoinSet::new();
    for (_, p) in pods {
        let cri = cri.clone();
        set.spawn(async move {
            let r = match cri.stop(&p.id).await {
                Ok(()) => cri.remove(&p.id).await,
                Err(e) => Err(e),
            };
            r.map_err(|e| format!("{}: {e}", p.name))
        });
    }
    let mut errors = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if errors.is_empty() {
        rep.ok(&format!("{w}: all stopped and removed in parallel"));
    } else {
        rep.fail(
            &format!("{w}: all stopped and removed in parallel"),
            &errors.join("\n"),
        );
    }
    let names: Vec<String> = (0..n).map(|i| format!("par-{i}")).collect();
    remove_all(cri, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    nothing_left(rep, cnikit, &w);
}

/// A pod whose hostPort is held by another pod: portmap's error 105 reaches the CRI caller,
/// the holder keeps its mapping, the failed pod is removable and nothing is left.
pub async fn conflicting_pod(cri: &Cri, rep: &mut Report, cnikit: &str) {
    let w = "hostPort conflict";
    let own = spec("holder", &[(Protocol::Tcp, 80, 8090)]);
    let Some(holder) = rep.check(&format!("{w}: the holder starts"), cri.run_pod(&own).await)
    else {
        return remove_all(cri, &["holder"]).await;
    };
    let _ = wait_serving(&holder.ips[0], 80).await;
    let dup = spec("intruder", &[(Protocol::Tcp, 80, 8090)]);
    let mut failed_id = String::new();
    match cri.run_sandbox(&dup).await {
        Ok(id) => rep.fail(
            &format!("{w}: RunPodSandbox fails"),
            &format!("succeeded: {id}"),
        ),
        Err(e) => {
            rep.ok(&format!("{w}: RunPodSandbox fails"));
            rep.note(&format!("the CRI caller got: {e}"));
            let named = e.contains("portmap") && e.contains("8090") && e.contains(&holder.id);
            rep.eq(
                &format!("{w}: the error names portmap, the port and the holder"),
                true,
                named,
            );
            // `failed to setup network for sandbox "ID"`: the sandbox kubelet never got an ID for
            failed_id = e.split('"').nth(1).unwrap_or_default().to_string();
        }
    }
    expect(rep, w, "holder", "tcp", "127.0.0.1:8090");
    let listed = cri.find("intruder").await.unwrap_or_default();
    rep.note(&format!(
        "sandboxes named intruder after the failed RunPodSandbox: {listed:?}"
    ));
    let mut ids: Vec<String> = listed.into_iter().map(|(id, _)| id).collect();
    if !failed_id.is_empty() && !ids.contains(&failed_id) {
        ids.push(failed_id.clone());
    }
    for id in &ids {
        // NotFound: containerd already removed the sandbox of the failed RunPodSandbox
        let gone = |r: Result<(), String>| match r {
            Err(e) if e.contains("NotFound") || e.contains("not found") => {
                rep.note(&format!("NotFound: {e}"));
                Ok(())
            }
            r => r,
        };
        let short = &id[..12.min(id.len())];
        let stopped = gone(cri.stop(id).await);
        let removed = gone(cri.remove(id).await);
        rep.check(
            &format!("{w}: StopPodSandbox of the failed pod {short} succeeds (or NotFound)"),
            stopped,
        );
        rep.check(
            &format!("{w}: RemovePodSandbox of the failed pod {short} succeeds (or NotFound)"),
            removed,
        );
    }
    rep.eq(
        &format!("{w}: the failed pod is gone from ListPodSandbox"),
        0,
        cri.find("intruder").await.map(|v| v.len()).unwrap_or(99),
    );
    match node_state(cnikit) {
        Ok(st) => {
            rep.eq(
                &format!("{w}: only the holder's lease, veth and netns remain"),
                (1, 1, 1),
                (st.leases.len(), st.veths.len(), st.netns.len()),
            );
            let all = format!("{st:?}");
            let traces = !failed_id.is_empty() && all.contains(&failed_id);
            rep.eq(
                &format!("{w}: no lease, nft element, marker or cache entry names the failed pod"),
                false,
                traces,
            );
            if traces {
                rep.note(&all);
            }
        }
        Err(e) => rep.fail(&format!("{w}: node state readable"), &e),
    }
    expect(
        rep,
        &format!("{w}, after the failed pod's cleanup"),
        "holder",
        "tcp",
        "127.0.0.1:8090",
    );
    stop_remove(cri, rep, &format!("{w}: the holder"), &holder.id).await;
    remove_all(cri, &["holder", "intruder"]).await;
    nothing_left(rep, cnikit, w);
}

/// The dual-stack example conflist: v4 and v6 addresses, ping and traffic on both, hostPort.
pub async fn dualstack_pod(cri: &Cri, rep: &mut Report, network: &str, cnikit: &str) {
    let w = "dual-stack example";
    let s = spec(
        "dualstack",
        &[(Protocol::Tcp, 80, 8180), (Protocol::Udp, 53, 8153)],
    );
    let Some(pod) = rep.check(&format!("{w}: pod starts"), cri.run_pod(&s).await) else {
        return remove_all(cri, &["dualstack"]).await;
    };
    let v4: Vec<&String> = pod.ips.iter().filter(|i| !i.contains(':')).collect();
    let v6: Vec<&String> = pod.ips.iter().filter(|i| i.contains(':')).collect();
    rep.eq(
        &format!("{w}: one IPv4 and one IPv6 address ({:?})", pod.ips),
        (1, 1),
        (v4.len(), v6.len()),
    );
    let gws = cached_gateways(network, &pod.id).unwrap_or_default();
    if let Some(ip) = v4.first() {
        rep.check(
            &format!("{w}: server up on {ip}"),
            wait_serving(ip, 80).await,
        );
        rep.check(&format!("{w}: ping {ip}"), ping(ip));
    }
    for ip in v4.iter().chain(v6.iter()) {
        if ip.contains(':') {
            rep.check(&format!("{w}: ping6 {ip}"), ping(ip));
        }
        expect(rep, w, "dualstack", "tcp", &hostport(ip, 80));
        expect(rep, w, "dualstack", "udp", &hostport(ip, 53));
    }
    expect(rep, w, "dualstack", "tcp", "127.0.0.1:8180");
    expect(rep, w, "dualstack", "udp", "127.0.0.1:8153");
    for gw in &gws {
        expect(rep, w, "dualstack", "tcp", &hostport(gw, 8180));
        let ping = if gw.contains(':') { "ping6" } else { "ping" };
        let what = format!("{w}: {ping} {gw} (gateway) from inside the pod");
        match cri
            .exec(&pod.container, &[ping, "-c", "1", "-W", "2", gw])
            .await
        {
            Ok((0, _, _)) => rep.ok(&what),
            Ok((c, o, e)) => rep.fail(&what, &format!("exit {c}: {o} {e}")),
            Err(e) => rep.fail(&what, &e),
        }
    }
    rep.eq(
        &format!("{w}: the cached result has a v4 and a v6 gateway"),
        2,
        gws.len(),
    );
    stop_remove(cri, rep, w, &pod.id).await;
    nothing_left(rep, cnikit, w);
}
