//! bandwidth chained after bridge, on the kernel: the same qdiscs, filter
//! and ifb as Debian's reference plugin makes (side by side), shaping that
//! really slows a TCP transfer down in both directions, DEL (with and
//! without the netns), CHECK, GC, the capability and its Go-named keys, and
//! a failed ADD that leaves nothing. Interfaces without a host end
//! (macvlan, tap, host-device, …) shaped inside their pod: `in_pod`; rates
//! measured with iperf3: `rates`.

mod in_pod;
mod lifecycle;
mod rates;

use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

/// A bridge of a new network over in-process ipamd (v4): name and config.
pub(super) fn network(env: &TestEnv) -> (String, Value) {
    let net = format!("bw-{}", short_hash());
    let br = env.link_name("bwbr");
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().v4_ranges());
    let conf = json!({
        "cniVersion": "1.0.0", "name": net, "type": "bridge", "bridge": br,
        "isGateway": true, "ipam": ipam,
    });
    (net, conf)
}

/// A pod on the bridge of a new network (see [`network`]): the network's name, the pod
/// and the host end of its veth.
pub(super) fn pod_on_network(env: &TestEnv) -> (String, Pod<'_>, String) {
    let (net, bridge) = network(env);
    let pod = env.pod("bridge", &bridge);
    let veth = host_veth(&pod.result);
    (net, pod, veth)
}

/// bandwidth of `net` with `keys`, chained after `prev`.
pub(super) fn bw_conf(net: &str, keys: Value, prev: &Value) -> Value {
    merged(
        json!({"cniVersion": "1.0.0", "name": net, "type": "bandwidth", "prevResult": prev}),
        keys,
    )
}

/// 8 Mbit/s with 800 kbit bursts both ways.
pub(super) fn both_ways() -> Value {
    json!({
        "ingressRate": 8_000_000, "ingressBurst": 800_000,
        "egressRate": 8_000_000, "egressBurst": 800_000,
    })
}

/// The host end of a bridge result's veth.
pub(super) fn host_veth(result: &Value) -> String {
    result["interfaces"][1]["name"]
        .as_str()
        .expect("bridge result lists the host veth second")
        .to_string()
}

/// `tc ARGS`, which must succeed; its stdout.
pub(super) fn tc_ok(args: &[&str]) -> String {
    tc_ok_in(None, args)
}

/// `tc ARGS` in netns `ns` (None: the test host), which must succeed; its stdout.
pub(super) fn tc_ok_in(ns: Option<&str>, args: &[&str]) -> String {
    let mut full = ns.map_or(vec![], |n| vec!["-n", n]);
    full.extend_from_slice(args);
    let (ok, out, err) = sh("tc", &full);
    assert!(ok, "tc {full:?}: {err}");
    out
}

/// `tc -j ARGS` in netns `ns` (None: the test host), parsed (an empty
/// answer is an empty list).
pub(super) fn tc_in(ns: Option<&str>, args: &[&str]) -> Vec<Value> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let out = tc_ok_in(ns, &full);
    if out.trim().is_empty() {
        return Vec::new();
    }
    match serde_json::from_str(&out) {
        Ok(Value::Array(a)) => a,
        other => panic!("tc -j {args:?} printed {other:?}"),
    }
}

/// The qdiscs of `dev` other than the kernel's default, without counters.
pub(super) fn qdiscs(dev: &str) -> Vec<Value> {
    qdiscs_in(None, dev)
}

/// The qdiscs of `dev` in netns `ns` other than the kernel's defaults
/// (noqueue; a tap's fq_codel or pfifo_fast has no handle).
pub(super) fn qdiscs_in(ns: Option<&str>, dev: &str) -> Vec<Value> {
    tc_in(ns, &["qdisc", "show", "dev", dev])
        .into_iter()
        .filter(|q| q["kind"] != "noqueue" && q["handle"] != "0:")
        .collect()
}

/// The filters under the ingress qdisc of `dev` that carry options.
pub(super) fn ingress_filters(dev: &str) -> Vec<Value> {
    ingress_filters_in(None, dev)
}

/// The filters under the ingress qdisc of `dev` in netns `ns` that carry options.
pub(super) fn ingress_filters_in(ns: Option<&str>, dev: &str) -> Vec<Value> {
    tc_in(ns, &["filter", "show", "dev", dev, "ingress"])
        .into_iter()
        .filter(|f| f["options"]["actions"].is_array())
        .collect()
}

/// The ifb the reference (and we) name after network and container ID.
pub(super) fn ifb_of(result: &Value) -> String {
    let ifb = result["interfaces"]
        .as_array()
        .and_then(|i| i.last())
        .expect("interfaces");
    assert!(ifb["sandbox"].is_null(), "{ifb}");
    ifb["name"].as_str().expect("ifb name").to_string()
}

/// Proves: for the same configuration, our ADD gives the same result shape
/// (prevResult plus the ifb with its MAC), the same root TBF on the host
/// veth (rate, burst, latency), the same ingress qdisc, the same u32 filter
/// (pref 1, protocol all, flowid 1:1, match-all, mirred egress redirect to
/// the ifb, stolen), and an ifb with the same MTU, queue length, state and
/// TBF as Debian's reference plugin. The reference adds a second mirred
/// action (`pass`) after the `stolen` one, which never runs; we leave it out.
#[test]
fn bandwidth_makes_what_the_reference_makes() {
    let env = TestEnv::new("bw-reference");
    let (net, bridge) = network(&env);
    let [a, b] = env.pair("bridge", &bridge);
    let (res_a, res_b) = (a.add(), b.add());
    let theirs = env
        .ref_plugin("bandwidth")
        .attach("ADD", &a.id, &a.ns, "eth0")
        .conf(&bw_conf(&net, both_ways(), &res_a))
        .run()
        .result();
    let ours = b
        .chained("bandwidth", &bw_conf(&net, both_ways(), &res_b))
        .add();
    let (ifb_t, ifb_o) = (ifb_of(&theirs), ifb_of(&ours));
    assert_eq!(ifb_t, ifb_name(&net, &a.id));
    assert_eq!(ifb_o, ifb_name(&net, &b.id));
    for (r, prev) in [(&theirs, &res_a), (&ours, &res_b)] {
        let n = prev["interfaces"].as_array().unwrap().len();
        assert_eq!(r["interfaces"].as_array().unwrap().len(), n + 1, "{r}");
        assert_eq!(r["ips"], prev["ips"]);
        let mac = r["interfaces"][n]["mac"].as_str().unwrap_or_default();
        assert_eq!(mac.len(), 17, "the ifb's MAC is reported: {r}");
    }
    let (veth_t, veth_o) = (host_veth(&res_a), host_veth(&res_b));
    assert_eq!(qdiscs(&veth_t), qdiscs(&veth_o), "host veth qdiscs differ");
    assert_eq!(qdiscs(&ifb_t), qdiscs(&ifb_o), "ifb qdiscs differ");
    let tbf = &qdiscs(&veth_o)[0];
    assert_eq!(tbf["kind"], "tbf");
    assert_eq!(tbf["options"]["rate"], 1_000_000);
    assert_eq!(tbf["options"]["burst"], 100_000);
    assert_eq!(tbf["options"]["lat"], 25_000);

    let (ft, fo) = (ingress_filters(&veth_t), ingress_filters(&veth_o));
    assert_eq!((ft.len(), fo.len()), (1, 1), "{ft:?} {fo:?}");
    let first_action = |f: &Value, ifb: &str| {
        let mut a = f["options"]["actions"][0].clone();
        assert_eq!(a["to_dev"], ifb, "{f}");
        for k in ["to_dev", "index", "ref", "bind"] {
            a.as_object_mut().unwrap().remove(k);
        }
        a
    };
    assert_eq!(first_action(&ft[0], &ifb_t), first_action(&fo[0], &ifb_o));
    assert_eq!(
        fo[0]["options"]["actions"][0]["control_action"]["type"],
        "stolen"
    );
    assert_eq!(fo[0]["options"]["actions"].as_array().unwrap().len(), 1);
    for k in ["pref", "protocol", "kind", "parent"] {
        assert_eq!(ft[0][k], fo[0][k], "filter {k}");
    }
    for k in ["flowid", "match", "ht_divisor"] {
        assert_eq!(ft[0]["options"][k], fo[0]["options"][k], "filter {k}");
    }
    let ifb_link = |name: &str| {
        let l = link(None, name).unwrap_or_else(|| panic!("no link {name}"));
        (
            l["mtu"].clone(),
            l["txqlen"].clone(),
            l["operstate"].clone(),
            link_kind(&l).map(str::to_string),
            has_flag(&l, "UP"),
        )
    };
    assert_eq!(ifb_link(&ifb_t), ifb_link(&ifb_o));

    // CHECK agrees with both; DEL removes each one's ifb (ours also the qdiscs).
    let check_t = env
        .ref_plugin("bandwidth")
        .attach("CHECK", &a.id, &a.ns, "eth0")
        .conf(&bw_conf(&net, both_ways(), &theirs))
        .run();
    check_t.ok_silent();
    b.chained("bandwidth", &bw_conf(&net, both_ways(), &res_b))
        .check(&ours);
    b.chained("bandwidth", &bw_conf(&net, both_ways(), &res_b))
        .del();
    assert!(link(None, &ifb_o).is_none(), "our DEL left {ifb_o}");
    assert!(qdiscs(&veth_o).is_empty(), "{:?}", qdiscs(&veth_o));
    env.ref_plugin("bandwidth")
        .attach("DEL", &a.id, &a.ns, "eth0")
        .conf(&bw_conf(&net, both_ways(), &theirs))
        .run()
        .ok_silent();
    assert!(link(None, &ifb_t).is_none());
    for pod in [&a, &b] {
        pod.del();
    }
}

/// Fails each kernel request of `bw`'s ADD in turn (fault injection) until
/// one succeeds: each failed ADD must report the injected failure and pass
/// `leaves_nothing(n)`, and the runtime's DEL after it must succeed. There
/// must be more than 8 failure points (`what` names them on stderr).
#[cfg(feature = "fault-injection")]
pub(super) fn walk_add_failures(bw: &Attachment, what: &str, leaves_nothing: impl Fn(usize)) {
    for n in 1..100 {
        let out = bw
            .call("ADD")
            .env("CNIKIT_FAULT_NETLINK", &n.to_string())
            .run();
        if out.success() {
            assert!(n > 8, "only {} failure points", n - 1);
            eprintln!("{what}: {} failure points, each failed once", n - 1);
            bw.del();
            return;
        }
        let e = out.err();
        assert!(e.msg.contains("injected failure"), "at {n}: {e:?}");
        leaves_nothing(n);
        bw.del();
    }
    panic!("{what} still failing after 100 injected failures");
}

/// Seconds a transfer of `bytes` took, as f64.
fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Proves: shaping limits throughput. At 4 Mbit/s (500 kB/s, 50 kB bursts)
/// 1 MB takes about 2 s each way (host → pod through the veth's TBF, pod →
/// host through the ifb's); we only require more than 1 s, and that the
/// same transfer without bandwidth took well under that. Speed is not
/// asserted tightly.
#[test]
fn shaping_limits_throughput_both_ways() {
    let env = TestEnv::new("bw-throughput");
    let (net, pod, _) = pod_on_network(&env);
    let pod_ip = first_addr(&pod.result, false);
    let gw = pod.result["ips"][0]["gateway"]
        .as_str()
        .unwrap()
        .to_string();
    let ns = Some(pod.ns.path.as_str());
    const BYTES: usize = 1_000_000;
    let port = host_port();
    let to_pod = |p: u16| timed_transfer(None, ns, &sock(&pod_ip, p), BYTES);
    let from_pod = |p: u16| timed_transfer(ns, None, &sock(&gw, p), BYTES);
    let (fast_in, fast_out) = (to_pod(port), from_pod(port));
    let limits = json!({
        "ingressRate": 4_000_000, "ingressBurst": 400_000,
        "egressRate": 4_000_000, "egressBurst": 400_000,
    });
    let bw = pod.chained("bandwidth", &bw_conf(&net, limits.clone(), &pod.result));
    let result = bw.add();
    let (slow_in, slow_out) = (to_pod(port + 1), from_pod(port + 1));
    eprintln!(
        "1 MB: unshaped {:.3}s in / {:.3}s out; at 4 Mbit/s {:.3}s in / {:.3}s out",
        secs(fast_in),
        secs(fast_out),
        secs(slow_in),
        secs(slow_out)
    );
    for (what, slow, fast) in [
        ("to the pod", slow_in, fast_in),
        ("from the pod", slow_out, fast_out),
    ] {
        assert!(
            secs(slow) > 1.0,
            "{what}: 1 MB at 4 Mbit/s took only {slow:?}"
        );
        assert!(secs(slow) < 20.0, "{what}: 1 MB at 4 Mbit/s took {slow:?}");
        assert!(
            secs(fast) < secs(slow) / 2.0,
            "{what}: unshaped {fast:?} vs {slow:?}"
        );
    }
    bw.call("DEL")
        .conf(&bw_conf(&net, limits, &result))
        .run()
        .ok_silent();
    let after = to_pod(port + 2);
    assert!(
        secs(after) < 1.0,
        "after DEL the pod is still shaped: {after:?}"
    );
    pod.del();
}

/// The reference's ifb name: "bwp" + 12 hex digits of SHA-512(network + ID).
pub(super) fn ifb_name(net: &str, id: &str) -> String {
    use sha2::{Digest, Sha512};
    let d = Sha512::digest(format!("{net}{id}").as_bytes());
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("bwp{}", &hex[..12])
}
