use super::*;
use crate::cni::args::CniArgs;
use crate::plugins::firewall_backend::test_request;
use serde_json::json;

#[test]
fn conf_fields_are_known() {
    use crate::cni::gojson::{assert_known, struct_fields};
    assert_known(&[struct_fields::<Conf>()]);
}

fn request(extra: serde_json::Value, cni_args: &str) -> Request {
    let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "tap"});
    conf.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let mut r = test_request(Command::Add, conf);
    r.args = CniArgs::parse(cni_args).unwrap();
    r
}

fn load(extra: serde_json::Value) -> Result<Settings, Error> {
    Settings::load(&request(extra, ""))
}

#[test]
fn keys_as_the_reference_reads_them() {
    let s = load(
        json!({"multiQueue": true, "mtu": 1400, "owner": 4242, "group": 4343,
        "bridge": "br0", "selinuxContext": "system_u:system_r:container_t:s0"}),
    )
    .unwrap();
    assert!(s.spec.multi_queue);
    assert_eq!(
        (s.spec.owner, s.spec.group, s.mtu),
        (Some(4242), Some(4343), Some(1400))
    );
    assert_eq!(s.bridge.as_deref(), Some("br0"));
    assert_eq!(s.spec.name, "eth0");
    // Go's key matching: any case.
    let s = load(json!({"MultiQueue": true, "OWNER": 1, "selinuxcontext": "x"})).unwrap();
    assert!(s.spec.multi_queue && s.spec.owner == Some(1));
    assert_eq!(s.selinux_context.as_deref(), Some("x"));
    // Unset, empty and zero are Go's zero values.
    let s = load(json!({"mtu": 0, "mac": "", "bridge": "", "selinuxContext": "", "owner": null}))
        .unwrap();
    assert_eq!((s.mtu, &s.mac, &s.bridge), (None, &None, &None));
    assert!(s.selinux_context.is_none() && s.spec.owner.is_none() && !s.spec.multi_queue);
}

#[test]
fn vnet_hdr_where_the_reference_uses_its_netlink_library() {
    let vnet = |extra| load(extra).unwrap().spec.vnet_hdr;
    assert!(vnet(json!({"owner": 0, "group": 0})));
    assert!(!vnet(json!({"owner": 0})));
    assert!(!vnet(json!({"group": 0})));
    assert!(!vnet(
        json!({"owner": 0, "group": 0, "selinuxContext": "l"})
    ));
    assert!(!vnet(json!({})));
}

#[test]
fn bad_values_are_code_7_before_anything_is_made() {
    for bad in [
        json!({"mtu": 10}),
        json!({"mtu": -1}),
        json!({"owner": -1}),
        json!({"group": 4294967296u64}),
        json!({"multiQueue": "yes"}),
        json!({"bridge": "br%d"}),
        json!({"bridge": "a-name-far-too-long"}),
        json!({"mac": "0a:58"}),
    ] {
        let e = load(bad.clone()).unwrap_err();
        assert_eq!(e.code, 7, "{bad}: {e:?}");
    }
}

#[test]
fn mac_precedence_runtime_config_then_cni_args_then_the_key() {
    let mac = |extra, args| Settings::load(&request(extra, args)).map(|s| s.mac);
    let conf = json!({"mac": "0a:00:00:00:00:01"});
    assert_eq!(
        mac(conf.clone(), "").unwrap().as_deref(),
        Some("0a:00:00:00:00:01")
    );
    assert_eq!(
        mac(conf.clone(), "MAC=0A-00-00-00-00-02")
            .unwrap()
            .as_deref(),
        Some("0a:00:00:00:00:02")
    );
    let runtime = json!({"mac": "0a:00:00:00:00:01",
        "runtimeConfig": {"mac": "0a00.0000.0003"}});
    assert_eq!(
        mac(runtime, "MAC=0a:00:00:00:00:02").unwrap().as_deref(),
        Some("0a:00:00:00:00:03")
    );
    // Empty is unset: the next one counts.
    let empty = json!({"mac": "0a:00:00:00:00:01", "runtimeConfig": {"mac": ""}});
    assert_eq!(
        mac(empty, "MAC=").unwrap().as_deref(),
        Some("0a:00:00:00:00:01")
    );
    // `args.cni.mac` is not the tap's (the reference's `args` is an empty struct).
    let args = json!({"args": {"cni": {"mac": "0a:00:00:00:00:09"}}});
    assert_eq!(mac(args, "").unwrap(), None);
    let e = mac(json!({"runtimeConfig": {"mac": 5}}), "").unwrap_err();
    assert_eq!(e.code, 7);
}

#[test]
fn an_selinux_context_without_selinux_is_no_label_to_give() {
    if selinux_context().is_some() {
        eprintln!("SELinux is enabled here: the no-SELinux case is not tested");
        return;
    }
    check_selinux(Some("system_u:system_r:container_t:s0")).unwrap();
    check_selinux(None).unwrap();
}
