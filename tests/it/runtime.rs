//! `cnikit net`: network configuration lists run like a container runtime
//! runs them (libcni), with this project's plugins on the kernel: bridge with
//! both IPAMs and macvlan for every version from 0.3.1 on (ADD, CHECK, DEL,
//! GC, STATUS), the result cache, DEL after the netns is gone, GC of gone
//! and forgotten attachments, and the rollback of an ADD that fails midway.

use crate::support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const NET: &str = "rtnet";

/// Versions with a result layout that carries interfaces; the runtime is
/// version-agnostic below that (covered by the unit tests).
const VERSIONS: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A conf dir holding one list, a cache dir, and `cnikit net` calls on them.
struct Net {
    /// The list's network name.
    name: String,
    conf_dir: PathBuf,
    cache: PathBuf,
    cni_path: String,
}

impl Net {
    fn new(env: &TestEnv, list: &Value) -> Net {
        let conf_dir = env.dir("netconf");
        write_json(&conf_dir.join("10-rt.conflist"), list);
        Net::in_dir(env, conf_dir, &[])
    }

    /// A network name no other test uses: GC removes whatever of its network
    /// is not valid on the whole (shared) test host, veths and port mappings too.
    fn own_name() -> String {
        format!("rt-{}", short_hash())
    }

    fn in_dir(env: &TestEnv, conf_dir: PathBuf, extra_bins: &[&Path]) -> Net {
        let mut dirs: Vec<&Path> = extra_bins.to_vec();
        dirs.push(&env.bin);
        dirs.push(&env.ref_bin);
        let cni_path = std::env::join_paths(dirs)
            .expect("join CNI_PATH")
            .to_string_lossy()
            .into_owned();
        let list = std::fs::read_dir(&conf_dir)
            .expect("conf dir")
            .filter_map(Result::ok)
            .find_map(|e| std::fs::read(e.path()).ok())
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let name = list
            .and_then(|l| l["name"].as_str().map(str::to_string))
            .unwrap_or_else(|| NET.to_string());
        Net {
            name,
            conf_dir,
            cache: env.dir("cache"),
            cni_path,
        }
    }

    /// `cnikit net ARGS… --conf-dir … --cache-dir … --cni-path …`.
    fn call<S: AsRef<str>>(&self, args: &[S]) -> Call {
        let mut all = vec!["net"];
        all.extend(args.iter().map(AsRef::as_ref));
        let conf = self.conf_dir.to_string_lossy().into_owned();
        let cache = self.cache.to_string_lossy().into_owned();
        let tail = [
            "--conf-dir",
            conf.as_str(),
            "--cache-dir",
            cache.as_str(),
            "--cni-path",
            self.cni_path.as_str(),
        ];
        all.extend_from_slice(&tail);
        Call::cnikit(&all)
    }

    fn run<S: AsRef<str>>(&self, args: &[S]) -> Outcome {
        self.call(args).run()
    }

    /// The cache entries (parsed), sorted by file name.
    fn cached(&self) -> Vec<(String, Value)> {
        let mut out: Vec<(String, Value)> = std::fs::read_dir(&self.cache)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let bytes = std::fs::read(e.path()).expect("read cache entry");
                        (
                            name,
                            serde_json::from_slice(&bytes).expect("cache entry JSON"),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).expect("encode")).expect("write conf");
}

/// bridge (gateway) → portmap, the usual chain, of network `name`.
fn bridge_list(name: &str, version: &str, bridge: &str, ipam: &Value) -> Value {
    json!({
        "cniVersion": version,
        "name": name,
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": true,
             "isDefaultGateway": true, "ipam": ipam},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
}

/// A bridge → portmap list of `version` over IPAM of `kind` (one v4 range):
/// the list's `Net`, the ipam object, the bridge name and the subnets.
fn bridge_net(
    env: &TestEnv,
    name: &str,
    kind: Ipam,
    version: &str,
) -> (Net, Value, String, Subnets) {
    let nets = env.subnets();
    let ipam = env.ipam(kind, nets.v4_ranges());
    let bridge = env.link_name("rtb");
    let net = Net::new(env, &bridge_list(name, version, &bridge, &ipam));
    (net, ipam, bridge, nets)
}

fn version_at_least(v: &str, min: &str) -> bool {
    let key = |s: &str| -> Vec<u32> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    key(v) >= key(min)
}

/// The result is in the list's version and describes the container interface.
fn check_result(version: &str, r: &Value, ns: &Netns, ifname: &str) -> String {
    assert_eq!(r["cniVersion"], version, "{r}");
    let ifs = r["interfaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no interfaces: {r}"));
    assert!(
        ifs.iter()
            .any(|i| i["name"] == ifname && i["sandbox"] == ns.path.as_str()),
        "no {ifname} in {}: {r}",
        ns.path
    );
    let addr = result_addresses(r)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no address: {r}"));
    assert_eq!(
        r["ips"][0].get("version").is_some(),
        !version_at_least(version, "1.0.0"),
        "ips[].version only before 1.0.0: {r}"
    );
    addr
}

/// ADD, CHECK, STATUS, GC, DEL, DEL again through `cnikit net` for one list,
/// checking kernel state, the cache and the leases after each step.
fn lifecycle(env: &TestEnv, version: &str, net: &Net, ipam: &Value, gateway: Option<&str>) {
    let (ns, name) = (env.netns(), net.name.as_str());
    let r = net.run(&["add", name, &ns.path]).result();
    let addr = check_result(version, &r, &ns, "eth0");
    assert!(
        addrs(Some(&ns.name), "eth0").contains(&addr),
        "{addr} not on eth0"
    );
    if let Some(gw) = gateway {
        assert_ping(&ns.name, gw);
    }
    let cached = net.cached();
    assert_eq!(cached.len(), 1, "one cache entry: {cached:?}");
    assert!(
        cached[0].0.starts_with(&format!("{name}-cnikit-")),
        "{}",
        cached[0].0
    );
    assert_eq!(cached[0].1["result"], r);

    let check = net.run(&["check", name, &ns.path]);
    if version_at_least(version, "0.4.0") {
        check.ok_silent();
    } else {
        check.expect_err(7, &["CHECK needs 0.4.0"]);
    }
    net.run(&["status", name]).ok_silent();
    net.run(&["gc", name]).ok_silent();
    assert_eq!(env.lease_count(ipam, name), 1, "GC kept the valid lease");

    net.run(&["del", name, &ns.path]).ok_silent();
    assert!(net.cached().is_empty(), "DEL removes the cache entry");
    assert!(link(Some(&ns.name), "eth0").is_none(), "eth0 left behind");
    assert_eq!(env.lease_count(ipam, name), 0, "lease left behind");
    net.run(&["del", name, &ns.path]).ok_silent();
}

/// Proves: bridge + (ipamd | host-local) + portmap through `cnikit net` at
/// 0.3.1, 0.4.0, 1.0.0 and 1.1.0: result layout per version, address in the
/// pod, gateway reachable, CHECK (from 0.4.0), STATUS, GC keeping the live
/// lease, DEL cleaning links, cache and lease, a second DEL succeeding.
#[test]
fn bridge_lists_every_version_both_ipams() {
    let env = TestEnv::new("bridge_lists_every_version_both_ipams");
    for version in VERSIONS {
        for kind in Ipam::BOTH {
            let (net, ipam, _, nets) = bridge_net(&env, &Net::own_name(), kind, version);
            lifecycle(&env, version, &net, &ipam, Some(&nets.v4_addr(1)));
        }
    }
}

/// Proves: macvlan + ipamd through `cnikit net` at every version, and two
/// pods on one master reach each other.
#[test]
fn macvlan_lists_every_version() {
    let env = TestEnv::new("macvlan_lists_every_version");
    let (master, _) = env.veth_pair();
    for version in VERSIONS {
        let nets = env.subnets();
        let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
        let list = json!({
            "cniVersion": version,
            "name": Net::own_name(),
            "plugins": [
                {"type": "macvlan", "master": master, "mode": "bridge", "ipam": ipam},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        let net = Net::new(&env, &list);
        lifecycle(&env, version, &net, &ipam, None);
    }
    // Two pods on the same master talk through it.
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let list = json!({"cniVersion": "1.1.0", "name": NET, "plugins": [
        {"type": "macvlan", "master": master, "mode": "bridge", "ipam": ipam}]});
    let net = Net::new(&env, &list);
    let (a, b) = (env.netns(), env.netns());
    net.run(&["add", NET, &a.path]).result();
    let rb = net.run(&["add", NET, &b.path]).result();
    assert_ping(&a.name, &first_addr(&rb, false));
    net.run(&["del", NET, &a.path]).ok_silent();
    net.run(&["del", NET, &b.path]).ok_silent();
}

/// Proves: the cache entry has libcni's layout and content (config bytes,
/// netns, CNI_ARGS, capability args, result); capability args reach the
/// plugins as runtimeConfig (ipRanges) and CNI_ARGS as well (IP=); the
/// highest known version of cniVersions is used; CHECK really uses the
/// cached result; DEL without a netns argument uses the cached netns.
#[test]
fn cache_args_and_versions() {
    let env = TestEnv::new("cache_args_and_versions");
    let (nets, other) = (env.subnets(), env.subnets());
    let ipam = env.ipam(Ipam::Ipamd, nets.v4_ranges());
    let bridge = env.link_name("rtb");
    let mut list = bridge_list(NET, "0.4.0", &bridge, &ipam);
    list["cniVersions"] = json!(["1.1.0", "9.9.9", "1.0.0"]);
    list["plugins"][0]["capabilities"] = json!({"ipRanges": true});
    let net = Net::new(&env, &list);
    let ns = env.netns();
    let want = other.v4_addr(77);
    let caps = json!({"ipRanges": [[{"subnet": other.v4}]], "portMappings": []}).to_string();
    let cni_args = format!("IgnoreUnknown=1;IP={want}");
    // One attachment: `VERB NET [NETNS] --container-id ctr-cache --ifname eth1`.
    let verb = |verb: &'static str, netns: Option<&str>| -> Vec<String> {
        [verb, NET]
            .into_iter()
            .chain(netns)
            .chain(["--container-id", "ctr-cache", "--ifname", "eth1"])
            .map(str::to_string)
            .collect()
    };
    let (add, check, del) = (
        verb("add", Some(&ns.path)),
        verb("check", Some(&ns.path)),
        verb("del", None),
    );
    let r = net
        .call(&add)
        .env("CAP_ARGS", &caps)
        .env("CNI_ARGS", &cni_args)
        .run()
        .result();
    assert_eq!(
        r["cniVersion"], "1.1.0",
        "highest known of cniVersions: {r}"
    );
    // ipRanges go before the configured range set, as in host-local: one address from each.
    assert_eq!(
        result_addresses(&r),
        vec![format!("{want}/24"), format!("{}/24", nets.v4_addr(2))],
        "{r}"
    );

    let cached = net.cached();
    assert_eq!(cached.len(), 1);
    assert_eq!(cached[0].0, format!("{NET}-ctr-cache-eth1"));
    let e = &cached[0].1;
    assert_eq!(e["kind"], "cniCacheV1");
    assert_eq!(e["containerId"], "ctr-cache");
    assert_eq!(e["ifName"], "eth1");
    assert_eq!(e["networkName"], NET);
    assert_eq!(e["netns"], ns.path.as_str());
    assert_eq!(e["cniArgs"], json!([["IgnoreUnknown", "1"], ["IP", want]]));
    assert_eq!(e["capabilityArgs"].to_string(), caps);
    assert_eq!(e["result"], r);
    let file = std::fs::read(net.conf_dir.join("10-rt.conflist")).expect("conflist");
    assert_eq!(e["config"].as_str(), Some(base64(&file).as_str()));

    net.run(&check).ok_silent();
    // CHECK compares the pod with the *cached* result: make the cache lie.
    let path = net.cache.join(&cached[0].0);
    let mut lie = e.clone();
    lie["result"]["ips"][0]["address"] = json!(format!("{}/24", other.v4_addr(78)));
    write_json(&path, &lie);
    assert!(
        !net.run(&check).success(),
        "CHECK must fail against a wrong cached result"
    );
    write_json(&path, e);

    net.run(&del).ok_silent();
    assert!(
        link(Some(&ns.name), "eth1").is_none(),
        "DEL used the cached netns"
    );
    assert!(net.cached().is_empty());
    assert_eq!(env.lease_count(&ipam, NET), 0);
}

/// Go's standard base64 (how libcni stores `config`).
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Proves: after the container's netns is gone, `cnikit net del` succeeds
/// for both IPAMs and frees the lease; the cache entry goes too.
#[test]
fn del_with_the_netns_gone() {
    let env = TestEnv::new("del_with_the_netns_gone");
    for kind in Ipam::BOTH {
        let (net, ipam, bridge, _) = bridge_net(&env, NET, kind, "1.0.0");
        let ns = env.netns();
        net.run(&["add", NET, &ns.path]).result();
        env.del_netns(&ns);
        net.run(&["del", NET, &ns.path]).ok_silent();
        assert!(net.cached().is_empty());
        assert_eq!(env.lease_count(&ipam, NET), 0, "{kind:?} lease left behind");
        eventually("the host veth is gone", || bridge_ports(&bridge).is_empty());
    }
}

/// Proves: `cnikit net gc` DELs and forgets attachments named `--gone`
/// (also with their netns already deleted), and passes the cached
/// attachments as valid, so ipamd frees a lease the cache no longer knows.
#[test]
fn gc_gone_and_forgotten_attachments() {
    let env = TestEnv::new("gc_gone_and_forgotten_attachments");
    let (net, ipam, _, _) = bridge_net(&env, &Net::own_name(), Ipam::Ipamd, "1.1.0");
    let name = net.name.as_str();
    let pods: Vec<(Netns, String)> = (0..3)
        .map(|i| (env.netns(), format!("ctr-gc-{i}")))
        .collect();
    for (ns, id) in &pods {
        net.run(&["add", name, &ns.path, "--container-id", id])
            .result();
    }
    assert_eq!(env.lease_count(&ipam, name), 3);

    // Pod 0 is gone (and its netns with it): GC deletes and forgets it.
    env.del_netns(&pods[0].0);
    net.run(&["gc", name, "--gone", &pods[0].1]).ok();
    assert_eq!(net.cached().len(), 2);
    assert_eq!(env.lease_count(&ipam, name), 2);

    // The runtime lost pod 1's cache entry: it is not valid any more, so the
    // plugins' GC frees what it held.
    std::fs::remove_file(net.cache.join(format!("{name}-{}-eth0", pods[1].1))).expect("rm cache");
    net.run(&["gc", name]).ok_silent();
    assert_eq!(env.lease_count(&ipam, name), 1, "pod 2 keeps its lease");
    assert!(
        link(Some(&pods[1].0.name), "eth0").is_none(),
        "GC kept the forgotten pod's interface"
    );
    assert!(
        link(Some(&pods[2].0.name), "eth0").is_some(),
        "GC took a valid pod's interface"
    );

    net.run(&["del", name, &pods[2].0.path, "--container-id", &pods[2].1])
        .ok_silent();
    net.run(&["del", name, &pods[1].0.path, "--container-id", &pods[1].1])
        .ok_silent();
    assert_eq!(env.lease_count(&ipam, name), 0);
}

/// Proves: when the second plugin fails ADD, `cnikit net add` exits 1 with
/// one error object naming that plugin (its code and details kept), and DEL
/// ran for the whole list in reverse: no interface, no host veth, no lease,
/// no cache entry remain.
#[test]
fn add_failure_midway_rolls_back() {
    let env = TestEnv::new("add_failure_midway_rolls_back");
    for kind in Ipam::BOTH {
        let fake = env.dir("fake-bin");
        let log = fake.join("log");
        failing_plugin(&fake, "rtfail", &log);
        let nets = env.subnets();
        let ipam = env.ipam(kind, nets.v4_ranges());
        let bridge = env.link_name("rtb");
        let conf_dir = env.dir("netconf");
        let mut list = bridge_list(NET, "1.0.0", &bridge, &ipam);
        list["plugins"][1] = json!({"type": "rtfail"});
        write_json(&conf_dir.join("10-rt.conflist"), &list);
        let net = Net::in_dir(&env, conf_dir, &[&fake]);
        let ns = env.netns();
        let e = net.run(&["add", NET, &ns.path]).expect_err(
            11,
            &["plugin \"rtfail\" (2 of 2) failed ADD", "rtfail refuses"],
        );
        assert!(
            e.details.contains("on purpose") && e.details.contains("DEL"),
            "{e:?}"
        );
        let calls = std::fs::read_to_string(&log).expect("log");
        assert_eq!(calls.lines().collect::<Vec<_>>(), ["ADD", "DEL"]);
        assert!(link(Some(&ns.name), "eth0").is_none(), "eth0 left behind");
        assert!(bridge_ports(&bridge).is_empty(), "host veth left behind");
        assert_eq!(env.lease_count(&ipam, NET), 0, "{kind:?} lease left behind");
        assert!(net.cached().is_empty(), "no cache entry for a failed ADD");
    }
}

/// Proves: a legacy single-plugin .conf is found by name and run as a
/// one-plugin list; an unknown network is error 7 naming it.
#[test]
fn legacy_conf_and_unknown_network() {
    let env = TestEnv::new("legacy_conf_and_unknown_network");
    let nets = env.subnets();
    let ipam = env.ipam(Ipam::HostLocal, nets.v4_ranges());
    let bridge = env.link_name("rtb");
    let conf_dir = env.dir("netconf");
    let single = json!({"cniVersion": "0.4.0", "name": NET, "type": "bridge",
        "bridge": bridge, "isGateway": true, "ipam": ipam});
    write_json(&conf_dir.join("50-legacy.conf"), &single);
    let net = Net::in_dir(&env, conf_dir, &[]);
    let ns = env.netns();
    let r = net.run(&["add", NET, &ns.path]).result();
    check_result("0.4.0", &r, &ns, "eth0");
    net.run(&["check", NET, &ns.path]).ok_silent();
    net.run(&["del", NET, &ns.path]).ok_silent();
    assert_eq!(env.lease_count(&ipam, NET), 0);
    net.run(&["add", "nosuchnet", &ns.path])
        .expect_err(7, &["no network configuration named \"nosuchnet\""]);
}

/// Proves: CHECK and DEL reuse the ADD's capability arguments from the cache
/// when the caller gives none (the spec wants the same attachment
/// parameters): a DEL without --cap-args still removes the port mapping, so
/// the next pod can map the same host port.
#[test]
fn del_reuses_cached_capability_args() {
    let env = TestEnv::new("del_reuses_cached_capability_args");
    let (net, _, _, _) = bridge_net(&env, NET, Ipam::Ipamd, "1.1.0");
    let caps =
        json!({"portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]});
    for _ in 0..2 {
        let ns = env.netns();
        net.run(&["add", NET, &ns.path, "--cap-args", &caps.to_string()])
            .result();
        net.run(&["check", NET, &ns.path]).ok_silent();
        net.run(&["del", NET, &ns.path]).ok_silent();
    }
}
