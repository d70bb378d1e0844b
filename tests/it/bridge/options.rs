//! Configuration keys on the kernel (hairpin, promisc, MTU, MAC, VLANs,
//! zero values, disableContainerInterface) and the bridge under concurrent
//! first ADDs and ports coming and going.

use super::*;

/// Proves: hairpinMode shows up as hairpin on the host port; without it, off.
#[test]
fn hairpin_mode_sets_port_flag() {
    let env = TestEnv::new("hairpin_mode_sets_port_flag");
    for hairpin in [true, false] {
        let (att, br, _) = v4_attachment(&env, "hp", json!({"hairpinMode": hairpin}));
        let r = att.add();
        let l = link(None, host_veth(&r)).expect("host veth");
        assert_eq!(l["master"], br.as_str());
        assert_eq!(l["linkinfo"]["info_slave_data"]["hairpin"], hairpin, "{l}");
        att.del();
    }
}

/// Proves: promiscMode puts the bridge in promiscuous mode.
#[test]
fn promisc_mode_sets_bridge_promisc() {
    let env = TestEnv::new("promisc_mode_sets_bridge_promisc");
    let (att, br, _) = v4_attachment(&env, "pm", json!({"promiscMode": true}));
    att.add();
    let l = link(None, &br).expect("bridge");
    assert!(
        l["promiscuity"].as_u64().unwrap_or(0) >= 1 || has_flag(&l, "PROMISC"),
        "{l}"
    );
    att.del();
}

/// Proves: a bridge the plugin creates has multicast snooping off (its
/// per-port timers would make each attach cost in proportion to the ports);
/// a bridge that exists keeps its setting.
#[test]
fn created_bridge_has_multicast_snooping_off() {
    let env = TestEnv::new("created_bridge_has_multicast_snooping_off");
    let snooping = |br: &str| {
        link(None, br).expect("bridge")["linkinfo"]["info_data"]["mcast_snooping"].as_u64()
    };
    let (att, br, nets) = v4_attachment(&env, "ms", json!({}));
    att.add();
    assert_eq!(snooping(&br), Some(0));
    assert_ping(&att.ns.name, &nets.v4_addr(1));
    att.del();

    let (att, br, _) = v4_attachment(&env, "mk", json!({}));
    ip(&["link", "add", &br, "type", "bridge", "mcast_snooping", "1"]);
    att.add();
    assert_eq!(snooping(&br), Some(1));
    att.del();
}

/// Proves: mtu is honoured on the container interface and the host veth
/// (and traffic still flows).
#[test]
fn mtu_is_honoured() {
    let env = TestEnv::new("mtu_is_honoured");
    let (att, _, nets) = v4_attachment(&env, "mtu", json!({"mtu": 1400}));
    let r = att.add();
    assert_eq!(link(Some(&att.ns.name), "eth0").unwrap()["mtu"], 1400);
    assert_eq!(link(None, host_veth(&r)).unwrap()["mtu"], 1400);
    assert_ping(&att.ns.name, &nets.v4_addr(1));
    att.del();
}

/// Proves: `"mtu": 0` and `"vlan": 0` mean "not set", as in the reference
/// (configs generated from Go structs send them); ADD, CHECK-free DEL work.
#[test]
fn zero_mtu_and_vlan_mean_unset() {
    let env = TestEnv::new("zero_mtu_and_vlan_mean_unset");
    let (att, _, nets) = v4_attachment(&env, "zero", json!({"mtu": 0, "vlan": 0}));
    att.add();
    assert_eq!(link(Some(&att.ns.name), "eth0").unwrap()["mtu"], 1500);
    assert_ping(&att.ns.name, &nets.v4_addr(1));
    att.del();
}

/// Proves: a requested MAC is honoured, from runtimeConfig.mac (capability),
/// args.cni.mac and CNI_ARGS MAC=, and is reported in the result.
#[test]
fn requested_mac_is_honoured() {
    let env = TestEnv::new("requested_mac_is_honoured");
    let cases: [(&str, &str); 3] = [
        ("runtimeConfig", "0a:58:0a:01:02:03"),
        ("args", "0A:58:0A:01:02:04"),
        ("CNI_ARGS", "0a:58:0a:01:02:05"),
    ];
    for (how, mac) in cases {
        let extra = match how {
            "runtimeConfig" => {
                json!({"capabilities": {"mac": true}, "runtimeConfig": {"mac": mac}})
            }
            "args" => json!({"args": {"cni": {"mac": mac}}}),
            _ => json!({}),
        };
        let (att, _, _) = v4_attachment(&env, "mac", extra);
        let with_args = |call: Call| {
            if how == "CNI_ARGS" {
                call.cni_args(&format!("MAC={mac}"))
            } else {
                call
            }
        };
        let r = with_args(att.call("ADD")).run().result();
        let want = mac.to_ascii_lowercase();
        assert_eq!(r["interfaces"][2]["mac"], want.as_str(), "{how}: {r}");
        assert_eq!(
            link(Some(&att.ns.name), "eth0").unwrap()["address"],
            want.as_str(),
            "{how}"
        );
        with_args(att.call("CHECK"))
            .conf(&with_prev(&att.conf, &r))
            .run()
            .ok_silent();
        att.del();
    }
}

/// Proves: the reference's vlanTrunk keys (id, minID, maxID) are accepted
/// (this kernel may lack VLAN filtering: then a kernel error, never code 7).
#[test]
fn vlan_trunk_keys_are_the_reference_ones() {
    let env = TestEnv::new("vlan_trunk_keys_are_the_reference_ones");
    let trunk = json!({"vlanTrunk": [{"id": 20}, {"minID": 30, "maxID": 32}]});
    let (att, _, _) = v4_attachment(&env, "vlan", trunk);
    let o = att.try_add();
    if !o.success() {
        let e = o.err();
        assert_ne!(
            e.code, 7,
            "vlanTrunk with minID/maxID is a valid config: {e:?}"
        );
        eprintln!("vlanTrunk ADD failed on this kernel (accepted): {e:?}");
        assert_only_lo(&att.ns, "failed ADD");
    }
    att.del();
}

/// Proves: disableContainerInterface with IPAM is refused (code 7, as the
/// reference does: a down interface would lose the addresses and routes the
/// result claims), before anything is created or leased.
#[test]
fn disable_container_interface_with_ipam_is_invalid() {
    let env = TestEnv::new("disable_container_interface_with_ipam_is_invalid");
    let (att, _, _) = v4_attachment(&env, "dci", json!({"disableContainerInterface": true}));
    att.try_add().expect_err(7, &["disableContainerInterface"]);
    assert_only_lo(&att.ns, "refused ADD");
    assert_eq!(env.lease_count(ipam_of(&att), NET), 0);
}

/// Proves: concurrent first ADDs on a new gateway bridge all succeed (no
/// "file exists" race on the bridge or its address, plugins#366) and get
/// distinct addresses.
#[test]
fn concurrent_first_adds() {
    let env = TestEnv::new("concurrent_first_adds");
    let (c, br, _) = network(&env, Ipam::Ipamd, Subnets::dual_ranges);
    let atts: Vec<Attachment> = (0..8)
        .map(|_| env.new_attachment("bridge", "race", &c))
        .collect();
    let results: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = atts
            .iter()
            .map(|att| {
                let call = att.call("ADD");
                s.spawn(move || call.run().result())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let mut seen = BTreeSet::new();
    for r in &results {
        for a in result_addresses(r) {
            assert!(seen.insert(a.clone()), "address {a} handed out twice");
        }
    }
    assert_eq!(seen.len(), 16);
    assert_eq!(bridge_ports(&br).len(), 8);
    wait_ipv6_ready(None);
    assert_ping(&atts[0].ns.name, &first_addr(&results[7], false));
    for att in &atts {
        att.del();
    }
    assert!(bridge_ports(&br).is_empty());
}

/// Proves: the bridge (gateway) MAC is its own and stays put while ports come
/// and go, and the result reports the bridge's real MAC. The reference bridge
/// behaves so; a bridge that inherits its lowest port's MAC changes the
/// gateway MAC under every container when that port leaves.
#[test]
fn bridge_mac_is_stable_when_ports_come_and_go() {
    let env = TestEnv::new("bridge_mac_is_stable_when_ports_come_and_go");
    let (c, br, _) = network(&env, Ipam::Ipamd, Subnets::v4_ranges);
    let [a, b] = env.pair("bridge", &c);
    let kernel_mac = || link(None, &br).expect("bridge")["address"].clone();
    let ra = a.add();
    let mac = kernel_mac();
    assert_eq!(
        ra["interfaces"][0]["mac"], mac,
        "result reports the bridge's MAC"
    );
    let rb = b.add();
    assert_eq!(rb["interfaces"][0]["mac"], mac, "{rb}");
    assert_eq!(kernel_mac(), mac, "second port changed the bridge MAC");
    a.del();
    assert_eq!(
        kernel_mac(),
        mac,
        "the gateway MAC changed when the first container left (bridge inherits a port MAC; \
         first host veth MAC was {})",
        ra["interfaces"][1]["mac"]
    );
    b.del();
}
