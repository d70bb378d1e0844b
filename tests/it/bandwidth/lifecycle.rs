//! DEL (with and without the netns), CHECK, the capability, failed ADDs,
//! GC and the fault walk.

use super::*;

/// Proves: DEL removes the ifb and the host veth's qdiscs, twice in a row;
/// without the netns (or with an empty CNI_NETNS) and without prevResult it
/// still removes the ifb, which it finds by name.
#[test]
fn del_removes_qdiscs_and_ifb_also_without_netns() {
    let env = TestEnv::new("bw-del");
    let (net, bridge) = network(&env);
    for way in [
        "with netns",
        "without netns",
        "empty netns",
        "netns deleted",
    ] {
        let pod = env.pod("bridge", &bridge);
        let conf = bw_conf(&net, both_ways(), &pod.result);
        let bw = pod.chained("bandwidth", &conf);
        let result = bw.add();
        let (ifb, veth) = (ifb_of(&result), host_veth(&pod.result));
        assert!(
            link(None, &ifb).is_some() && qdiscs(&veth).len() == 2,
            "{way}"
        );
        let mut bare = conf.clone();
        bare.as_object_mut().unwrap().remove("prevResult");
        let del = pod.chained("bandwidth", &bare);
        match way {
            "with netns" => {
                del.del_twice();
                assert!(qdiscs(&veth).is_empty(), "{way}: {:?}", qdiscs(&veth));
            }
            "without netns" => del.del_without_netns(),
            "empty netns" => del.del_with_empty_netns(),
            _ => {
                env.del_netns(&pod.ns);
                del.del();
            }
        }
        assert!(link(None, &ifb).is_none(), "{way}: {ifb} is left");
        pod.del();
    }
}

/// Proves: CHECK passes after ADD and fails (code 100, naming what) once the
/// TBF's rate was changed by hand, and once the ifb is gone.
#[test]
fn check_finds_changed_or_missing_shaping() {
    let env = TestEnv::new("bw-check");
    let (net, pod, veth) = pod_on_network(&env);
    let conf = bw_conf(&net, both_ways(), &pod.result);
    let bw = pod.chained("bandwidth", &conf);
    let result = bw.add();
    bw.check(&result);
    tc_ok(&[
        "qdisc", "change", "dev", &veth, "root", "handle", "1:", "tbf", "rate", "1mbit", "burst",
        "100000", "latency", "25ms",
    ]);
    let o = bw.call("CHECK").conf(&with_prev(&conf, &result)).run();
    o.expect_err(100, &["rate", &veth]);
    bw.del();
    bw.add();
    ip(&["link", "del", &ifb_of(&result)]);
    let o = bw.call("CHECK").conf(&with_prev(&conf, &result)).run();
    o.expect_err(100, &[&ifb_of(&result)]);
    bw.del();
    pod.del();
}

/// Proves: the `bandwidth` capability works with the Go-named keys a
/// runtime may send (`IngressRate`), and the configuration's own keys
/// replace the capability as a whole (here: egress only, no ingress).
#[test]
fn capability_with_go_keys_and_config_precedence() {
    let env = TestEnv::new("bw-capability");
    let (net, pod, veth) = pod_on_network(&env);
    let cap = json!({"runtimeConfig": {"bandwidth": {"IngressRate": 16_000_000, "IngressBurst": 1_600_000}}});
    let bw = pod.chained("bandwidth", &bw_conf(&net, cap.clone(), &pod.result));
    let result = bw.add();
    let q = qdiscs(&veth);
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["options"]["rate"], 2_000_000);
    assert_eq!(
        result["interfaces"], pod.result["interfaces"],
        "no ifb without egress"
    );
    bw.del();
    assert!(qdiscs(&veth).is_empty());

    let both = merged(
        cap,
        json!({"egressRate": 8_000_000, "egressBurst": 800_000}),
    );
    let bw = pod.chained("bandwidth", &bw_conf(&net, both, &pod.result));
    let result = bw.add();
    let kinds: Vec<Value> = qdiscs(&veth).iter().map(|q| q["kind"].clone()).collect();
    assert_eq!(
        kinds,
        vec![json!("ingress")],
        "config keys replace the capability"
    );
    assert_eq!(qdiscs(&ifb_of(&result))[0]["options"]["rate"], 1_000_000);
    bw.del();
    pod.del();
}

/// Proves: the bursts the runtimes send for the Kubernetes bandwidth
/// annotations (containerd `IngressBurst` = MaxUint32 bits with Go-named
/// keys, CRI-O MaxUint32 * 8 - 1 bits with ocicni's; the unset direction as
/// zeros) at 10 Mbit/s, which used to be refused with code 7, are shaped:
/// a TBF at 1.25 MB/s on the host veth (and on the ifb when both ways are
/// set), with a bucket held at the kernel's 32-bit maximum. CHECK reads the
/// same numbers back from the kernel, and DEL removes it all.
#[test]
fn runtime_bursts_for_the_kubernetes_annotations_shape() {
    let env = TestEnv::new("bw-runtime-bursts");
    let (net, pod, veth) = pod_on_network(&env);
    let containerd = json!({"IngressRate": 10_000_000u64, "IngressBurst": 4_294_967_295u64,
        "EgressRate": 0, "EgressBurst": 0});
    let crio = json!({"ingressRate": 10_000_000u64, "ingressBurst": 34_359_738_359u64,
        "egressRate": 10_000_000u64, "egressBurst": 34_359_738_359u64});
    for (runtime, cap, ifb) in [("containerd", containerd, false), ("CRI-O", crio, true)] {
        let keys = json!({"runtimeConfig": {"bandwidth": cap}});
        let conf = bw_conf(&net, keys, &pod.result);
        let bw = pod.chained("bandwidth", &conf);
        let result = bw.add();
        let mut shaped = vec![veth.clone()];
        if ifb {
            shaped.push(ifb_of(&result));
        }
        for dev in &shaped {
            let q = qdiscs(dev);
            let tbf = q.iter().find(|q| q["kind"] == "tbf");
            let tbf = tbf.unwrap_or_else(|| panic!("{runtime}: no TBF on {dev}: {q:?}"));
            assert_eq!(tbf["options"]["rate"], 1_250_000, "{runtime}: {tbf}");
        }
        bw.check(&result);
        bw.del();
        assert!(qdiscs(&veth).is_empty(), "{runtime}: {:?}", qdiscs(&veth));
    }
    pod.del();
}

/// Proves: an ADD that fails half-way (the host veth already has a root
/// qdisc, so the ingress TBF cannot go there after the egress side was
/// made) reports code 100 naming the veth and leaves nothing: no ifb, no
/// ingress qdisc, the foreign root qdisc untouched. Also: no prevResult and
/// a rate without a burst are code 7, and no limits pass prevResult through.
#[test]
fn a_failed_add_leaves_nothing() {
    let env = TestEnv::new("bw-failed-add");
    let (net, pod, veth) = pod_on_network(&env);
    tc_ok(&[
        "qdisc", "add", "dev", &veth, "root", "handle", "2:", "pfifo",
    ]);
    let bw = pod.chained("bandwidth", &bw_conf(&net, both_ways(), &pod.result));
    bw.try_add().expect_err(100, &[&veth, "tbf"]);
    let kinds: Vec<Value> = qdiscs(&veth).iter().map(|q| q["kind"].clone()).collect();
    assert_eq!(kinds, vec![json!("pfifo")]);
    let ifb = ifb_name(&net, &pod.id);
    assert!(link(None, &ifb).is_none(), "the failed ADD left {ifb}");
    bw.del();

    let mut no_prev = bw_conf(&net, both_ways(), &Value::Null);
    no_prev.as_object_mut().unwrap().remove("prevResult");
    pod.chained("bandwidth", &no_prev)
        .try_add()
        .expect_err(7, &["prevResult"]);
    let half = bw_conf(&net, json!({"egressRate": 1000}), &pod.result);
    pod.chained("bandwidth", &half)
        .try_add()
        .expect_err(7, &["egressBurst"]);
    let none = bw_conf(&net, json!({}), &pod.result);
    assert_eq!(pod.chained("bandwidth", &none).add(), pod.result);
    pod.del();
}

/// Proves: GC removes the ifbs of this network's containers that are not
/// in `cni.dev/valid-attachments`, and keeps the valid ones and other
/// networks' ifbs.
#[test]
fn gc_removes_ifbs_of_gone_containers() {
    let env = TestEnv::new("bw-gc");
    let (net, bridge) = network(&env);
    let (other_net, other_bridge) = network(&env);
    let pods = [
        env.pod("bridge", &bridge),
        env.pod("bridge", &bridge),
        env.pod("bridge", &other_bridge),
    ];
    let ifbs: Vec<String> = pods
        .iter()
        .zip([&net, &net, &other_net])
        .map(|(p, n)| {
            let conf = merged(
                bw_conf(n, both_ways(), &p.result),
                json!({"cniVersion": "1.1.0"}),
            );
            ifb_of(&p.chained("bandwidth", &conf).add())
        })
        .collect();
    let gc = json!({
        "cniVersion": "1.1.0", "name": net, "type": "bandwidth",
        "cni.dev/valid-attachments": [{"containerID": pods[0].id, "ifname": "eth0"}],
    });
    env.plugin("bandwidth")
        .command("GC")
        .conf(&gc)
        .run()
        .ok_silent();
    let present: Vec<bool> = ifbs.iter().map(|i| link(None, i).is_some()).collect();
    assert_eq!(present, [true, false, true], "{ifbs:?}");
    for (p, n) in pods.iter().zip([&net, &net, &other_net]) {
        p.chained("bandwidth", &bw_conf(n, both_ways(), &p.result))
            .del();
        p.del();
    }
}

/// Proves: whichever kernel request of a bandwidth ADD fails (fault
/// injection walks every one), the ADD reports it and leaves nothing: no
/// ifb, no qdisc on the host veth; the runtime's DEL then succeeds.
#[cfg(feature = "fault-injection")]
#[test]
fn every_failure_point_of_an_add_leaves_nothing() {
    let env = TestEnv::new("bw-fault");
    let (net, pod, veth) = pod_on_network(&env);
    let ifb = ifb_name(&net, &pod.id);
    let bw = pod.chained("bandwidth", &bw_conf(&net, both_ways(), &pod.result));
    walk_add_failures(&bw, "bandwidth ADD", |n| {
        assert!(qdiscs(&veth).is_empty(), "at {n}: {:?}", qdiscs(&veth));
        assert!(link(None, &ifb).is_none(), "at {n}: {ifb} is left");
    });
    pod.del();
}

/// Proves: the ifb is named after network and container only (as the
/// reference names it), so a second shaped interface of the same container
/// on the same network is refused (100, naming the ifb and its owner)
/// instead of taking the first one's ifb; the second's DEL leaves the
/// first's ifb alone, and the first's DEL removes it.
#[test]
fn one_ifb_per_container_and_network() {
    let env = TestEnv::new("bw-two-ifaces");
    let (net, pod, _) = pod_on_network(&env);
    let second = pod.att.clone().with_ifname("eth1");
    let res2 = second.add();
    let egress = json!({"egressRate": 8_000_000, "egressBurst": 800_000});
    let first_bw = pod.chained("bandwidth", &bw_conf(&net, egress.clone(), &pod.result));
    let ifb = ifb_of(&first_bw.add());
    let second_bw = second.chained("bandwidth", &bw_conf(&net, egress.clone(), &res2));
    second_bw.try_add().expect_err(100, &[&ifb, "/eth0"]);
    assert!(link(None, &ifb).is_some(), "the refused ADD took {ifb}");
    second_bw.del();
    assert!(
        link(None, &ifb).is_some(),
        "the second DEL took the first's {ifb}"
    );
    first_bw.del();
    assert!(link(None, &ifb).is_none());
    second.del();
    pod.del();
}
