//! sbr (source-based routing), chained after an interface plugin: its rules and tables
//! after bridge + ipamd at every version, CHECK, DEL (twice, netns gone, input it cannot
//! parse), `table`; a multi-homed pod whose replies leave through the interface they came
//! in on (traffic.rs); side by side with Debian's reference sbr 1.1.1 (reference.rs).

mod reference;
mod traffic;

use crate::support::*;
use serde_json::{json, Value};

/// `ip -j ARGS` parsed (an empty answer is an empty list).
fn ipj(args: &[&str]) -> Vec<Value> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let out = ip(&full);
    match out.trim() {
        "" => Vec::new(),
        text => serde_json::from_str(text).unwrap_or_else(|e| panic!("ip {args:?}: {e}: {text}")),
    }
}

/// The rules of the netns of one family (`-4`, `-6`), as `ip -j -d rule` lists them.
fn rules(ns: &Netns, family: &str) -> Vec<Value> {
    ipj(&["-n", &ns.name, "-d", family, "rule"])
}

/// `(src, table)` of the rules of both families that have a source (sbr's kind).
fn source_rules(ns: &Netns) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = ["-4", "-6"]
        .iter()
        .flat_map(|f| rules(ns, f))
        .filter(|r| r["src"] != "all")
        .map(|r| (str_of(&r["src"]), str_of(&r["table"])))
        .collect();
    v.sort();
    v
}

/// The bare address of a family in a result of any layout (`ips`, or 0.2.0's `ip4`/`ip6`).
fn address(result: &Value, v6: bool) -> String {
    if result.get("ips").is_some() {
        return first_addr(result, v6);
    }
    let cidr = &result[if v6 { "ip6" } else { "ip4" }]["ip"];
    bare(cidr.as_str().expect("an address")).to_string()
}

fn str_of(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// `ip -d route show table TABLE` of one family, each route as "dst [via gw] dev d [src s]".
fn table(ns: &Netns, family: &str, table: &str) -> Vec<String> {
    let mut v: Vec<String> = ipj(&[
        "-n", &ns.name, "-d", family, "route", "show", "table", table,
    ])
    .iter()
    .map(|r| {
        let mut s = str_of(&r["dst"]);
        for (key, word) in [("gateway", "via"), ("dev", "dev"), ("prefsrc", "src")] {
            if let Some(x) = r[key].as_str() {
                s += &format!(" {word} {x}");
            }
        }
        s
    })
    .collect();
    v.sort();
    v
}

/// The netns's policy routing, both families: its rules and every route outside the
/// local table (which holds the addresses, not sbr's work).
fn policy(ns: &Netns) -> Value {
    let routes = |family: &str| -> Vec<Value> {
        ipj(&[
            "-n", &ns.name, "-d", family, "route", "show", "table", "all",
        ])
        .into_iter()
        .filter(|r| r["table"] != "local")
        .collect()
    };
    json!({"rules4": rules(ns, "-4"), "rules6": rules(ns, "-6"),
           "routes4": routes("-4"), "routes6": routes("-6")})
}

/// sbr's configuration for one interface's prevResult, with the `extra` keys.
fn sbr_conf(version: &str, prev: &Value, extra: Value) -> Value {
    let c = json!({"cniVersion": version, "name": "sbrnet", "type": "sbr", "prevResult": prev});
    merged(c, extra)
}

/// A gateway bridge network of new dual-stack subnets over ipamd, its default route in
/// the pod too when `default_gw`: the config and the subnets.
fn network(env: &TestEnv, name: &str, default_gw: bool, dual: bool) -> (Value, Subnets) {
    let nets = env.subnets();
    let ranges = if dual {
        nets.dual_ranges()
    } else {
        nets.v4_ranges()
    };
    let c = json!({"cniVersion": "1.0.0", "name": name, "type": "bridge",
        "bridge": env.link_name("sbr"), "isGateway": true, "isDefaultGateway": default_gw,
        "ipam": env.ipam(Ipam::Ipamd, ranges)});
    (c, nets)
}

/// Proves: after bridge + dual-stack ipamd, for every version, sbr prints prevResult
/// unchanged and gives each address a table of its own from 100 (v4 first, as prevResult
/// lists them) with its rule, the default route via its gateway and the subnet route, which
/// leave main; CHECK (≥ 0.4.0) passes, and fails once a rule is gone; DEL, twice, removes
/// the rules, also a rule CHECK had lost; STATUS and GC succeed.
#[test]
fn after_bridge_and_ipamd_every_version() {
    let env = TestEnv::new("sbr_every_version");
    for version in ALL_VERSIONS {
        let (mut bridge, nets) = network(&env, "sbrv", true, true);
        bridge["cniVersion"] = json!(version);
        let pod = env.new_attachment("bridge", "v", &bridge);
        let prev = pod.add();
        wait_ipv6_ready(Some(&pod.ns.name));
        let sbr = pod.chained("sbr", &sbr_conf(version, &prev, json!({})));
        let out = sbr.add();
        assert_eq!(out, prev, "{version}: sbr changes nothing of the result");
        let (v4, v6) = (address(&prev, false), address(&prev, true));
        let want = vec![
            (v4.clone(), "100".to_string()),
            (v6.clone(), "101".to_string()),
        ];
        assert_eq!(source_rules(&pod.ns), want, "{version}");
        assert_eq!(
            table(&pod.ns, "-4", "100"),
            [
                format!("{} dev eth0 src {v4}", nets.v4),
                format!("default via {} dev eth0", nets.v4_addr(1)),
            ],
            "{version}"
        );
        let t6 = table(&pod.ns, "-6", "101");
        for want in [
            format!("{}/64 dev eth0", nets.v6_addr(0)),
            format!("default via {} dev eth0", nets.v6_addr(1)),
        ] {
            assert!(
                t6.contains(&want),
                "{version}: {want} not in table 101: {t6:?}"
            );
        }
        assert!(
            table(&pod.ns, "-4", "main").is_empty(),
            "{version}: main keeps eth0 routes"
        );
        assert!(table(&pod.ns, "-6", "main").is_empty(), "{version}");
        if version >= "0.4.0" {
            sbr.check(&prev);
            ip(&[
                "-n",
                &pod.ns.name,
                "rule",
                "del",
                "from",
                &v4,
                "table",
                "100",
            ]);
            sbr.call("CHECK")
                .conf(&with_prev(&sbr.conf, &prev))
                .run()
                .expect_err(100, &["no rule from", &v4]);
        }
        sbr.del_twice();
        assert!(source_rules(&pod.ns).is_empty(), "{version}");
        pod.del();
    }
    let c = sbr_conf("1.1.0", &json!({}), json!({}));
    for verb in ["STATUS", "GC"] {
        env.plugin("sbr").command(verb).conf(&c).run().ok_silent();
    }
}

/// Proves: with `table`, ADD only adds a rule per address to that table (main keeps its
/// routes), CHECK wants that rule; DEL removes only that table's rules of the interface's
/// addresses, and a rule from the same address to another table stays.
#[test]
fn with_table_only_rules_to_it() {
    let env = TestEnv::new("sbr_table");
    let (bridge, _) = network(&env, "sbrt", true, true);
    let pod = env.new_attachment("bridge", "t", &bridge);
    let prev = pod.add();
    let main4 = table(&pod.ns, "-4", "main");
    let sbr = pod.chained("sbr", &sbr_conf("1.0.0", &prev, json!({"Table": 4000})));
    assert_eq!(sbr.add(), prev);
    let (v4, v6) = (first_addr(&prev, false), first_addr(&prev, true));
    let want = vec![(v4.clone(), "4000".to_string()), (v6, "4000".to_string())];
    assert_eq!(source_rules(&pod.ns), want);
    assert_eq!(table(&pod.ns, "-4", "main"), main4, "no route moves");
    let all = ip(&["-n", &pod.ns.name, "route", "show", "table", "all"]);
    assert!(!all.contains("table 4000"), "{all}");
    sbr.check(&prev);
    ip(&[
        "-n",
        &pod.ns.name,
        "rule",
        "add",
        "from",
        &v4,
        "table",
        "77",
    ]);
    sbr.del_twice();
    assert_eq!(source_rules(&pod.ns), [(v4, "77".to_string())]);
    sbr.call("CHECK")
        .conf(&with_prev(&sbr.conf, &prev))
        .run()
        .expect_err(100, &["lookup 4000"]);
    pod.del();
}

/// Proves: ADD and CHECK without prevResult, or with no address on CNI_IFNAME, are code 7
/// and change nothing; a `table` that is no table id is code 7; an interface prevResult
/// names but the netns lacks is an error that leaves no rule behind.
#[test]
fn refusals_change_nothing() {
    let env = TestEnv::new("sbr_refusals");
    let ns = env.netns();
    let bare = sbr_conf("1.0.0", &json!(null), json!({}));
    let att = env.attachment("sbr", &cid("r"), &ns, &bare);
    att.try_add().expect_err(7, &["prevResult"]);
    att.call("CHECK").run().expect_err(7, &["prevResult"]);
    let elsewhere = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth1"}],
        "ips": [{"address": "10.77.0.5/24", "interface": 0}]});
    let c = sbr_conf("1.0.0", &elsewhere, json!({}));
    let att = env.attachment("sbr", &cid("r"), &ns, &c);
    att.try_add()
        .expect_err(7, &["no IP address on interface eth0"]);
    for bad in [json!(0), json!(-3), json!("100")] {
        let c = sbr_conf("1.0.0", &elsewhere, json!({"table": bad}));
        env.attachment("sbr", &cid("r"), &ns, &c)
            .try_add()
            .expect_err(7, &["table"]);
    }
    let missing = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.77.0.5/24"}]});
    let att = env.attachment(
        "sbr",
        &cid("r"),
        &ns,
        &sbr_conf("1.0.0", &missing, json!({})),
    );
    att.try_add().expect_err(100, &["eth0"]);
    assert!(source_rules(&ns).is_empty());
    assert_only_lo(&ns, "refused ADDs");
}

/// Proves: DEL succeeds with the netns gone, an empty or no CNI_NETNS, an interface that
/// is gone, and a configuration it cannot use (a `table` of the wrong type, a prevResult
/// it cannot read) — and then still removes the interface's rules, of every table.
#[test]
fn del_never_blocks() {
    let env = TestEnv::new("sbr_del");
    let (bridge, _) = network(&env, "sbrd", false, false);
    let pod = env.new_attachment("bridge", "d", &bridge);
    let prev = pod.add();
    let sbr = pod.chained("sbr", &sbr_conf("1.0.0", &prev, json!({})));
    sbr.add();
    assert_eq!(source_rules(&pod.ns).len(), 1);
    let garbled = sbr_conf("1.0.0", &json!({"ips": "x"}), json!({"table": "x"}));
    pod.chained("sbr", &garbled).del_twice();
    assert!(source_rules(&pod.ns).is_empty());
    // Again on a fresh interface (the routes of the first went to table 100 with it).
    pod.del();
    let prev = pod.add();
    let sbr = pod.chained("sbr", &sbr_conf("1.0.0", &prev, json!({})));
    sbr.add();
    pod.del();
    sbr.del_twice();
    assert_eq!(
        source_rules(&pod.ns).len(),
        1,
        "a rule without its interface stays"
    );
    env.del_netns(&pod.ns);
    sbr.del_twice();
    sbr.del_with_empty_netns();
    sbr.del_without_netns();
}
