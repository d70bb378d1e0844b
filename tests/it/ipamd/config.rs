//! The configuration: result layouts per version, resolvConf, invalid keys,
//! and network names that try to leave the data directory.

use super::*;

/// Proves: a network name with `../` is refused with code 7 and nothing is
/// created outside dataDir; the daemon itself refuses such a name with 400.
fn traversal_name(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let base = fix.data.parent().expect("data has a parent").to_path_buf();
    for name in ["../evil", "a/../../evil", "/tmp/evil"] {
        let mut conf = fix.conf_24();
        conf["name"] = json!(name);
        for cmd in ["ADD", "DEL"] {
            fix.call(cmd, "trav", "eth0", &conf)
                .run()
                .expect_err(7, &[]);
        }
        let mut status = conf.clone();
        status["cniVersion"] = json!("1.1.0");
        fix.net_call("STATUS", &status).expect_err(7, &[]);
    }
    assert!(!base.join("evil").exists());
    let listing: Vec<_> = std::fs::read_dir(&base)
        .expect("list test dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(
        listing.iter().all(|n| n == "data"
            || n == "d.sock"
            || n == "plugin-calls.sock"
            || n.to_string_lossy().starts_with("daemon-")),
        "unexpected files next to dataDir: {listing:?}"
    );
    if mode == Mode::Daemon {
        let body = json!({
            "key": {"network": "../evil", "containerId": "c", "ifname": "eth0"},
            "rangeSets": [[{"subnet": fix.nets.v4}]],
        })
        .to_string();
        let (code, text) =
            http(&fix.sock, "POST", "/v1/allocate", Some(&body)).expect("daemon answers");
        assert_eq!(code, 400, "{text}");
        assert!(text.contains("invalid_config"), "{text}");
        let (code, text) =
            http(&fix.sock, "GET", "/v1/leases?network=../evil", None).expect("daemon answers");
        assert_eq!(code, 400, "{text}");
        assert!(!base.join("evil").exists() && !fix.data.join("..").join("evil").exists());
    }
}
both_modes!(traversal_name);

/// Proves: the result has the layout of the requested version — 0.2.0
/// `ip4`/`ip6` blocks with their routes, 0.4.0 `ips[]` tagged with `version`,
/// 1.0.0 `ips[]` without it — with the gateways and routes of the config.
fn result_layouts(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let nets = &fix.nets;
    let mut ipam = fix.ipam(nets.dual_ranges());
    ipam["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "192.0.2.0/24", "gw": nets.v4_addr(254)}]);
    let (gw4, gw6) = (nets.v4_addr(1), addr(&nets.v6_addr(1)).to_string());
    for (i, version) in ["0.2.0", "0.4.0", "1.0.0"].into_iter().enumerate() {
        let conf = fix.conf(version, ipam.clone());
        let r = fix.add(&format!("lay-{i}"), &conf).result();
        assert_eq!(r["cniVersion"], version, "{r}");
        match version {
            "0.2.0" => {
                assert_eq!(keys(&r), ["cniVersion", "dns", "ip4", "ip6"], "{r}");
                let ip4 = addr(r["ip4"]["ip"].as_str().expect("ip4.ip"));
                assert!(
                    r["ip4"]["ip"].as_str().is_some_and(|s| s.ends_with("/24")),
                    "{r}"
                );
                assert!(ip4.is_ipv4());
                assert_eq!(r["ip4"]["gateway"], json!(gw4), "{r}");
                assert_eq!(
                    r["ip4"]["routes"],
                    json!([{"dst": "0.0.0.0/0"}, {"dst": "192.0.2.0/24", "gw": nets.v4_addr(254)}]),
                    "{r}"
                );
                assert!(
                    r["ip6"]["ip"].as_str().is_some_and(|s| s.ends_with("/64")),
                    "{r}"
                );
                assert_eq!(r["ip6"]["gateway"], json!(gw6), "{r}");
                assert_eq!(r["ip6"]["routes"], json!([{"dst": "::/0"}]), "{r}");
            }
            _ => {
                assert_eq!(keys(&r), ["cniVersion", "dns", "ips", "routes"], "{r}");
                let ips = r["ips"].as_array().expect("ips");
                assert_eq!(ips.len(), 2, "{r}");
                for (ip, (v, gw)) in ips.iter().zip([("4", &gw4), ("6", &gw6)]) {
                    let mut want = vec!["address", "gateway"];
                    if version == "0.4.0" {
                        assert_eq!(ip["version"], v, "{r}");
                        want.push("version");
                    }
                    assert_eq!(keys(ip), want, "{r}");
                    assert_eq!(ip["gateway"], json!(gw), "{r}");
                    assert!(ip.get("interface").is_none(), "IPAM sets no interface: {r}");
                }
                assert_eq!(r["routes"], ipam["routes"], "{r}");
            }
        }
        assert_eq!(r["dns"], json!({}), "{r}");
    }
}
both_modes!(result_layouts);

/// Proves: `resolvConf` is parsed into the result's `dns` (nameservers,
/// domain, search, options; comments ignored); a missing file is error 7.
fn resolv_conf_dns(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let path = fix.env.dir("resolv").join("resolv.conf");
    std::fs::write(
        &path,
        "# generated\nnameserver 192.0.2.53\nnameserver 2001:db8::53\n; comment\n\
         domain example.test\nsearch a.example.test b.example.test\noptions ndots:2 timeout:1\n",
    )
    .expect("write resolv.conf");
    let mut ipam = fix.ipam(fix.nets.v4_ranges());
    ipam["resolvConf"] = json!(path);
    let r = fix.add("dns", &fix.conf("1.0.0", ipam.clone())).result();
    assert_eq!(
        r["dns"],
        json!({
            "nameservers": ["192.0.2.53", "2001:db8::53"],
            "domain": "example.test",
            "search": ["a.example.test", "b.example.test"],
            "options": ["ndots:2", "timeout:1"],
        }),
        "{r}"
    );
    let r = fix.add("dns", &fix.conf("0.2.0", ipam.clone())).result();
    assert_eq!(
        r["dns"]["nameservers"],
        json!(["192.0.2.53", "2001:db8::53"]),
        "{r}"
    );

    ipam["resolvConf"] = json!(fix.data.join("no-such-resolv.conf"));
    fix.add("dns2", &fix.conf("1.0.0", ipam))
        .expect_err(7, &["resolvConf"]);
}
both_modes!(resolv_conf_dns);

/// Proves: invalid `ipam` keys are error 7 naming the key and value.
fn invalid_config(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let v4 = &fix.nets.v4;
    let bad = [
        (json!([[{"subnet": "10.9.9.1/24"}]]), "10.9.9.1/24"),
        (json!([[{"subnet": "10.9.9.0/31"}]]), "/31"),
        (json!([[{"subnet": v4, "gateway": "fd00::1"}]]), "fd00::1"),
        (
            json!([[{"subnet": v4, "rangeStart": "192.0.2.1"}]]),
            "rangeStart",
        ),
        (json!([[{"subnet": v4}], [{"subnet": v4}]]), "overlap"),
    ];
    for (ranges, needle) in bad {
        let conf = fix.conf("1.0.0", fix.ipam(ranges));
        fix.add("bad", &conf).expect_err(7, &[needle]);
    }
    assert!(fix.leases().is_empty());
}
both_modes!(invalid_config);

/// Proves: routes keep the reference's `types.Route` fields: the 1.1.0 result has each
/// route's `priority`, `mtu`, `advmss`, `table` and `scope` as configured (also spelled
/// the Go way), a 1.0.0 result each route's `dst` and `gw`; the daemon is never told
/// about routes (the plugin adds them to the result), so both modes agree.
fn route_fields(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let gw = fix.nets.v4_addr(1);
    let mut ipam = fix.ipam(fix.nets.v4_ranges());
    ipam["routes"] = json!([
        {"dst": "0.0.0.0/0", "gw": gw, "priority": 100, "mtu": 1400, "table": 100, "scope": 0},
        {"dst": "0.0.0.0/0", "gw": gw, "Priority": 200, "ADVMSS": 1360},
    ]);
    let r = fix.add("rt-11", &fix.conf("1.1.0", ipam.clone())).result();
    assert_eq!(
        r["routes"],
        json!([
            {"dst": "0.0.0.0/0", "gw": gw, "mtu": 1400, "priority": 100, "table": 100, "scope": 0},
            {"dst": "0.0.0.0/0", "gw": gw, "advmss": 1360, "priority": 200},
        ]),
        "{r}"
    );
    let r = fix.add("rt-10", &fix.conf("1.0.0", ipam)).result();
    let routes = r["routes"].as_array().expect("routes");
    assert_eq!(routes.len(), 2, "{r}");
    assert!(
        routes
            .iter()
            .all(|x| x["dst"] == "0.0.0.0/0" && x["gw"] == json!(gw)),
        "{r}"
    );
}
both_modes!(route_fields);

/// Proves: `dataDir: ""` and `resolvConf: ""` mean not set, as in the reference (they
/// were code 7): ADD, CHECK and DEL work, with no `dns` in the result, and the lease is
/// in the default data directory (a tmpfs of the test namespace), which the daemon must
/// then serve too.
fn empty_paths_are_not_set(mode: Mode, test: &str) {
    let mut fix = Fix::new(test, mode);
    let default = Path::new("/var/lib/cni/ipamd");
    if mode == Mode::Daemon {
        fix.stop_daemon();
        fix.daemon = Some(Daemon::start(&fix.sock, default, &[], &[]));
    }
    let mut ipam = fix.ipam(fix.nets.v4_ranges());
    ipam["dataDir"] = json!("");
    ipam["resolvConf"] = json!("");
    let conf = fix.conf("1.0.0", ipam);
    // Both modes share the default store: each has its own container.
    let cid = format!("empty-{test}");
    let r = fix.add(&cid, &conf).result();
    assert_eq!(r["dns"], json!({}), "{r}");
    let check = || fix.call("CHECK", &cid, "eth0", &with_prev(&conf, &r)).run();
    check().ok_silent();
    let held = |l: &Lease| l.cid == cid && l.addr == only_addr(&r);
    assert!(list_leases(default, &fix.sock, NET).iter().any(held));
    fix.del(&cid, &conf).ok_silent();
    check().expect_err(103, &[]);
}
both_modes!(empty_paths_are_not_set);

/// Proves: a gateway outside the subnet (link-local, as for ptp or ipvlan L3) is taken as
/// the reference takes it: it is the result's gateway and takes no address of the range,
/// so the subnet's first address is handed out.
fn gateway_outside_the_subnet(mode: Mode, test: &str) {
    let fix = Fix::new(test, mode);
    let ranges = json!([[{"subnet": fix.nets.v4, "gateway": "169.254.1.1"}]]);
    let r = fix.add("gw", &fix.conf("1.0.0", fix.ipam(ranges))).result();
    assert_eq!(r["ips"][0]["gateway"], "169.254.1.1", "{r}");
    assert_eq!(only_addr(&r), addr(&fix.nets.v4_addr(1)), "{r}");
}
both_modes!(gateway_outside_the_subnet);
