use serde_json::json;

use super::validate::MAX_RANGES;
use super::*;
use crate::ErrorKind;

fn err(v: serde_json::Value) -> String {
    let e = IpamConfig::from_json(&v).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    e.to_string()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn flat_subnet_gets_host_local_defaults() {
    let c = IpamConfig::from_json(&json!({"type": "ipamd", "subnet": "10.22.0.0/24"})).unwrap();
    assert_eq!(c.range_sets.len(), 1);
    let r = &c.range_sets[0][0];
    assert_eq!(r.gateway, Some(ip("10.22.0.1")));
    assert_eq!(r.range_start, Some(ip("10.22.0.1")));
    assert_eq!(r.range_end, Some(ip("10.22.0.254")));
    assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
    assert_eq!(c.resolv_conf, None);
    assert!(c.routes.is_empty());
}

#[test]
fn v6_range_end_is_last_address() {
    let c = IpamConfig::from_json(&json!({"ranges": [[{"subnet": "fd00::/120"}]]})).unwrap();
    assert_eq!(c.range_sets[0][0].range_end, Some(ip("fd00::ff")));
    assert_eq!(c.range_sets[0][0].gateway, Some(ip("fd00::1")));
}

#[test]
fn flat_form_comes_before_ranges_and_all_keys_parse() {
    let c = IpamConfig::from_json(&json!({
        "subnet": "10.1.0.0/16", "rangeStart": "10.1.2.0", "rangeEnd": "10.1.2.255", "gateway": "10.1.0.254",
        "ranges": [[{"subnet": "fd00::/64"}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.1"}],
        "dataDir": "/tmp/x", "socket": "/tmp/s.sock", "resolvConf": "/etc/resolv.conf"
    }))
    .unwrap();
    assert_eq!(c.range_sets.len(), 2);
    assert_eq!(c.range_sets[0][0].range_start, Some(ip("10.1.2.0")));
    assert_eq!(c.range_sets[0][0].gateway, Some(ip("10.1.0.254")));
    assert!(c.range_sets[1][0].subnet.addr().is_ipv6());
    assert_eq!(c.routes[1].gw, Some(ip("10.1.0.1")));
    assert_eq!(c.routes[0].gw, None);
    assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
    assert_eq!(c.socket, PathBuf::from("/tmp/s.sock"));
    assert_eq!(c.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
}

#[test]
fn no_ranges_is_allowed_for_runtime_ip_ranges() {
    let c = IpamConfig::from_json(&json!({"type": "ipamd"})).unwrap();
    assert!(c.range_sets.is_empty());
}

#[test]
fn errors_name_key_and_value() {
    assert_eq!(
        err(json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"}]]})),
        "ipam.ranges[0][0].rangeStart 10.0.1.5 is outside subnet 10.0.0.0/24"
    );
    assert_eq!(
        err(json!({"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.5"})),
        "ipam.rangeEnd 10.0.1.5 is outside subnet 10.0.0.0/24"
    );
    assert_eq!(
        err(json!({"subnet": "10.0.0.0/24", "gateway": "fd00::1"})),
        "ipam.gateway fd00::1 is not of the address family of subnet 10.0.0.0/24"
    );
    assert!(
        err(json!({"subnet": "10.0.0/24"})).starts_with("ipam.subnet \"10.0.0/24\" is not a CIDR")
    );
    assert!(err(json!({"subnet": "10.0.0.5/24"}))
        .contains("has host bits set (the network is 10.0.0.0/24)"));
    assert!(err(
        json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.50", "rangeEnd": "10.0.0.40"})
    )
    .contains("rangeStart 10.0.0.50 is after ipam.rangeEnd 10.0.0.40"));
    assert!(err(json!({"subnet": "10.0.0.0/24", "rangeStart": "nope"}))
        .contains("ipam.rangeStart \"nope\" is not an IP address"));
    assert!(err(json!({"routes": [{"gw": "10.0.0.1"}]})).contains("ipam.routes[0].dst is missing"));
    assert!(
        err(json!({"routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]}))
            .contains("same address family")
    );
    assert!(err(json!({"ranges": [[]]})).contains("ipam.ranges[0] is an empty range set"));
    assert!(
        err(json!({"ranges": {"subnet": "10.0.0.0/24"}})).contains("ipam.ranges must be a list")
    );
    assert!(err(json!({"dataDir": 5})).contains("ipam.dataDir must be a string"));
}

#[test]
fn tiny_subnets_refused_like_host_local() {
    assert!(err(json!({"subnet": "10.0.0.0/31"})).contains("ipam.subnet 10.0.0.0/31 is too small"));
    assert!(err(json!({"subnet": "10.0.0.1/32"})).contains("is too small"));
    assert!(err(json!({"ranges": [[{"subnet": "fd00::/127"}]]})).contains("is too small"));
    assert!(IpamConfig::from_json(&json!({"subnet": "10.0.0.0/30"})).is_ok());
}

#[test]
fn overlaps_refused() {
    let e = err(json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/25"}]]}));
    assert!(
        e.contains("ipam.ranges[0]") && e.contains("overlaps ipam.ranges[1]"),
        "{e}"
    );
    let e = err(
        json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.100"}]]}),
    );
    assert!(
        e.contains("ipam.ranges[0][0]") && e.contains("overlaps ipam.ranges[0][1]"),
        "{e}"
    );
    let e = err(json!({"subnet": "10.0.0.0/16", "ranges": [[{"subnet": "10.0.5.0/24"}]]}));
    assert!(
        e.contains("ipam.subnet") && e.contains("overlaps ipam.ranges[0]"),
        "{e}"
    );
    // Disjoint bounds within one subnet are fine, and so is dual-stack.
    assert!(IpamConfig::from_json(&json!({"ranges": [
        [{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.99"}, {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.100"}],
        [{"subnet": "fd00::/64"}]
    ]}))
    .is_ok());
    let e = err(json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}));
    assert!(e.contains("mixes address families"), "{e}");
}

#[test]
fn runtime_ip_ranges() {
    let sets = IpamConfig::ranges_from_json(
        &json!([[{"subnet": "10.5.0.0/24"}], [{"subnet": "fd05::/64"}]]),
    )
    .unwrap();
    assert_eq!(sets.len(), 2);
    assert_eq!(sets[0][0].gateway, Some(ip("10.5.0.1")));
    let e = IpamConfig::ranges_from_json(
        &json!([[{"subnet": "10.5.0.0/24", "rangeStart": "10.6.0.1"}]]),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "runtimeConfig.ipRanges[0][0].rangeStart 10.6.0.1 is outside subnet 10.5.0.0/24"
    );
}

/// A gateway outside its subnet is kept as given, as the reference keeps it (link-local
/// gateways of ptp and ipvlan L3); rangeStart and rangeEnd still must be inside.
#[test]
fn gateway_may_be_outside_the_subnet() {
    let c = IpamConfig::from_json(&json!({"subnet": "10.22.0.0/24", "gateway": "169.254.1.1"}))
        .unwrap();
    let r = &c.range_sets[0][0];
    assert_eq!(r.gateway, Some(ip("169.254.1.1")));
    assert_eq!(
        (r.range_start, r.range_end),
        (Some(ip("10.22.0.1")), Some(ip("10.22.0.254")))
    );
    let sets =
        IpamConfig::ranges_from_json(&json!([[{"subnet": "fd22::/64", "gateway": "fe80::1"}]]))
            .unwrap();
    assert_eq!(sets[0][0].gateway, Some(ip("fe80::1")));
    // Over the wire too: the daemon revalidates with the same rules.
    assert!(canonicalize_range_sets(&c.range_sets).is_ok());
    // The gateway then takes no address of the range: .1 is handed out.
    let pool = crate::pool::Pool::new(&c.range_sets[0]);
    assert_eq!(pool.range_for(ip("10.22.0.1")), Some(0));
}

/// `dataDir: ""`, `resolvConf: ""` (and `socket: ""`) are not set, as the reference reads
/// its two.
#[test]
fn empty_paths_are_not_set() {
    let c = IpamConfig::from_json(
        &json!({"subnet": "10.1.0.0/24", "dataDir": "", "resolvConf": "", "socket": ""}),
    )
    .unwrap();
    assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
    assert_eq!(c.resolv_conf, None);
}

/// The flat range's keys without `subnet` are ignored, as the reference ignores them, and
/// named for the plugin to say so.
#[test]
fn flat_range_keys_without_subnet_are_ignored() {
    let c = IpamConfig::from_json(&json!({
        "rangeStart": "10.0.0.5", "gateway": "10.0.0.1", "rangeEnd": null,
        "ranges": [[{"subnet": "10.0.0.0/24"}]]
    }))
    .unwrap();
    assert_eq!(c.ignored, ["ipam.rangeStart", "ipam.gateway"]);
    assert_eq!(c.range_sets.len(), 1);
    assert_eq!(c.range_sets[0][0].range_start, Some(ip("10.0.0.1")));
    let c =
        IpamConfig::from_json(&json!({"subnet": "10.0.0.0/24", "gateway": "10.0.0.9"})).unwrap();
    assert!(c.ignored.is_empty());
}

/// A route keeps the reference's `types.Route` fields: metrics of 0 or less are not set
/// (the reference's interface plugins never pass them on), table and scope are kept as
/// given, 0 included; fractions, and values no kernel field holds, are refused.
#[test]
fn route_fields() {
    let c = IpamConfig::from_json(&json!({"routes": [
        {"dst": "0.0.0.0/0", "gw": "10.1.0.1", "mtu": 1400, "advmss": 1360, "priority": 100,
         "table": 100, "scope": 0},
        {"dst": "0.0.0.0/0", "priority": 0, "mtu": -1, "table": 0, "scope": 253},
        {"dst": "::/0", "priority": 4294967295u64, "table": -5}
    ]}))
    .unwrap();
    let r = &c.routes;
    assert_eq!(
        (r[0].mtu, r[0].advmss, r[0].priority, r[0].table, r[0].scope),
        (Some(1400), Some(1360), Some(100), Some(100), Some(0))
    );
    assert_eq!(
        (r[1].mtu, r[1].advmss, r[1].priority, r[1].table, r[1].scope),
        (None, None, None, Some(0), Some(253))
    );
    assert_eq!((r[2].priority, r[2].table), (Some(u32::MAX), None));
    for (route, needle) in [
        (
            json!({"dst": "0.0.0.0/0", "priority": 1.5}),
            "ipam.routes[0].priority must be a whole number",
        ),
        (
            json!({"dst": "0.0.0.0/0", "mtu": "1400"}),
            "ipam.routes[0].mtu must be a whole number",
        ),
        (
            json!({"dst": "0.0.0.0/0", "table": 4294967296u64}),
            "up to 4294967295",
        ),
        (
            json!({"dst": "0.0.0.0/0", "scope": 256}),
            "ipam.routes[0].scope must be",
        ),
        (
            json!({"dst": "0.0.0.0/0", "scope": -1}),
            "from 0 to 255, got -1",
        ),
    ] {
        let e = err(json!({"routes": [route]}));
        assert!(e.contains(needle), "{e}");
    }
    // On the wire and back, unset fields stay out.
    let v = serde_json::to_value(&r[1]).unwrap();
    assert_eq!(v, json!({"dst": "0.0.0.0/0", "table": 0, "scope": 253}));
    let old: RouteSpec = serde_json::from_value(json!({"dst": "10.0.0.0/8"})).unwrap();
    assert_eq!((old.priority, old.table), (None, None));
}

#[test]
fn wire_range_sets_revalidated() {
    assert_eq!(
        canonicalize_range_sets(&[]).unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
    let bad = vec![vec![Range {
        subnet: "10.0.0.0/24".parse().unwrap(),
        range_start: Some(ip("10.0.0.9")),
        range_end: Some(ip("10.0.0.2")),
        gateway: None,
    }]];
    assert!(canonicalize_range_sets(&bad)
        .unwrap_err()
        .to_string()
        .starts_with("rangeSets[0][0].rangeStart"));
}

#[test]
fn range_serde_is_camel_case() {
    let r: Range =
        serde_json::from_value(json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.5"})).unwrap();
    assert_eq!(r.range_start, Some(ip("10.0.0.5")));
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v,
        json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.5"})
    );
}

#[test]
fn resolv_conf() {
    let d = resolv::parse_resolv_text(
        "# comment\nnameserver 10.0.0.2\nnameserver fd00::53\n; other\ndomain example.org\nsearch a.example b.example\noptions ndots:2 edns0\n",
    );
    assert_eq!(d.nameservers, vec!["10.0.0.2", "fd00::53"]);
    assert_eq!(d.domain, "example.org");
    assert_eq!(d.search, vec!["a.example", "b.example"]);
    assert_eq!(d.options, vec!["ndots:2", "edns0"]);
    let e = parse_resolv_conf(std::path::Path::new("/nonexistent/resolv.conf")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(e
        .to_string()
        .starts_with("ipam.resolvConf /nonexistent/resolv.conf"));
}

/// `n` disjoint /30s in 10.0.0.0/8, each its own range in one set.
fn many_ranges(n: usize) -> serde_json::Value {
    let ranges: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let (b, c, d) = ((i >> 14) & 0xff, (i >> 6) & 0xff, (i & 0x3f) << 2);
            json!({"subnet": format!("10.{b}.{c}.{d}/30")})
        })
        .collect();
    json!([ranges])
}

#[test]
fn range_count_is_capped() {
    let e = IpamConfig::ranges_from_json(&many_ranges(30_000)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(
        e.to_string().contains(&format!(
            "30000 ranges given (starting at runtimeConfig.ipRanges[0]); at most {MAX_RANGES} ranges"
        )),
        "{e}"
    );
    let e = canonicalize_range_sets(
        &IpamConfig::ranges_from_json(&many_ranges(MAX_RANGES)).unwrap()[..1]
            .iter()
            .chain(
                IpamConfig::ranges_from_json(&many_ranges(1))
                    .unwrap()
                    .iter(),
            )
            .cloned()
            .collect::<Vec<_>>(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("ranges given"), "{e}");
}

#[test]
fn the_cap_many_ranges_validate_and_overlaps_among_them_are_found() {
    let sets = IpamConfig::ranges_from_json(&many_ranges(MAX_RANGES)).unwrap();
    assert_eq!(sets[0].len(), MAX_RANGES);
    // The same list in reverse, with the last range also covering the first one's bounds:
    // the sort must pair them although they are far apart in the list.
    let mut v = many_ranges(MAX_RANGES - 1);
    let list = v[0].as_array_mut().unwrap();
    list.reverse();
    list.push(json!({"subnet": "10.0.0.0/29"}));
    let e = IpamConfig::ranges_from_json(&v).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "runtimeConfig.ipRanges[0][{}] (10.0.0.0/30 10.0.0.1-10.0.0.2) overlaps runtimeConfig.ipRanges[0][{}] (10.0.0.0/29",
            MAX_RANGES - 2,
            MAX_RANGES - 1
        )),
        "{e}"
    );
    // Across sets, the sets are named.
    let e = err(
        json!({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "10.2.0.0/24"}], [{"subnet": "10.3.0.0/24"}, {"subnet": "10.2.0.128/25"}]]}),
    );
    assert!(
        e.starts_with("ipam.ranges[0] (10.2.0.0/24 10.2.0.1-10.2.0.254) overlaps ipam.ranges[1] (10.2.0.128/25"),
        "{e}"
    );
}

#[test]
fn leading_zero_octets_refused_wherever_addresses_are_parsed() {
    let cases = [
        (
            json!({"subnet": "10.95.040.0/24"}),
            "ipam.subnet \"10.95.040.0/24\"",
        ),
        (
            json!({"subnet": "10.95.40.0/24", "rangeStart": "10.95.40.010"}),
            "ipam.rangeStart \"10.95.40.010\"",
        ),
        (
            json!({"subnet": "10.95.40.0/24", "rangeEnd": "10.95.40.09"}),
            "ipam.rangeEnd \"10.95.40.09\"",
        ),
        (
            json!({"subnet": "10.95.40.0/24", "gateway": "10.95.40.01"}),
            "ipam.gateway \"10.95.40.01\"",
        ),
        (
            json!({"ranges": [[{"subnet": "010.1.0.0/16"}]]}),
            "ipam.ranges[0][0].subnet \"010.1.0.0/16\"",
        ),
        (
            json!({"routes": [{"dst": "10.0.00.0/16"}]}),
            "ipam.routes[0].dst \"10.0.00.0/16\"",
        ),
        (
            json!({"routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.01"}]}),
            "ipam.routes[0].gw \"10.0.0.01\"",
        ),
        (
            json!({"ranges": [[{"subnet": "::ffff:10.0.0.0/120", "rangeStart": "::ffff:10.0.0.05"}]]}),
            "ipam.ranges[0][0].rangeStart \"::ffff:10.0.0.05\"",
        ),
    ];
    for (cfg, named) in cases {
        let e = err(cfg);
        assert!(e.starts_with(named) && e.contains("leading zero"), "{e}");
    }
    let e = IpamConfig::ranges_from_json(&json!([[{"subnet": "10.95.040.0/24"}]])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(
        e.to_string()
            .contains("runtimeConfig.ipRanges[0][0].subnet"),
        "{e}"
    );
    // Over the wire (the daemon's requests) too.
    let wire: Result<Range, _> = serde_json::from_value(json!({"subnet": "10.95.040.0/24"}));
    assert!(wire.unwrap_err().to_string().contains("leading zero"));
    let wire: Result<Range, _> =
        serde_json::from_value(json!({"subnet": "10.95.40.0/24", "rangeStart": "10.95.40.05"}));
    assert!(wire.is_err());
    // A lone 0 octet is fine.
    assert!(
        IpamConfig::from_json(&json!({"subnet": "10.0.0.0/24", "gateway": "10.0.0.1"})).is_ok()
    );
}

#[test]
fn resolv_conf_only_from_bounded_regular_files() {
    let d = tempfile::Builder::new()
        .prefix("ipamd-test-resolv-")
        .tempdir()
        .unwrap();
    let real = d.path().join("real.conf");
    std::fs::write(&real, "nameserver 10.0.0.2\n").unwrap();
    // A link to a regular file is followed, as /etc/resolv.conf often is one.
    let link = d.path().join("link.conf");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_eq!(parse_resolv_conf(&link).unwrap().nameservers, ["10.0.0.2"]);

    // A FIFO with no writer would block a plain open forever.
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let fifo_link = d.path().join("fifo-link");
    std::os::unix::fs::symlink(&fifo, &fifo_link).unwrap();
    let big = d.path().join("big.conf");
    std::fs::write(&big, "# padding\n".repeat(7000)).unwrap();
    for (path, why) in [
        (fifo.as_path(), "is not a regular file"),
        (fifo_link.as_path(), "is not a regular file"),
        (std::path::Path::new("/dev/zero"), "is not a regular file"),
        (d.path(), "is not a regular file"),
        (big.as_path(), "is larger than 65536 bytes"),
    ] {
        let e = parse_resolv_conf(path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("ipam.resolvConf {}: ", path.display()))
                && e.to_string().contains(why),
            "{e}"
        );
    }
}

#[test]
fn cluster_pools_replace_ranges() {
    let c = IpamConfig::from_json(&json!({"type": "ipamd", "pool": "v4pool"})).unwrap();
    assert_eq!(c.pools, vec!["v4pool".to_string()]);
    assert!(c.range_sets.is_empty());
    let c = IpamConfig::from_json(&json!({"pools": ["v4pool", "v6pool"]})).unwrap();
    assert_eq!(c.pools.len(), 2);
    assert!(err(json!({"pool": "p", "subnet": "10.0.0.0/24"})).contains("exclusive"));
    assert!(err(json!({"pool": "p", "pools": ["q"]})).contains("exclusive"));
    assert!(err(json!({"pools": []})).contains("ipam.pools is empty"));
    assert!(err(json!({"pool": "a/b"})).starts_with("ipam.pool \"a/b\""));
    assert!(err(json!({"pools": [1]})).starts_with("ipam.pools[0] must be a pool name"));
}
