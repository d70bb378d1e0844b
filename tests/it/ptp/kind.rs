//! kind's network list as kindnetd writes it (`10-kindnet.conflist`, from
//! images/kindnetd/cmd/kindnetd/cni.go): ptp without ipMasq, host-local with
//! kind's routes and ranges, `mtu`, and portmap; run by `cnikit net` as
//! containerd runs it, with a hostPort mapping.

use super::*;

/// The container port the pod's servers listen on.
const CTR_TCP: u16 = 8080;

/// kindnetd's list (`tests/data/kindnet.conflist`, which the CRI suite runs too) filled
/// in for `pod_cidrs` (single or dual stack), an `mtu` and its default routes; only
/// `dataDir` (kind: `/run/cni-ipam-state`) is the test's own, so that the machine's /run
/// is never written.
fn kindnet(pod_cidrs: &[&str], mtu: u32, data_dir: &str) -> Value {
    let defaults: &[&str] = if pod_cidrs.len() > 1 {
        &["0.0.0.0/0", "::/0"]
    } else {
        &["0.0.0.0/0"]
    };
    let mut list: Value = serde_json::from_str(include_str!("../../data/kindnet.conflist"))
        .expect("tests/data/kindnet.conflist is JSON");
    let ptp = &mut list["plugins"][0];
    ptp["mtu"] = json!(mtu);
    ptp["ipam"]["dataDir"] = json!(data_dir);
    ptp["ipam"]["routes"] = defaults.iter().map(|d| json!({"dst": d})).collect();
    ptp["ipam"]["ranges"] = pod_cidrs.iter().map(|c| json!([{"subnet": c}])).collect();
    list
}

/// `cnikit net VERB kindnet NETNS [--cap-args CAPS]` on the conf dir `conf`.
fn net(
    env: &TestEnv,
    conf: &std::path::Path,
    verb: &str,
    ns: &Netns,
    caps: Option<&Value>,
) -> Outcome {
    let cni_path = std::env::join_paths([&env.bin, &env.ref_bin]).expect("CNI_PATH");
    let cache = env.tmp.join("cache");
    let mut args = vec![
        "net".to_string(),
        verb.to_string(),
        "kindnet".to_string(),
        ns.path.clone(),
        "--conf-dir".to_string(),
        conf.display().to_string(),
        "--cache-dir".to_string(),
        cache.display().to_string(),
        "--cni-path".to_string(),
        cni_path.to_string_lossy().into_owned(),
    ];
    if let Some(caps) = caps {
        args.extend(["--cap-args".to_string(), caps.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Call::cnikit(&args).run()
}

/// Two pods on kind's list: they reach each other, the node (the gateway
/// on their host ends and the node's own address) over every family the
/// list has, and a hostPort of one of them; DEL leaves nothing.
fn kind_cluster(dual: bool) {
    let env = TestEnv::new(&format!("ptp_kind_{dual}"));
    let nets = env.subnets();
    let cidrs: Vec<&str> = match dual {
        true => vec![&nets.v4, &nets.v6],
        false => vec![&nets.v4],
    };
    let data = env.dir("cni-ipam-state");
    let list = kindnet(&cidrs, 1460, &data.display().to_string());
    let conf = env.dir("net.d");
    let text = serde_json::to_vec_pretty(&list).unwrap();
    std::fs::write(conf.join("10-kindnet.conflist"), text).unwrap();

    let hp = host_port();
    let caps = json!({"portMappings": [
        {"hostPort": hp, "containerPort": CTR_TCP, "protocol": "tcp"}]});
    let (a, b) = (env.netns(), env.netns());
    let ra = net(&env, &conf, "add", &a, Some(&caps)).result();
    let rb = net(&env, &conf, "add", &b, None).result();
    assert_eq!(ra["cniVersion"], "0.3.1", "{ra}");
    let l = link(Some(&a.name), "eth0").expect("eth0");
    assert_eq!(l["mtu"], 1460, "kind's mtu on the pod end");
    assert_eq!(link(None, host_veth(&ra)).expect("host end")["mtu"], 1460);
    wait_ipv6_ready(None);

    let families: &[bool] = if dual { &[false, true] } else { &[false] };
    for &v6 in families {
        assert_ping(&a.name, &first_addr(&rb, v6));
        assert_ping(&b.name, &first_addr(&ra, v6));
        let gw = if v6 { nets.v6_addr(1) } else { nets.v4_addr(1) };
        assert_ping(&a.name, &gw);
        assert_ping(&a.name, if v6 { "2001:db8::10" } else { "192.0.2.10" });
    }

    // The hostPort: from the node (localhost and its own address) and from
    // the other pod, to the node's address.
    let _servers = Servers::start(&a.path, "A", CTR_TCP, 5353);
    let mut targets = vec![
        (None, "127.0.0.1"),
        (None, "192.0.2.10"),
        (Some(b.path.as_str()), "192.0.2.10"),
    ];
    if dual {
        targets.extend([
            (None, "2001:db8::10"),
            (Some(b.path.as_str()), "2001:db8::10"),
        ]);
    }
    for (from, host) in &targets {
        let got = eventually_answers(|| tcp_ask(*from, &sock(host, hp)));
        assert!(
            got.as_deref().is_some_and(|r| r.starts_with("A ")),
            "hostPort {hp} on {host} from {}: {got:?}",
            from.unwrap_or("the node")
        );
    }

    for (ns, r) in [(&a, &ra), (&b, &rb)] {
        net(&env, &conf, "del", ns, None).ok_silent();
        net(&env, &conf, "del", ns, None).ok_silent();
        assert!(link(None, host_veth(r)).is_none(), "DEL removes the veth");
    }
    for (from, host) in &targets {
        assert_eq!(tcp_ask(*from, &sock(host, hp)), None, "hostPort after DEL");
    }
    let state = json!({"type": "host-local", "dataDir": data});
    assert_eq!(
        env.lease_count(&state, "kindnet"),
        0,
        "host-local leases left"
    );
}

/// Proves: a single-stack (IPv4) kind cluster's list works on cnikit alone.
#[test]
fn kind_single_stack_list() {
    kind_cluster(false);
}

/// Proves: a dual-stack kind cluster's list works on cnikit alone.
#[test]
fn kind_dual_stack_list() {
    kind_cluster(true);
}
