//! The classic Multus case: a pod with eth0 on one bridge (its default route) and net1 on
//! another, sbr on net1. A client behind the test host pings net1's addresses: the
//! replies can only come back through net1 (IPv4: the eth0 bridge drops them by reverse
//! path filtering; IPv6: eth0 carries no IPv6), so they do only with sbr. A second pod
//! set up alike gets the reference sbr: the same rules and tables, addresses aside.

use super::*;

/// A namespace behind the test host on subnets of its own (the host end of its veth is
/// the gateway, .1): the namespace and its IPv4 and IPv6 addresses.
fn client(env: &TestEnv) -> (Netns, String, String) {
    let nets = env.subnets();
    let ns = env.netns();
    let host_end = env.link_name("sbc");
    let n = ns.name.as_str();
    ip(&[
        "link", "add", &host_end, "type", "veth", "peer", "name", "c0", "netns", n,
    ]);
    let (h4, h6) = (
        format!("{}/24", nets.v4_addr(1)),
        format!("{}/64", nets.v6_addr(1)),
    );
    ip(&["addr", "add", &h4, "dev", &host_end]);
    ip(&["-6", "addr", "add", &h6, "dev", &host_end, "nodad"]);
    ip(&["link", "set", &host_end, "up"]);
    let (c4, c6) = (
        format!("{}/24", nets.v4_addr(2)),
        format!("{}/64", nets.v6_addr(2)),
    );
    ip(&["-n", n, "addr", "add", &c4, "dev", "c0"]);
    ip(&["-n", n, "-6", "addr", "add", &c6, "dev", "c0", "nodad"]);
    ip(&["-n", n, "link", "set", "c0", "up"]);
    ip(&["-n", n, "route", "add", "default", "via", &nets.v4_addr(1)]);
    let gw6 = nets.v6_addr(1);
    ip(&["-n", n, "-6", "route", "add", "default", "via", &gw6]);
    (ns, nets.v4_addr(2), nets.v6_addr(2))
}

fn sysctl(key: &str, value: &str) {
    let path = format!("/proc/sys/{key}");
    std::fs::write(&path, value).unwrap_or_else(|e| panic!("write {path}: {e}"));
}

/// One echo, one second: for pings that must fail.
fn ping_once(ns: &Netns, addr: &str) -> bool {
    sh(
        "ip",
        &["netns", "exec", &ns.name, "ping", "-c1", "-W1", addr],
    )
    .0
}

/// A pod with eth0 on network `a` and net1 on network `b`.
struct MultiHomed<'e> {
    eth0: Attachment<'e>,
    eth0_result: Value,
    net1: Attachment<'e>,
    /// net1's result, sbr's prevResult.
    prev: Value,
}

fn multi_homed<'e>(env: &'e TestEnv, a: &Value, b: &Value) -> MultiHomed<'e> {
    let ns = env.netns();
    let id = cid("mh");
    let eth0 = env.attachment("bridge", &id, &ns, a);
    let eth0_result = eth0.add();
    let net1 = env.attachment("bridge", &id, &ns, b).with_ifname("net1");
    let prev = net1.add();
    wait_ipv6_ready(Some(&ns.name));
    MultiHomed {
        eth0,
        eth0_result,
        net1,
        prev,
    }
}

/// sbr on the pod's net1.
fn sbr<'e>(pod: &MultiHomed<'e>) -> Attachment<'e> {
    let conf = sbr_conf("1.0.0", &pod.prev, json!({}));
    pod.net1.chained("sbr", &conf)
}

/// `policy` of a pod with its own addresses (those of `results`) replaced by placeholders.
fn normalised(ns: &Netns, results: &[&Value]) -> String {
    let mut text = policy(ns).to_string();
    for (i, r) in results.iter().enumerate() {
        for cidr in result_addresses(r) {
            text = text.replace(&format!("\"{}\"", bare(&cidr)), &format!("\"<addr {i}>\""));
        }
    }
    text
}

/// Proves: without sbr, a reply to a ping that came in on net1 leaves through eth0 and
/// is lost (v4 and v6); with sbr on net1 it leaves through net1 and arrives, while the
/// pod's default route stays eth0's; the reference sbr on a second pod makes the same
/// rules and tables (addresses aside) and the same traffic work; DEL removes the rules.
#[test]
fn replies_leave_through_the_interface_they_came_in_on() {
    let env = TestEnv::new("sbr_multi_homed");
    let (a, na) = network(&env, "sbra", true, false);
    let (b, _) = network(&env, "sbrb", false, true);
    let (client, _, _) = client(&env);
    sysctl("net/ipv4/ip_forward", "1");
    sysctl("net/ipv6/conf/all/forwarding", "1");
    let bridge_a = a["bridge"].as_str().unwrap();
    let pods = [multi_homed(&env, &a, &b), multi_homed(&env, &a, &b)];
    // The test host drops what arrives on eth0's bridge from net1's addresses.
    sysctl(&format!("net/ipv4/conf/{bridge_a}/rp_filter"), "1");
    for pod in &pods {
        for v6 in [false, true] {
            let to = first_addr(&pod.prev, v6);
            assert!(!ping_once(&client, &to), "{to} answers without sbr");
        }
    }
    sbr(&pods[0]).add();
    let theirs = sbr(&pods[1]);
    let reference = |verb: &str| {
        env.ref_plugin("sbr")
            .attach(verb, &theirs.id, &theirs.ns, "net1")
            .conf(&theirs.conf)
            .run()
    };
    assert_eq!(reference("ADD").result(), pods[1].prev);
    for pod in &pods {
        for v6 in [false, true] {
            assert_ping(&client.name, &first_addr(&pod.prev, v6));
        }
        let main = table(&pod.net1.ns, "-4", "main");
        let via_eth0 = format!("default via {} dev eth0", na.v4_addr(1));
        assert!(main.contains(&via_eth0), "{main:?}");
    }
    let want = [
        (first_addr(&pods[0].prev, false), "100".to_string()),
        (first_addr(&pods[0].prev, true), "101".to_string()),
    ];
    assert_eq!(source_rules(&pods[0].net1.ns), want);
    let views = pods
        .each_ref()
        .map(|pod| normalised(&pod.net1.ns, &[&pod.prev, &pod.eth0_result]));
    assert_eq!(
        views[0], views[1],
        "cnikit's sbr and the reference's differ"
    );
    sbr(&pods[0]).del_twice();
    reference("DEL").ok();
    for pod in &pods {
        assert!(source_rules(&pod.net1.ns).is_empty());
        pod.net1.del();
        pod.eth0.del();
    }
}
