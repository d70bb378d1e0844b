//! host-device's configuration: the keys, their precedence, the reference's errors.

use super::conf::{load, Conf, Selector};
use super::HostDevice;
use crate::cni::gojson::{assert_known, struct_fields};
use crate::cni::{Command, Plugin};
use crate::plugins::firewall_backend::test_request;
use serde_json::{json, Value};
use std::path::PathBuf;

fn conf(extra: Value) -> Value {
    let mut c = json!({"cniVersion": "1.1.0", "name": "n", "type": "host-device"});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn sel(extra: Value) -> Result<Selector, crate::cni::Error> {
    load(&test_request(Command::Add, conf(extra)))
}

#[test]
fn config_keys_get_go_matching() {
    assert_known(&[struct_fields::<Conf>(), &["deviceID", "runtimeConfig"]]);
}

#[test]
fn the_first_set_key_selects_the_device() {
    assert_eq!(
        sel(json!({"device": "eth1", "hwaddr": "0a:58:00:00:00:01"})).unwrap(),
        Selector::Name("eth1".into())
    );
    assert_eq!(
        sel(json!({"device": "", "HWADDR": "0A:58:00:00:00:01"})).unwrap(),
        Selector::Mac("0a:58:00:00:00:01".into())
    );
    assert_eq!(
        sel(json!({"kernelpath": "/sys/devices/pci0000:00/0000:00:05.0"})).unwrap(),
        Selector::KernelPath(PathBuf::from("/sys/devices/pci0000:00/0000:00:05.0"))
    );
    assert_eq!(
        sel(json!({"pciBusID": "0000:ff:1f.7"})).unwrap_err().code,
        7,
        "a PCI device that is not there has no driver link"
    );
}

#[test]
fn bad_values_are_config_errors() {
    for (extra, needle) in [
        (json!({}), r#"specify either "device""#),
        (json!({"device": "", "hwaddr": ""}), "specify either"),
        (json!({"hwaddr": "nope"}), "hwaddr"),
        (json!({"device": "eth%d"}), "device"),
        (json!({"kernelpath": "sys/devices/x"}), "/sys/devices/"),
        (
            json!({"kernelpath": "/sys/devices/../class/net"}),
            "/sys/devices/",
        ),
        (json!({"kernelpath": "/proc/x"}), "/sys/devices/"),
        (json!({"pciBusID": "../x"}), "bus device id"),
        (
            json!({"device": "eth1", "runtimeConfig": {"deviceID": "0000:ff:1f.7"}}),
            "DeviceID",
        ),
        (
            json!({"device": "eth1", "runtimeConfig": {"deviceID": 5}}),
            "deviceID",
        ),
    ] {
        let e = sel(extra.clone()).unwrap_err();
        assert_eq!(e.code, 7, "{extra}: {e:?}");
        assert!(e.msg.contains(needle), "{extra}: {needle}: {}", e.msg);
    }
    // An empty deviceID is unset.
    let c = json!({"device": "eth1", "runtimeConfig": {"deviceID": ""}});
    assert_eq!(sel(c).unwrap(), Selector::Name("eth1".into()));
}

/// ADD and CHECK refuse a configuration before touching any netns (the test's does
/// not exist); STATUS and GC without IPAM have nothing to ask.
#[test]
fn verbs_without_a_device_key() {
    for command in [Command::Add, Command::Check] {
        let e = HostDevice
            .call(&test_request(command, conf(json!({}))))
            .unwrap_err();
        assert_eq!(e.code, 7, "{command:?}");
    }
    HostDevice
        .status(&test_request(Command::Status, conf(json!({}))))
        .unwrap();
    HostDevice
        .gc(&test_request(Command::Gc, conf(json!({}))))
        .unwrap();
    // DEL of a configuration it cannot use, with the netns gone: done.
    HostDevice
        .del(&test_request(Command::Del, conf(json!({"hwaddr": "x"}))))
        .unwrap();
}
