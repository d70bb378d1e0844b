//! macvlan's and ipvlan's configuration, checked side by side: both parse the
//! same `master` key with the same rules.

use super::child::{load, ChildConf};
use super::{ipvlan, macvlan};
use crate::cni::args::CniArgs;
use crate::cni::gojson::{assert_known, struct_fields};
use crate::cni::{Command, Error, Request};
use crate::plugins::firewall_backend::test_request;
use serde_json::json;

#[test]
fn config_keys_get_go_matching() {
    assert_known(&[
        struct_fields::<ChildConf>(),
        struct_fields::<macvlan::Conf>(),
    ]);
}

/// A plugin's config loader, its result dropped.
type Load = fn(&Request) -> Result<(), Error>;

#[test]
fn master_names_follow_the_kernels_rules() {
    let load: [(&str, Load); 2] = [
        ("macvlan", |req| load::<macvlan::Macvlan>(req).map(drop)),
        ("ipvlan", |req| load::<ipvlan::Ipvlan>(req).map(drop)),
    ];
    for (kind, load) in load {
        for bad in ["eth%d", "a\u{0}b", "a/b", "eth 0", "0123456789abcdef"] {
            let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": kind,
                "master": bad, "ipam": {"type": "ipamd"}});
            let req = crate::plugins::firewall_backend::test_request(Command::Add, conf);
            assert_eq!(load(&req).unwrap_err().code, 7, "{kind} {bad:?}");
        }
    }
}

#[test]
fn an_empty_master_is_no_master() {
    for kind in ["macvlan", "ipvlan"] {
        let conf = json!({"cniVersion": "1.1.0", "name": "n", "type": kind,
            "master": "", "mode": "", "mtu": 0, "linkInContainer": null,
            "ipam": {"type": "ipamd"}});
        let req = test_request(Command::Add, conf);
        let master = match kind {
            "macvlan" => load::<macvlan::Macvlan>(&req).unwrap().shared.master,
            _ => load::<ipvlan::Ipvlan>(&req).unwrap().shared.master,
        };
        assert_eq!(master, None, "{kind}");
    }
}

#[test]
fn macvlan_mac_precedence_skips_empty_values() {
    let mac = |conf: serde_json::Value, env: &str| {
        let mut req = test_request(Command::Add, conf);
        req.args = CniArgs::parse(env).unwrap();
        let loaded = load::<macvlan::Macvlan>(&req).unwrap();
        macvlan::configured_mac(&req, &loaded.own).unwrap()
    };
    let base = json!({"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "master": "eth0",
        "mac": "", "runtimeConfig": {"mac": ""}});
    assert_eq!(mac(base.clone(), "MAC="), None);
    let mut own = base.clone();
    own["mac"] = json!("0A-58-0A-00-00-01");
    assert_eq!(
        mac(own.clone(), "MAC=").as_deref(),
        Some("0a:58:0a:00:00:01")
    );
    assert_eq!(
        mac(own.clone(), "MAC=0a58.0a00.0002").as_deref(),
        Some("0a:58:0a:00:00:02")
    );
    own["runtimeConfig"]["mac"] = json!("0a:58:0a:00:00:03");
    assert_eq!(
        mac(own, "MAC=0a58.0a00.0002").as_deref(),
        Some("0a:58:0a:00:00:03")
    );
}

#[test]
fn chained_ipvlan_takes_prev_results_single_interface_even_with_ipam() {
    let conf = |master: &str| {
        json!({"cniVersion": "1.0.0", "name": "n", "type": "ipvlan", "master": master,
            "ipam": {"type": "ipamd"},
            "prevResult": {"interfaces": [{"name": "host0"}],
                           "ips": [{"address": "10.1.0.2/24", "interface": 0}]}})
    };
    let master = |conf| {
        let req = test_request(Command::Add, conf);
        let loaded = load::<ipvlan::Ipvlan>(&req).unwrap();
        ipvlan::master_name(&loaded.shared, &req).unwrap()
    };
    assert_eq!(master(conf("")).as_deref(), Some("host0"));
    assert_eq!(master(conf("eth9")).as_deref(), Some("eth9"));
    let mut two = conf("");
    two["prevResult"]["interfaces"] = json!([{"name": "a"}, {"name": "b"}]);
    let req = test_request(Command::Add, two);
    let loaded = load::<ipvlan::Ipvlan>(&req).unwrap();
    assert_eq!(
        ipvlan::master_name(&loaded.shared, &req).unwrap_err().code,
        7
    );
}
