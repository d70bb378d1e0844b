//! IPv6 on ptp's veths, set over netlink (no `/proc/sys` write per pod): an IPv4-only
//! pod and its host end get no IPv6 address at all; with IPv6, both ends get the
//! kernel's EUI-64 link-local address and their addresses without DAD, and the host end
//! (whose link-local address its neighbour probes of the pod come from) forwards IPv6
//! between pods.

use super::*;
use crate::bridge::ipv6::{addrgenmode_none, eui64_link_local, ipv6_lines, link_locals};

/// Proves: an IPv4-only ptp pod and its host end have no IPv6 address
/// (`addrgenmode none`); the pod reaches its gateway.
#[test]
fn ipv4_pods_and_host_ends_have_no_ipv6() {
    let env = TestEnv::new("ptp_ipv4_no_ipv6");
    let (ipam, nets) = ipam(&env, Ipam::Ipamd, false);
    let att = env.new_attachment("ptp", "v4only", &conf("1.0.0", &net_name(), &ipam));
    let r = att.add();
    let ns = Some(att.ns.name.as_str());
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        ipv6_lines(ns, "eth0").is_empty(),
        "{:?}",
        ipv6_lines(ns, "eth0")
    );
    assert!(ipv6_lines(None, host_veth(&r)).is_empty(), "{r}");
    assert!(addrgenmode_none(ns, "eth0") && addrgenmode_none(None, host_veth(&r)));
    assert_ping(&att.ns.name, &nets.v4_addr(1));
    att.del();
}

/// Proves: a dual-stack ptp pod's interface and host end each have the EUI-64
/// link-local address of their MAC, the host end its gateway (/128), nothing tentative;
/// two such pods reach each other over IPv6 through the host (which resolves each pod
/// from its host end's link-local address), and the gateway, right after ADD.
#[test]
fn dual_stack_ends_have_link_local_addresses_without_dad() {
    let env = TestEnv::new("ptp_dual_link_local");
    let (conf, nets) = network(&env, Ipam::Ipamd, json!({}));
    let [a, b] = env.pair("ptp", &conf);
    let (ra, rb) = (a.add(), b.add());
    for (att, r) in [(&a, &ra), (&b, &rb)] {
        let ns = Some(att.ns.name.as_str());
        let pod_mac = r["interfaces"][1]["mac"].as_str().expect("pod MAC");
        let host_mac = r["interfaces"][0]["mac"].as_str().expect("host MAC");
        assert_eq!(link_locals(ns, "eth0"), [eui64_link_local(pod_mac)]);
        assert_eq!(
            link_locals(None, host_veth(r)),
            [eui64_link_local(host_mac)]
        );
        let host = ipv6_lines(None, host_veth(r));
        assert!(
            host.iter()
                .any(|l| l.starts_with(&format!("{}/128", nets.v6_addr(1)))),
            "{host:?}"
        );
        for lines in [host, ipv6_lines(ns, "eth0")] {
            assert!(lines.iter().all(|l| !l.contains("tentative")), "{lines:?}");
        }
    }
    assert_ping(&a.ns.name, &nets.v6_addr(1));
    assert_ping(&a.ns.name, &first_addr(&rb, true));
    assert_ping(&b.ns.name, &first_addr(&ra, true));
    a.del();
    b.del();
}
