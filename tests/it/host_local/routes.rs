//! What host-local takes from the reference v1.9.1 that Debian's 1.1.1 lacks or that cnikit
//! used to refuse: routes with `types.Route`'s metrics, table and scope (in results and,
//! behind bridge, in the pod), a gateway outside the subnet, and the flat range's keys
//! next to `ranges` without `subnet`.

use super::*;

/// `ip -j ARGS` inside netns `ns`, parsed.
fn ip_json_in(ns: &str, args: &[&str]) -> Vec<Value> {
    let mut full = vec!["-n", ns, "-j"];
    full.extend_from_slice(args);
    let out = ip(&full);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("ip {full:?} printed {out:?}: {e}"))
}

/// Proves: a route's `priority`, `mtu`, `advmss`, `table` and `scope` (Go-spelled keys
/// too) come back in the 1.1.0 result as configured, metrics of 0 left out and a table
/// of 0 kept, as the reference returns its routes; a 1.0.0 result has every route with
/// its `dst` and `gw`.
#[test]
fn route_fields_reach_the_result() {
    let (env, nets, dir, name) = world("host_local_route_fields", "rf");
    let gw = nets.v4_addr(1);
    let mut i = ipam(&dir, nets.v4_ranges());
    i["routes"] = json!([
        {"dst": "0.0.0.0/0", "gw": gw, "priority": 100, "mtu": 1400, "table": 100, "scope": 0},
        {"dst": "10.99.0.0/16", "AdvMSS": 1360, "Priority": 5, "mtu": 0, "table": 0},
        {"dst": "fd99::/64", "scope": 253},
    ]);
    let r = add(&env, false, "ctr-rf", &conf("1.1.0", &name, i.clone()));
    assert_eq!(
        r["routes"],
        json!([
            {"dst": "0.0.0.0/0", "gw": gw, "mtu": 1400, "priority": 100, "table": 100, "scope": 0},
            {"dst": "10.99.0.0/16", "advmss": 1360, "priority": 5, "table": 0},
            {"dst": "fd99::/64", "scope": 253},
        ]),
        "{r}"
    );
    let r = add(&env, false, "ctr-rf0", &conf("1.0.0", &name, i));
    let dst_gw: Vec<(Value, Value)> = r["routes"]
        .as_array()
        .expect("routes")
        .iter()
        .map(|r| (r["dst"].clone(), r["gw"].clone()))
        .collect();
    assert_eq!(
        dst_gw,
        [
            (json!("0.0.0.0/0"), json!(gw)),
            (json!("10.99.0.0/16"), Value::Null),
            (json!("fd99::/64"), Value::Null)
        ],
        "{r}"
    );
}

/// Proves: behind bridge, two default routes that differ only in `priority` both reach
/// the pod with their metrics (when the priorities were dropped the second collided with
/// the first and the ADD failed), a route's `mtu` is set on it, and one with `table` lands
/// in that table; DEL removes it all, for 1.1.0 and 1.0.0; CHECK passes at 1.1.0.
#[test]
fn behind_bridge_routes_keep_priority_table_and_mtu() {
    let (env, nets, dir, name) = world("host_local_route_metrics", "rm");
    let br = env.link_name("hlr");
    let gw = nets.v4_addr(1);
    let mut i = ipam(&dir, nets.v4_ranges());
    i["routes"] = json!([
        {"dst": "0.0.0.0/0", "gw": gw, "priority": 100},
        {"dst": "0.0.0.0/0", "gw": gw, "priority": 200, "mtu": 1400},
        {"dst": "10.99.0.0/16", "gw": gw, "table": 100},
    ]);
    for version in ["1.1.0", "1.0.0"] {
        let c = json!({"cniVersion": version, "name": name, "type": "bridge", "bridge": br,
            "isGateway": true, "ipam": i});
        let pod = env.pod("bridge", &c);
        let ns = pod.ns.name.as_str();
        let defaults: BTreeSet<(u64, String)> = ip_json_in(ns, &["-4", "route", "show", "default"])
            .iter()
            .map(|r| {
                assert_eq!(
                    (&r["gateway"], &r["dev"]),
                    (&json!(gw), &json!("eth0")),
                    "{r}"
                );
                (r["metric"].as_u64().unwrap_or(0), r["metrics"].to_string())
            })
            .collect();
        assert_eq!(
            defaults,
            BTreeSet::from([
                (100, "null".to_string()),
                (200, json!([{"mtu": 1400}]).to_string()),
            ]),
            "{version}"
        );
        let table = ip_json_in(ns, &["-4", "route", "show", "table", "100"]);
        assert_eq!(table.len(), 1, "{version}: {table:?}");
        assert_eq!(
            (&table[0]["dst"], &table[0]["gateway"]),
            (&json!("10.99.0.0/16"), &json!(gw)),
            "{version}"
        );
        // A 1.0.0 result is printed without the routes' 1.1.0 fields (src/cni/result.rs),
        // so CHECK would look for the table route in main: CHECK at 1.1.0 only.
        if version == "1.1.0" {
            pod.check(&pod.result);
        }
        pod.del();
        assert!(link(Some(ns), "eth0").is_none(), "{version}");
    }
    assert!(leases(&dir.join(&name)).is_empty());
}

/// Proves: a gateway outside the subnet (a link-local one, as ptp and ipvlan L3 use) is
/// accepted as the reference accepts it: the same results as Debian's host-local, the
/// gateway as given and the subnet's first address handed out (the gateway is not in the
/// range); rangeStart outside the subnet is still refused by both.
#[test]
fn gateway_outside_the_subnet_as_the_reference() {
    let (env, nets, _, name) = world("host_local_offnet_gw", "gw");
    let ranges = json!([[{"subnet": nets.v4, "gateway": "169.254.1.1"}]]);
    let mut results = Vec::new();
    for reference in [true, false] {
        let dir = env.dir(if reference { "ref" } else { "ours" });
        let c = conf("1.0.0", &name, ipam(&dir, ranges.clone()));
        results.push(add(&env, reference, "ctr-gw", &c));
    }
    assert_eq!(results[1], results[0]);
    assert_eq!(results[1]["ips"][0]["gateway"], "169.254.1.1");
    assert_eq!(first_addr(&results[1], false), nets.v4_addr(1));
    let bad = json!([[{"subnet": nets.v4, "rangeStart": "169.254.1.1"}]]);
    for reference in [true, false] {
        let c = conf("1.0.0", &name, ipam(&env.dir("bad"), bad.clone()));
        failed(&call(&env, reference, "ADD", "ctr-bad", &c).run());
    }
}

/// Proves: `rangeStart`, `rangeEnd` and `gateway` at the top of `ipam` next to `ranges`,
/// without `subnet`, are ignored, as the reference ignores them (same result), and our
/// stderr names them.
#[test]
fn flat_range_keys_without_subnet_are_ignored() {
    let (env, nets, _, name) = world("host_local_flat_ignored", "flat");
    let mut results = Vec::new();
    for reference in [true, false] {
        let dir = env.dir(if reference { "ref" } else { "ours" });
        let mut i = ipam(&dir, nets.v4_ranges());
        i["rangeStart"] = json!(nets.v4_addr(100));
        i["gateway"] = json!(nets.v4_addr(254));
        let o = call(&env, reference, "ADD", "ctr-flat", &conf("1.0.0", &name, i)).run();
        if !reference {
            assert!(
                o.stderr.contains("ipam.rangeStart, ipam.gateway"),
                "{}",
                o.stderr
            );
        }
        results.push(o.result());
    }
    assert_eq!(results[1], results[0]);
    assert_eq!(first_addr(&results[1], false), nets.v4_addr(2));
}
