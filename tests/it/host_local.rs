//! host-local: cnikit's against Debian's reference (/usr/lib/cni/host-local, 1.1.1) on
//! the same configurations and the same lease directories: the same results and files,
//! each using the other's leases without handing one out twice, concurrency, requested
//! addresses, the verbs the reference lacks (STATUS, GC), and host-local behind bridge.
//! `routes`: route metrics, tables and scopes, and other keys as v1.9.1 reads them.

mod routes;

use crate::support::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// An IPAM plugin never enters the netns; the runtime still names one.
const NETNS: &str = "/run/netns/host-local-unused";

fn conf(version: &str, name: &str, ipam: Value) -> Value {
    json!({"cniVersion": version, "name": name, "type": "bridge", "ipam": ipam})
}

fn ipam(dir: &Path, ranges: Value) -> Value {
    json!({"type": "host-local", "dataDir": dir, "ranges": ranges})
}

fn net_name() -> String {
    format!("hl-{}", short_hash())
}

/// One test's world: its subnets, a lease directory (`dataDir`, named after `what`) and
/// a new network name.
fn world(test: &str, what: &str) -> (TestEnv, Subnets, PathBuf, String) {
    let env = TestEnv::new(test);
    let nets = env.subnets();
    let dir = env.dir(what);
    (env, nets, dir, net_name())
}

/// The one range set of a /29 (five addresses and the gateway) at the start of `nets`.
fn slash29(nets: &Subnets) -> Value {
    json!([[{"subnet": format!("{}/29", nets.v4_addr(0))}]])
}

/// A call of ours or of the reference for attachment `id`/eth0.
fn call(env: &TestEnv, reference: bool, verb: &str, id: &str, conf: &Value) -> Call {
    let p = if reference {
        env.ref_plugin("host-local")
    } else {
        env.plugin("host-local")
    };
    p.command(verb)
        .container(id)
        .netns_path(NETNS)
        .ifname("eth0")
        .conf(conf)
}

fn add(env: &TestEnv, reference: bool, id: &str, conf: &Value) -> Value {
    call(env, reference, "ADD", id, conf).run().result()
}

/// The error object of a failed call, ours or the reference's (whose objects may lack
/// `cniVersion`).
fn failed(o: &Outcome) -> CniError {
    assert!(!o.success(), "unexpected success: {}", o.stdout);
    parse_error_object(&o.stdout, true).unwrap()
}

/// Every file of a network's lease directory but `lock`, with its content.
fn files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().into_string().unwrap();
        if name != "lock" {
            out.insert(name, std::fs::read_to_string(e.path()).unwrap());
        }
    }
    out
}

/// The names of the lease files (named by an address).
fn leases(dir: &Path) -> BTreeSet<String> {
    files(dir)
        .into_keys()
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect()
}

/// Proves: for the same configuration (two dual-stack-able range sets, rangeStart/
/// rangeEnd, gateway, routes, resolvConf) and the same sequence of ADDs and a DEL, ours
/// prints the results the reference prints and writes byte for byte the same files: one
/// per address holding `ID\r\nIFNAME`, `last_reserved_ip.N` per range set, no newline.
#[test]
fn same_results_and_files_as_the_reference() {
    let env = TestEnv::new("host_local_same_files");
    let nets = env.subnets();
    let resolv = env.tmp.join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 10.0.0.53\nsearch a.example b.example\noptions ndots:2\ndomain example\n",
    )
    .unwrap();
    let ranges = json!([
        [{"subnet": nets.v4, "rangeStart": nets.v4_addr(10), "rangeEnd": nets.v4_addr(12),
          "gateway": nets.v4_addr(11)}],
        [{"subnet": nets.v6}]
    ]);
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let name = net_name();
        let mut dirs = Vec::new();
        let mut results = Vec::new();
        for reference in [true, false] {
            let dir = env.dir(if reference { "ref" } else { "ours" });
            let mut i = ipam(&dir, ranges.clone());
            i["routes"] =
                json!([{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": nets.v4_addr(1)}]);
            i["resolvConf"] = json!(resolv);
            let c = conf(version, &name, i);
            let mut rs = Vec::new();
            for id in ["ctr-a", "ctr-b"] {
                rs.push(add(&env, reference, id, &c));
            }
            call(&env, reference, "DEL", "ctr-a", &c).run().ok_silent();
            rs.push(add(&env, reference, "ctr-c", &c));
            results.push(rs);
            dirs.push(dir.join(&name));
        }
        assert_eq!(results[1], results[0], "{version}: results differ");
        assert_eq!(
            result_addresses(&results[1][2]),
            [
                format!("{}/24", nets.v4_addr(10)),
                format!("{}/64", nets.v6_addr(4))
            ],
            "{version}: the round robin skips the gateway and wraps"
        );
        assert_eq!(results[1][0]["dns"]["nameservers"], json!(["10.0.0.53"]));
        assert_eq!(files(&dirs[1]), files(&dirs[0]), "{version}: files differ");
        let f = files(&dirs[1]);
        assert_eq!(f[&nets.v4_addr(12)], "ctr-b\r\neth0");
        assert_eq!(f["last_reserved_ip.0"], nets.v4_addr(10));
        assert!(dirs[1].join("lock").exists());
    }
}

/// Proves: a lease directory the reference wrote is used by ours and the other way
/// round: nobody is handed an address the other holds, the round robin continues where
/// the other left off, each one's DEL frees the other's leases and CHECK finds them, and
/// both agree when the set is full.
#[test]
fn each_uses_the_others_leases_without_double_allocation() {
    let (env, nets, dir, name) = world("host_local_switch", "shared");
    // .1 is the gateway: .2 - .6 are the five addresses of a /29.
    let c = conf("1.0.0", &name, ipam(&dir, slash29(&nets)));
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for (i, reference) in [true, false, true, false, true].into_iter().enumerate() {
        let id = format!("ctr-{i}");
        let r = add(&env, reference, &id, &c);
        let a = first_addr(&r, false);
        assert_eq!(
            a,
            nets.v4_addr(2 + i as u8),
            "round robin across implementations"
        );
        assert!(held.insert(a, id).is_none());
    }
    for reference in [true, false] {
        let e = failed(&call(&env, reference, "ADD", "ctr-full", &c).run());
        assert!(e.msg.contains("no IP addresses available"), "{e:?}");
    }
    assert_eq!(leases(&dir.join(&name)).len(), 5);
    // CHECK and DEL across: ours on the reference's leases and the reverse.
    let prev = |id: &str| {
        let a = held.iter().find(|(_, v)| *v == id).unwrap().0;
        json!({"cniVersion": "1.0.0", "ips": [{"address": format!("{a}/29")}]})
    };
    for (id, reference) in [("ctr-0", false), ("ctr-1", true)] {
        call(&env, reference, "CHECK", id, &with_prev(&c, &prev(id)))
            .run()
            .ok_silent();
        call(&env, reference, "DEL", id, &c).run().ok_silent();
        failed(&call(&env, reference, "CHECK", id, &with_prev(&c, &prev(id))).run());
    }
    assert_eq!(leases(&dir.join(&name)).len(), 3);
    // The freed addresses come back to whichever asks, after the round robin wraps.
    let a = first_addr(&add(&env, true, "ctr-5", &c), false);
    let b = first_addr(&add(&env, false, "ctr-6", &c), false);
    assert_eq!(
        BTreeSet::from([a, b]),
        BTreeSet::from([nets.v4_addr(2), nets.v4_addr(3)])
    );
}

/// Proves: a lease in the pre-0.7 format (the container ID only) keeps its address
/// taken; CHECK finds it and DEL frees it, as with the reference.
#[test]
fn id_only_leases_are_honoured_and_freed() {
    let (env, nets, dir, name) = world("host_local_id_only", "old");
    let c = conf("0.4.0", &name, ipam(&dir, nets.v4_ranges()));
    let net = dir.join(&name);
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join(nets.v4_addr(2)), "ctr-old").unwrap();
    let r = add(&env, false, "ctr-new", &c);
    assert_eq!(first_addr(&r, false), nets.v4_addr(3));
    call(&env, false, "CHECK", "ctr-old", &c).run().ok_silent();
    call(&env, false, "DEL", "ctr-old", &c).run().ok_silent();
    assert_eq!(leases(&net), BTreeSet::from([nets.v4_addr(3)]));
}

/// Proves: 40 ADDs at once, half ours and half the reference's, on one directory get 40
/// different addresses, and the 40 DELs at once leave no lease.
#[test]
fn parallel_adds_of_both_never_share_an_address() {
    let (env, nets, dir, name) = world("host_local_parallel", "par");
    let c = conf("1.0.0", &name, ipam(&dir, nets.dual_ranges()));
    let results: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..40)
            .map(|i| {
                let (env, c) = (&env, &c);
                s.spawn(move || add(env, i % 2 == 0, &format!("ctr-{i}"), c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = BTreeSet::new();
    for r in &results {
        for a in result_addresses(r) {
            assert!(all.insert(a.clone()), "{a} handed out twice");
        }
    }
    assert_eq!(all.len(), 80);
    assert_eq!(leases(&dir.join(&name)).len(), 80);
    std::thread::scope(|s| {
        for i in 0..40 {
            let (env, c) = (&env, &c);
            s.spawn(move || {
                call(env, i % 3 == 0, "DEL", &format!("ctr-{i}"), c)
                    .run()
                    .ok_silent();
            });
        }
    });
    assert!(leases(&dir.join(&name)).is_empty());
}

/// Proves: requested addresses from `CNI_ARGS IP=`, `args.cni.ips` and
/// `runtimeConfig.ips` are handed out; one held by another container, the gateway or one
/// outside every range is refused with 103 and nothing is left; `runtimeConfig.ipRanges`
/// comes first, before the configured sets, as in the reference.
#[test]
fn requested_addresses_and_runtime_ranges() {
    let (env, nets, dir, name) = world("host_local_requested", "req");
    let c = conf("1.0.0", &name, ipam(&dir, nets.dual_ranges()));
    let net = dir.join(&name);
    let r = call(&env, false, "ADD", "ctr-1", &c)
        .cni_args(&format!("IP={}", nets.v4_addr(40)))
        .run()
        .result();
    assert_eq!(first_addr(&r, false), nets.v4_addr(40));
    let with_args = merged(
        c.clone(),
        json!({"args": {"cni": {"ips": [nets.v6_addr(0x41)]}},
               "runtimeConfig": {"ips": [format!("{}/24", nets.v4_addr(41))]}}),
    );
    let r = add(&env, false, "ctr-2", &with_args);
    assert_eq!(first_addr(&r, false), nets.v4_addr(41));
    assert_eq!(first_addr(&r, true), nets.v6_addr(0x41));
    for (ip, needle) in [
        (nets.v4_addr(40), "held by container ctr-1/eth0"),
        (nets.v4_addr(1), "gateway"),
        ("192.0.2.99".to_string(), "not in any range set"),
    ] {
        call(&env, false, "ADD", "ctr-3", &c)
            .cni_args(&format!("IP={ip}"))
            .run()
            .expect_err(103, &[needle]);
    }
    assert_eq!(leases(&net).len(), 4, "failed ADDs leave nothing");

    // ipRanges in front: its set is index 0, the configured ones follow.
    let other = env.subnets();
    let rt = merged(
        c.clone(),
        json!({"runtimeConfig": {"ipRanges": [[{"subnet": other.v4}]]}}),
    );
    let mut rs = Vec::new();
    for reference in [false, true] {
        let d = env.dir("rt");
        let mut cc = rt.clone();
        cc["ipam"]["dataDir"] = json!(d);
        rs.push(add(&env, reference, "ctr-rt", &cc));
        assert_eq!(
            files(&d.join(&name))["last_reserved_ip.0"],
            other.v4_addr(2)
        );
    }
    assert_eq!(rs[0], rs[1]);
    assert_eq!(result_addresses(&rs[0]).len(), 3);
}

/// Proves: a repeated ADD of one attachment returns what it holds (the reference refuses
/// it) and takes nothing more; DEL, DEL again, and DEL with a configuration ADD would
/// refuse (or no range at all) succeed and free the lease; an unknown network's DEL
/// creates nothing.
#[test]
fn repeated_add_and_forgiving_del() {
    let (env, nets, dir, name) = world("host_local_repeat", "rep");
    let c = conf("1.0.0", &name, ipam(&dir, nets.dual_ranges()));
    let r1 = add(&env, false, "ctr-1", &c);
    assert_eq!(add(&env, false, "ctr-1", &c), r1);
    let e = failed(&call(&env, true, "ADD", "ctr-1", &c).run());
    assert!(
        e.msg.contains("duplicate allocation"),
        "the reference: {e:?}"
    );
    assert_eq!(leases(&dir.join(&name)).len(), 2);
    let broken = merged(
        c.clone(),
        json!({"ipam": {"type": "host-local",
        "dataDir": dir, "ranges": "nonsense"}}),
    );
    call(&env, false, "ADD", "ctr-1", &broken)
        .run()
        .expect_err(7, &["ipam.ranges"]);
    call(&env, false, "DEL", "ctr-1", &broken).run().ok_silent();
    assert!(leases(&dir.join(&name)).is_empty());
    call(&env, false, "DEL", "ctr-1", &c).run().ok_silent();
    let unknown = conf("1.0.0", "hl-never-added", ipam(&dir, nets.v4_ranges()));
    call(&env, false, "DEL", "ctr-1", &unknown)
        .run()
        .ok_silent();
    assert!(!dir.join("hl-never-added").exists());
}

/// Proves: without `dataDir` the leases go to /var/lib/cni/networks/<network> (a tmpfs
/// in the test namespace), as with the reference.
#[test]
fn default_data_dir_is_the_references() {
    let env = TestEnv::new("host_local_default_dir");
    let nets = env.subnets();
    let name = net_name();
    let c = conf(
        "1.0.0",
        &name,
        json!({"type": "host-local", "subnet": nets.v4}),
    );
    add(&env, false, "ctr-d", &c);
    let net = PathBuf::from("/var/lib/cni/networks").join(&name);
    assert_eq!(leases(&net), BTreeSet::from([nets.v4_addr(2)]));
    call(&env, true, "DEL", "ctr-d", &c).run().ok_silent();
    assert!(leases(&net).is_empty());
}

/// Proves: STATUS (1.1.0) passes while an address is free and says 50 when a set is
/// full; GC frees every lease but the valid attachments'; both need 1.1.0.
#[test]
fn status_and_gc() {
    let (env, nets, dir, name) = world("host_local_status_gc", "gc");
    let c = conf("1.1.0", &name, ipam(&dir, slash29(&nets)));
    call(&env, false, "STATUS", "", &c).run().ok_silent();
    for i in 0..5 {
        add(&env, false, &format!("ctr-{i}"), &c);
    }
    call(&env, false, "STATUS", "", &c)
        .run()
        .expect_err(50, &["no IP addresses available"]);
    let valid = merged(
        c.clone(),
        json!({"cni.dev/valid-attachments": [{"containerID": "ctr-1", "ifname": "eth0"},
                                              {"containerID": "ctr-3", "ifname": "eth0"}]}),
    );
    call(&env, false, "GC", "", &valid).run().ok_silent();
    assert_eq!(
        leases(&dir.join(&name)),
        BTreeSet::from([nets.v4_addr(3), nets.v4_addr(5)])
    );
    call(&env, false, "STATUS", "", &c).run().ok_silent();
    let old = merged(c.clone(), json!({"cniVersion": "1.0.0"}));
    call(&env, false, "GC", "", &old)
        .run()
        .expect_err(1, &["1.1.0"]);
}

/// Proves: bridge with `"ipam": {"type": "host-local"}` runs our host-local when CNI_PATH
/// finds our link first: the lease file names the container and eth0, traffic to the
/// gateway flows, CHECK passes, and DEL frees it; with CNI_PATH naming only the reference
/// directory, the reference host-local is run and its 1.1.0 refusal comes through.
#[test]
fn behind_bridge() {
    let (env, nets, dir, name) = world("host_local_behind_bridge", "br");
    let br = env.link_name("hlb");
    let c = json!({"cniVersion": "1.1.0", "name": name, "type": "bridge", "bridge": br,
        "isGateway": true, "ipam": ipam(&dir, nets.dual_ranges())});
    let pod = env.pod("bridge", &c);
    let net = dir.join(&name);
    assert_eq!(files(&net)[&nets.v4_addr(2)], format!("{}\r\neth0", pod.id));
    assert_ping(&pod.ns.name, &nets.v4_addr(1));
    pod.check(&pod.result);
    pod.del_twice();
    assert!(leases(&net).is_empty());

    let other = env.new_attachment("bridge", "ref", &c);
    let e = other
        .call("ADD")
        .env("CNI_PATH", REF_DIR)
        .run()
        .expect_err(1, &["host-local"]);
    assert!(
        e.msg.contains("1.1.0") || e.details.contains("1.1.0"),
        "{e:?}"
    );
    assert_only_lo(&other.ns, "the failed ADD");
}
