//! What the store hands out and takes back: exhaustion, idempotent ADD, DEL
//! of unknown keys, GC, STATUS, CHECK, requested addresses and ranges.

use super::*;

/// Proves: on a full pool ADD fails with code 103 and a message naming the
/// subnet and the count in use, allocates nothing, and a freed address can be
/// had again.
fn exhaustion(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let (conf, subnet) = fix.conf_29();
    let mut got = BTreeSet::new();
    for i in 0..5 {
        got.insert(only_addr(&fix.add(&format!("ex-{i}"), &conf).result()));
    }
    let want: BTreeSet<IpAddr> = (2..=6).map(|h| addr(&fix.nets.v4_addr(h))).collect();
    assert_eq!(got, want, "a /29 has .2–.6 to give (.1 is the gateway)");
    fix.add("ex-full", &conf)
        .expect_err(103, &[&format!("no free address in {subnet} (5 in use)")]);
    assert_eq!(fix.leases().len(), 5, "a failed ADD must allocate nothing");
    fix.call("CHECK", "ex-full", "eth0", &conf).run().err();
    fix.del("ex-3", &conf).ok_silent();
    let again = only_addr(&fix.add("ex-new", &conf).result());
    assert!(want.contains(&again), "{again}");
    assert_eq!(fix.leases().len(), 5);
}
both_modes!(exhaustion);

/// Proves: ADD of a key that holds a lease returns the same address (no
/// second lease); another ifname of the same container is another key.
fn idempotent_add(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let conf = fix.conf_24();
    let first = fix.add("idem", &conf).result();
    let second = fix.add("idem", &conf).result();
    assert_eq!(first, second, "repeated ADD must return the same result");
    let other = fix.call("ADD", "idem", "eth1", &conf).run().result();
    assert_ne!(only_addr(&other), only_addr(&first));
    let leases = fix.leases();
    assert_eq!(leases.len(), 2, "{leases:?}");
}
both_modes!(idempotent_add);

/// Proves: DEL of a key that holds nothing (twice, and in a network that has
/// no store yet) succeeds silently and changes nothing.
fn del_unknown_key(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let conf = fix.conf_24();
    fix.del("never-added", &conf).ok_silent();
    fix.add("kept", &conf).result();
    fix.del("never-added", &conf).ok_silent();
    fix.del("never-added", &conf).ok_silent();
    let mut other = conf.clone();
    other["name"] = json!("no-such-network");
    fix.del("never-added", &other).ok_silent();
    let leases = fix.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].cid, "kept");
}
both_modes!(del_unknown_key);

/// Proves: GC (1.1.0, `cni.dev/valid-attachments`) frees every lease of the
/// network not in the list, keeps the listed ones, prints nothing; the older
/// `cni.dev/attachments` key works too; another network is untouched.
fn gc_valid_list(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let conf = fix.conf("1.1.0", fix.ipam(fix.nets.v4_ranges()));
    for (cid, ifname) in [
        ("g1", "eth0"),
        ("g2", "eth0"),
        ("g3", "eth0"),
        ("g3", "eth1"),
    ] {
        fix.call("ADD", cid, ifname, &conf).run().result();
    }
    let mut other = conf.clone();
    other["name"] = json!("ipamd-other");
    fix.call("ADD", "g2", "eth0", &other).run().result();

    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "g1", "ifname": "eth0"},
        {"containerID": "g3", "ifname": "eth1"},
    ]);
    fix.net_call("GC", &gc).ok_silent();
    let keys: Vec<(String, String)> = fix
        .leases()
        .into_iter()
        .map(|l| (l.cid, l.ifname))
        .collect();
    assert_eq!(
        keys,
        vec![("g1".into(), "eth0".into()), ("g3".into(), "eth1".into())]
    );
    // Idempotent.
    fix.net_call("GC", &gc).ok_silent();
    assert_eq!(fix.leases().len(), 2);

    let mut old = conf.clone();
    old["cni.dev/attachments"] = json!([{"containerID": "g1", "ifname": "eth0"}]);
    fix.net_call("GC", &old).ok_silent();
    let left = fix.leases();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].cid, "g1");

    let others = list_leases(&fix.data, &fix.sock, "ipamd-other");
    assert_eq!(
        others.len(),
        1,
        "GC of {NET} touched another network: {others:?}"
    );
}
both_modes!(gc_valid_list);

/// Proves: STATUS succeeds silently while an ADD could succeed, fails with
/// code 50 on a full pool, and succeeds again once an address is freed.
fn status_full_pool(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let (conf, subnet) = fix.conf_29();
    let mut conf = conf;
    conf["cniVersion"] = json!("1.1.0");
    fix.net_call("STATUS", &conf).ok_silent();
    for i in 0..4 {
        fix.add(&format!("st-{i}"), &conf).result();
        fix.net_call("STATUS", &conf).ok_silent();
    }
    fix.add("st-4", &conf).result();
    fix.net_call("STATUS", &conf)
        .expect_err(50, &["no free address", &subnet]);
    fix.del("st-2", &conf).ok_silent();
    fix.net_call("STATUS", &conf).ok_silent();
    if mode == Mode::InProcess {
        // An unusable store (dataDir is a file) cannot serve ADD either.
        let file = fix.env.dir("notadir").join("file");
        std::fs::write(&file, "x").expect("write file");
        conf["ipam"]["dataDir"] = json!(file);
        fix.net_call("STATUS", &conf).expect_err(50, &[]);
    }
}
both_modes!(status_full_pool);

/// Proves: CHECK passes with the ADD's own result as prevResult, fails when
/// prevResult carries another address, when the key holds nothing, and after DEL.
fn check_prev_result(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let conf = fix.conf_24();
    let r = fix.add("chk", &conf).result();
    let check = |cid: &str, prev: &Value| {
        fix.call("CHECK", cid, "eth0", &with_prev(&conf, prev))
            .run()
    };
    check("chk", &r).ok_silent();

    let mut wrong = r.clone();
    wrong["ips"][0]["address"] = json!(format!("{}/24", fix.nets.v4_addr(200)));
    check("chk", &wrong).expect_err(103, &["prevResult"]);

    check("nobody", &r).expect_err(103, &["no lease"]);
    fix.del("chk", &conf).ok_silent();
    check("chk", &r).expect_err(103, &["no lease"]);
}
both_modes!(check_prev_result);

/// Proves: a requested address (`CNI_ARGS IP=`, also v4+v6 comma separated,
/// and `runtimeConfig.ips`) is honoured, and refused with code 103 when
/// another attachment holds it or it is outside the ranges — nothing allocated.
fn requested_ip(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = &fix.nets;
    let conf = fix.conf("1.0.0", fix.ipam(nets.dual_ranges()));
    let v4 = nets.v4_addr(7);
    // Canonical text (the harness writes `fdcb:P:0::x` for N = 0).
    let v6 = addr(&nets.v6_addr(0x77)).to_string();
    let add_with_args =
        |cid: &str, args: &str| fix.call("ADD", cid, "eth0", &conf).cni_args(args).run();

    let r = add_with_args("req-a", &format!("IgnoreUnknown=1;IP={v4},{v6}")).result();
    assert_eq!(
        result_addresses(&r),
        vec![format!("{v4}/24"), format!("{v6}/64")],
        "{r}"
    );
    add_with_args("req-b", &format!("IP={v4}")).expect_err(103, &[&v4, "held by"]);
    add_with_args("req-b", "IP=192.0.2.9").expect_err(103, &["192.0.2.9", "not in any range set"]);

    // runtimeConfig.ips (capability "ips"), with a prefix as CONVENTIONS allows.
    let v4b = nets.v4_addr(9);
    let mut rc = conf.clone();
    rc["runtimeConfig"] = json!({ "ips": [format!("{v4b}/24")] });
    let r = fix.add("req-c", &rc).result();
    assert_eq!(first_addr(&r, false), v4b, "{r}");
    fix.add("req-d", &rc).expect_err(103, &[&v4b, "held by"]);

    // args.cni.ips (CONVENTIONS), v6 this time.
    let v6b = addr(&nets.v6_addr(0x99)).to_string();
    let mut ac = conf.clone();
    ac["args"] = json!({ "cni": { "ips": [v6b] } });
    let r = fix.add("req-e", &ac).result();
    assert_eq!(first_addr(&r, true), v6b, "{r}");

    let keys: BTreeSet<String> = fix.leases().into_iter().map(|l| l.cid).collect();
    assert_eq!(
        keys,
        ["req-a", "req-c", "req-e"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        "refused ADDs must allocate nothing"
    );
    // Two leases per dual-stack attachment.
    assert_eq!(fix.leases().len(), 6);
}
both_modes!(requested_ip);

/// Proves: `runtimeConfig.ipRanges` (capability `ipRanges`) goes in front of the
/// configured range sets, as host-local puts it: one address from the runtime's set
/// first, then one from the configured set; with a cluster `pool` instead of ranges the
/// runtime's ranges replace the pool (no etcd needed).
fn ip_ranges_capability(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let other = fix.env.subnets();
    let mut conf = fix.conf_24();
    conf["runtimeConfig"] = json!({ "ipRanges": [[{
        "subnet": other.v4,
        "rangeStart": other.v4_addr(50),
        "rangeEnd": other.v4_addr(60),
    }]] });
    let r = fix.add("rng", &conf).result();
    assert_eq!(
        result_addresses(&r),
        vec![
            format!("{}/24", other.v4_addr(50)),
            format!("{}/24", fix.nets.v4_addr(2))
        ]
    );
    assert_eq!(r["ips"][0]["gateway"], json!(other.v4_addr(1)));
    assert_eq!(r["ips"][1]["gateway"], json!(fix.nets.v4_addr(1)));
    // Without the capability the configured set alone; the runtime's set overlapping the
    // configured one is refused, naming both (as host-local refuses it).
    let plain = fix.add("rng-plain", &fix.conf_24()).result();
    assert_eq!(result_addresses(&plain).len(), 1, "{plain}");
    let mut overlap = fix.conf_24();
    overlap["runtimeConfig"] = json!({"ipRanges": [[{"subnet": fix.nets.v4}]]});
    fix.add("rng-overlap", &overlap)
        .expect_err(7, &["ipam.ranges[0]", "overlaps ipam.ranges[1]"]);

    let mut pool = fix.conf(
        "1.0.0",
        json!({"type": "ipamd", "dataDir": fix.data,
        "socket": fix.sock, "pool": "nowhere"}),
    );
    pool["runtimeConfig"] = conf["runtimeConfig"].clone();
    let r = fix.add("rng-pool", &pool).result();
    assert_eq!(
        result_addresses(&r),
        vec![format!("{}/24", other.v4_addr(51))]
    );
}
both_modes!(ip_ranges_capability);
