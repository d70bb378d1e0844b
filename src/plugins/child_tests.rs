//! macvlan's and ipvlan's configuration, checked side by side: both parse the
//! same `master` key with the same rules.

use super::child::{load, ChildConf};
use super::{ipvlan, macvlan};
use crate::cni::gojson::{assert_known, struct_fields};
use crate::cni::{Command, Error, Request};

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
