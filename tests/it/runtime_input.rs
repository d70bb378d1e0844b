//! Input as real runtimes send it. containerd's go-cni has no JSON tags on its
//! capability structs, so keys arrive with Go field names (`HostPort`), and
//! Go's decoder matches keys case-insensitively; runtimes call DEL more than
//! once and stop at the first failing plugin, so a DEL that fails on input it
//! cannot parse makes a pod impossible to remove.

use crate::support::*;
use serde_json::{json, Value};

const CTR_TCP: u16 = 8080;
const CTR_UDP: u16 = 5353;

struct Net {
    name: String,
    bridge: Value,
    ipam: Value,
}

fn network(env: &TestEnv) -> Net {
    let name = format!("ri-{}", short_hash());
    let ipam = env.ipam(Ipam::Ipamd, env.subnets().dual_ranges());
    let bridge = json!({
        "cniVersion": "1.0.0", "name": name, "type": "bridge",
        "bridge": env.link_name("ribr"), "isGateway": true, "ipam": ipam,
    });
    Net { name, bridge, ipam }
}

/// What containerd 1.6 sends portmap: go-cni's field names.
fn go_cni_portmap(net: &str, tcp: u16, udp: u16, prev: &Value) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": net, "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [
            {"HostPort": tcp, "ContainerPort": CTR_TCP, "Protocol": "tcp", "HostIP": ""},
            {"HostPort": udp, "ContainerPort": CTR_UDP, "Protocol": "udp", "HostIP": ""},
        ]},
        "prevResult": prev,
    })
}

/// A bridge attachment in a new netns (container `ctr-…`), ADDed, with
/// portmap chained after it (go-cni's keys): the bridge attachment, its
/// result and the portmap attachment.
fn bridge_and_portmap<'e>(
    env: &'e TestEnv,
    net: &Net,
) -> (Attachment<'e>, Value, Attachment<'e>, u16, u16) {
    let id = format!("ctr-{}", short_hash());
    let br = env.attachment("bridge", &id, &env.netns(), &net.bridge);
    let result = br.add();
    let (tcp, udp) = (host_port(), host_port());
    let pm = br.chained("portmap", &go_cni_portmap(&net.name, tcp, udp, &result));
    assert_eq!(pm.add(), result);
    (br, result, pm, tcp, udp)
}

/// DEL with `args` as CNI_ARGS, which must succeed silently.
fn del_with_args(att: &Attachment, args: &str) {
    att.call("DEL").cni_args(args).run().ok_silent();
}

/// Proves: portmap maps go-cni's `{"HostPort","ContainerPort","Protocol",
/// "HostIP"}` (real TCP and UDP through 127.0.0.1:hostPort), and a DEL with
/// the same keys removes every trace.
#[test]
fn go_cni_port_mappings_carry_traffic() {
    let env = TestEnv::new("go_cni_port_mappings");
    let net = network(&env);
    let (br, _, pm, tcp, udp) = bridge_and_portmap(&env, &net);
    let _servers = Servers::start(&br.ns.path, "A", CTR_TCP, CTR_UDP);
    let t = eventually_answers(|| tcp_ask(None, &sock("127.0.0.1", tcp)));
    assert!(t.is_some_and(|r| r.starts_with("A ")), "tcp via 127.0.0.1");
    let u = eventually_answers(|| udp_ask(None, &sock("127.0.0.1", udp)));
    assert!(u.is_some_and(|r| r.starts_with("A ")), "udp via 127.0.0.1");
    del_with_args(&pm, "");
    assert_eq!(tcp_ask(None, &sock("127.0.0.1", tcp)), None, "after DEL");
    assert!(
        !ruleset_json().contains(&br.id),
        "no element tagged {} left",
        br.id
    );
    del_with_args(&br, "");
}

/// Proves: a whole config written with Go-cased keys (as a Go program may
/// marshal it) configures the same bridge + IPAM attachment.
#[test]
fn go_cased_config_keys_are_understood() {
    let env = TestEnv::new("go_cased_config_keys");
    let net = network(&env);
    let ipam = &net.ipam;
    let conf = json!({
        "CNIVersion": "1.0.0", "Name": net.name, "Type": "bridge",
        "Bridge": net.bridge["bridge"], "IsGateway": true, "MTU": 1400,
        "IPAM": {"Type": "ipamd", "DataDir": ipam["dataDir"], "Socket": ipam["socket"],
                 "Ranges": ipam["ranges"]},
    });
    let att = env.attachment("bridge", "ctr-go", &env.netns(), &conf);
    let r = att.add();
    assert_eq!(r["ips"].as_array().map(Vec::len), Some(2), "{r}");
    let eth0 = link(Some(&att.ns.name), "eth0").expect("eth0");
    assert_eq!(eth0["mtu"], 1400, "MTU key honoured");
    assert_eq!(env.lease_count(ipam, &net.name), 2, "one lease per family");
    del_with_args(&att, "");
    assert_eq!(env.lease_count(ipam, &net.name), 0);
}

/// Proves: DEL is not blocked by input it cannot parse. portmap DEL with
/// unparseable mappings and prevResult removes the attachment's entries;
/// bridge DEL with a config it would refuse (`mtu: "big"`, a bad `vlan`),
/// garbage `prevResult`, malformed `CNI_ARGS` and unknown keys without
/// IgnoreUnknown still removes the veth and the lease; ipamd DEL with a
/// broken `runtimeConfig.ipRanges` releases the lease. ADD with the same
/// input still fails with a clear error.
#[test]
fn del_is_not_blocked_by_input_it_cannot_parse() {
    let env = TestEnv::new("del_not_blocked");
    let net = network(&env);
    let (br, result, pm, _, _) = bridge_and_portmap(&env, &net);
    let host_veth = result["interfaces"][1]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(link(None, &host_veth).is_some());

    let mut bad_pm = pm.conf.clone();
    bad_pm["runtimeConfig"]["portMappings"] = json!([{"HostPort": "not a port"}]);
    bad_pm["conditionsV4"] = json!(["-s", "1.2.3.4"]);
    env.attachment("portmap", "other", &br.ns, &bad_pm)
        .with_ifname("eth1")
        .try_add()
        .expect_err(2, &["conditionsV4"]);
    let garbage_prev = json!({"ips": 3, "interfaces": "x"});
    bad_pm["prevResult"] = garbage_prev.clone();
    for _ in 0..2 {
        del_with_args(&pm.chained("portmap", &bad_pm), "K8S_POD_NAME=x;garbage");
    }
    assert!(
        !ruleset_json().contains(&br.id),
        "no element tagged {} left",
        br.id
    );

    let mut bad = net.bridge.clone();
    bad["mtu"] = json!("big");
    bad["vlan"] = json!(99999);
    bad["prevResult"] = garbage_prev.clone();
    bad["runtimeConfig"] = json!({"ipRanges": "garbage", "portMappings": 7});
    let bad_br = br.chained("bridge", &bad);
    for _ in 0..2 {
        del_with_args(&bad_br, "K8S_POD_NAME=x;garbage");
    }
    assert!(link(None, &host_veth).is_none(), "host veth removed");
    assert!(link(Some(&br.ns.name), "eth0").is_none(), "eth0 removed");
    assert_eq!(env.lease_count(&net.ipam, &net.name), 0, "lease released");

    let err = bad_br.try_add().err();
    assert!(err.code == 7 || err.code == 6, "ADD still refuses: {err:?}");
    assert!(link(Some(&br.ns.name), "eth0").is_none(), "nothing left");
}

/// Proves: ipamd's own DEL with unusable ranges (config and capability)
/// still releases the attachment's lease.
#[test]
fn ipam_del_ignores_ranges_it_cannot_parse() {
    let env = TestEnv::new("ipam_del_bad_ranges");
    let net = network(&env);
    let br = env.attachment("bridge", "ctr-r", &env.netns(), &net.bridge);
    br.add();
    assert_eq!(env.lease_count(&net.ipam, &net.name), 2, "one per family");
    let mut conf = json!({"cniVersion": "1.0.0", "name": net.name, "ipam": net.ipam.clone()});
    conf["ipam"]["ranges"] = json!([[{"subnet": "not a subnet"}]]);
    conf["runtimeConfig"] = json!({"ipRanges": [[{"Subnet": 5}]]});
    br.chained("ipamd", &conf).del();
    assert_eq!(env.lease_count(&net.ipam, &net.name), 0);
    del_with_args(&br, "");
}

/// Proves: names the kernel would expand or truncate never reach it. ADD
/// with `CNI_IFNAME=eth%d` is code 4 and `"bridge": "br%d"` (or one with a
/// NUL) is code 7; no link appears in the container or on the host, and no
/// lease is taken.
#[test]
fn kernel_name_tricks_are_refused_before_any_kernel_call() {
    let (env, ns) = TestEnv::with_netns("kernel_name_tricks");
    let net = network(&env);
    env.plugin("bridge")
        .attach("ADD", "ctr-pct", &ns, "eth%d")
        .conf(&net.bridge)
        .run()
        .expect_err(4, &["CNI_IFNAME", "eth%d"]);
    for bad in ["br%d", "br\u{0}x"] {
        let mut conf = net.bridge.clone();
        conf["bridge"] = json!(bad);
        env.plugin("bridge")
            .attach("ADD", "ctr-br", &ns, "eth0")
            .conf(&conf)
            .run()
            .expect_err(7, &["bridge"]);
    }
    assert_eq!(link_names(Some(&ns.name)).len(), 1, "only lo in the pod");
    // What the kernel would have made of them: br0, br1, … for "br%d", and
    // "br" for a name cut at its NUL (other tests' links come and go).
    let expanded: Vec<String> = link_names(None)
        .into_iter()
        .filter(|n| {
            n == "br"
                || n.strip_prefix("br")
                    .is_some_and(|d| d.parse::<u32>().is_ok())
        })
        .collect();
    assert!(expanded.is_empty(), "host links {expanded:?}");
    assert!(link(None, net.bridge["bridge"].as_str().unwrap()).is_none());
    assert_eq!(env.lease_count(&net.ipam, &net.name), 0, "no lease taken");
}

/// Proves: configurations the reference takes, as Go decodes them, work: a
/// bridge with `null` keys (`vlanTrunk`, `ipMasq`, `mtu`) and empty MACs
/// (`runtimeConfig.mac`, `args.cni.mac`, `CNI_ARGS MAC=`: unset, so the
/// dotted one further down counts); portmap chained with `"snat": null`
/// (true: 127.0.0.1 reaches the pod), `conditionsV4: [""]` (none),
/// `externalSetMarkChain` (a note) and `CNI_ARGS` with undeclared keys and
/// no IgnoreUnknown, which portmap, like the reference, does not read.
#[test]
fn nulls_empty_values_and_foreign_cni_args_as_go_reads_them() {
    let env = TestEnv::new("go_nulls_and_empties");
    let net = network(&env);
    let mut bridge = net.bridge.clone();
    for key in [
        "vlanTrunk",
        "ipMasq",
        "mtu",
        "hairpinMode",
        "isDefaultGateway",
    ] {
        bridge[key] = Value::Null;
    }
    bridge["runtimeConfig"] = json!({"mac": ""});
    bridge["args"] = json!({"cni": {"mac": "0A58.0A01.0209"}});
    let br = env.attachment("bridge", &cid("nulls"), &env.netns(), &bridge);
    let result = br
        .call("ADD")
        .cni_args("IgnoreUnknown=1;MAC=")
        .run()
        .result();
    let eth0 = link(Some(&br.ns.name), "eth0").expect("eth0");
    assert_eq!(eth0["address"], "0a:58:0a:01:02:09");
    assert_eq!(
        result["interfaces"][2]["mac"], "0a:58:0a:01:02:09",
        "{result}"
    );

    let (tcp, udp) = (host_port(), host_port());
    let mut pm_conf = go_cni_portmap(&net.name, tcp, udp, &result);
    pm_conf["snat"] = Value::Null;
    pm_conf["conditionsV4"] = json!([""]);
    pm_conf["conditionsV6"] = Value::Null;
    pm_conf["externalSetMarkChain"] = json!("KUBE-MARK-MASQ");
    let pm = br.chained("portmap", &pm_conf);
    let foreign = "K8S_POD_NAME=web-1;K8S_POD_NAMESPACE=default;novalue";
    let out = pm.call("ADD").cni_args(foreign).run();
    assert_eq!(out.result(), result);
    assert!(
        out.stderr.contains("externalSetMarkChain"),
        "{}",
        out.stderr
    );
    let _servers = Servers::start(&br.ns.path, "A", CTR_TCP, CTR_UDP);
    let t = eventually_answers(|| tcp_ask(None, &sock("127.0.0.1", tcp)));
    assert!(t.is_some_and(|r| r.starts_with("A ")), "tcp via 127.0.0.1");
    pm.call("CHECK")
        .cni_args(foreign)
        .conf(&with_prev(&pm_conf, &result))
        .run()
        .ok_silent();
    pm.call("DEL").cni_args(foreign).run().ok_silent();
    assert_eq!(tcp_ask(None, &sock("127.0.0.1", tcp)), None, "after DEL");
    del_with_args(&br, "");
}

/// Proves: portmap chained after an attachment with no IP address for
/// CNI_IFNAME (an L2-only bridge) maps nothing and returns prevResult, with a
/// note on stderr, as the reference does; CHECK and DEL succeed.
#[test]
fn portmap_after_an_l2_attachment_maps_nothing() {
    let env = TestEnv::new("portmap_l2_only");
    let net = network(&env);
    let mut l2 = net.bridge.clone();
    l2.as_object_mut().unwrap().remove("ipam");
    l2["isGateway"] = json!(false);
    let br = env.attachment("bridge", &cid("l2"), &env.netns(), &l2);
    let result = br.add();
    let (tcp, udp) = (host_port(), host_port());
    let pm = br.chained("portmap", &go_cni_portmap(&net.name, tcp, udp, &result));
    let out = pm.try_add();
    assert_eq!(out.result(), result);
    assert!(out.stderr.contains("no IP address"), "{}", out.stderr);
    assert!(!ruleset_json().contains(&br.id), "no element for {}", br.id);
    pm.check(&result);
    pm.del();
    del_with_args(&br, "");
}
