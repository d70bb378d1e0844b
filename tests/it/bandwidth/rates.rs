//! Rates measured with real traffic: iperf3 between a macvlan pod shaped in
//! its netns and a server namespace behind the macvlan's master, both ways,
//! at two rates; the achieved rate must be within ±10 % of the configured
//! one. (ipvlan, which this kernel lacks, is measured the same way in the
//! VM suite: tests/vm/rates.sh.)

use super::in_pod::{macvlan, pod_ifb, pod_tbf_rates};
use super::*;
use std::process::{Command, Stdio};

/// The rates measured, in bit/s.
const RATES: [u64; 2] = [20_000_000, 80_000_000];
/// Seconds measured per run, after one second left out (slow start and the
/// bucket's initial burst).
const SECONDS: &str = "2";

/// A token bucket of `rate` both ways, its burst 20 ms at that rate (which
/// adds under 1 % to a 2 s average).
fn limits(rate: u64) -> Value {
    let burst = rate / 50;
    json!({
        "ingressRate": rate, "ingressBurst": burst,
        "egressRate": rate, "egressBurst": burst,
    })
}

/// The bit/s the receiver saw in one iperf3 run from netns `client` to a
/// one-off server in netns `server` at `addr` (`reverse`: the server sends).
fn iperf3(client: &str, server: &str, addr: &str, reverse: bool) -> f64 {
    let port = host_port().to_string();
    let mut srv = Command::new("ip")
        .args(["netns", "exec", server, "iperf3", "-s", "-1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 -s (apt install iperf3)");
    let mut args = vec![
        "netns", "exec", client, "iperf3", "-c", addr, "-p", &port, "-t", SECONDS, "-O", "1", "-J",
    ];
    if reverse {
        args.push("-R");
    }
    let mut last = String::new();
    // The server listens a moment after it starts.
    for _ in 0..50 {
        let out = Command::new("ip").args(&args).output().expect("iperf3 -c");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if let Some(bps) = report["end"]["sum_received"]["bits_per_second"].as_f64() {
            let _ = srv.wait();
            return bps;
        }
        last = String::from_utf8_lossy(&out.stdout).into_owned();
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = srv.kill();
    let _ = srv.wait();
    panic!("iperf3 from {client} to {addr} never ran: {last}");
}

/// Up to three measurements of a shaped rate, until one is within ±10 % of
/// `rate`: on a loaded machine iperf3's receiver, scheduled late, can count
/// a backlog over a shortened interval (seen: +19 % once in a full suite
/// run), while a shaper at a wrong rate misses every time.
fn rate_within_tenth(rate: u64, mut measure: impl FnMut() -> f64) -> Vec<f64> {
    let mut got = Vec::new();
    while got.len() < 3 && !got.last().is_some_and(|&bps| in_tenth(bps, rate)) {
        let bps = measure();
        eprintln!(
            "configured {} Mbit/s, achieved {:.2} Mbit/s ({:+.1} %)",
            rate / 1_000_000,
            bps / 1e6,
            (bps / rate as f64 - 1.0) * 100.0
        );
        got.push(bps);
    }
    got
}

fn in_tenth(bps: f64, rate: u64) -> bool {
    (0.9..=1.1).contains(&(bps / rate as f64))
}

/// Proves: a macvlan pod shaped in its netns gets the configured rate,
/// within ±10 %, both ways (iperf3 from the pod to a server behind the
/// master, and from that server to the pod), at 20 and 80 Mbit/s; the
/// TBFs read back from the kernel (`tc -j qdisc show` in the pod) have the
/// configured rates; unshaped, the same path is far faster.
#[test]
fn macvlan_rates_measured_with_iperf3() {
    let env = TestEnv::new("bw-rates-macvlan");
    let nets = env.subnets();
    let server = env.netns();
    let (master, uplink) = env.veth_pair();
    ip(&["link", "set", &uplink, "netns", &server.name]);
    let srv_addr = nets.v4_addr(2);
    let s = server.name.as_str();
    ip(&[
        "-n",
        s,
        "addr",
        "add",
        &format!("{srv_addr}/24"),
        "dev",
        &uplink,
    ]);
    ip(&["-n", s, "link", "set", &uplink, "up"]);
    let net = format!("bwr-{}", short_hash());
    let ipam =
        json!({"type": "static", "addresses": [{"address": format!("{}/24", nets.v4_addr(5))}]});
    let kind = macvlan(&net, &master, Some(ipam));
    let pod = env.pod(kind.plugin, &kind.conf);
    let p = pod.ns.name.as_str();
    let unshaped = iperf3(p, s, &srv_addr, false);
    eprintln!("macvlan unshaped: {:.1} Mbit/s", unshaped / 1e6);
    for rate in RATES {
        let bw = pod.chained("bandwidth", &bw_conf(&net, limits(rate), &pod.result));
        let result = bw.add();
        let ifb = pod_ifb(&result, &pod.ns);
        let bytes = json!(rate / 8);
        assert_eq!(pod_tbf_rates(&pod.ns, &ifb), (bytes.clone(), bytes));
        for (dir, reverse) in [("egress", false), ("ingress", true)] {
            let got = rate_within_tenth(rate, || iperf3(p, s, &srv_addr, reverse));
            assert!(
                got.iter().any(|&bps| in_tenth(bps, rate)),
                "macvlan {dir} at {rate} bit/s: {got:.0?} bit/s"
            );
        }
        assert!(unshaped > 2.0 * rate as f64, "unshaped only {unshaped}");
        bw.call("DEL")
            .conf(&with_prev(&bw.conf, &result))
            .run()
            .ok_silent();
    }
    pod.del();
}
