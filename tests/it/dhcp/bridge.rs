//! A bridge pod on the LAN: the bridge (no gateway, no masquerade) has the LAN's veth as
//! a port, so the pod's DHCP traffic and then its own reach the server through it.

use super::*;

/// Proves: bridge + dhcp ADD gets a lease from dnsmasq through the bridge, CHECK passes,
/// the pod reaches the server (ping), DEL releases the lease at the server.
#[test]
fn bridge_pod_gets_a_lease_and_reaches_the_server() {
    let lan = Lan::with_dnsmasq("dhcp_bridge", &[]);
    let env = &lan.env;
    let daemon = DhcpDaemon::start(env);
    let br = env.link_name("dbr");
    ip(&["link", "add", &br, "type", "bridge"]);
    ip(&["link", "set", &br, "up"]);
    ip(&["link", "set", &lan.master, "master", &br]);
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": NET,
        "type": "bridge",
        "bridge": br,
        "isGateway": false,
        "ipMasq": false,
        "ipam": dhcp_ipam(&daemon.socket),
    });
    let pod = env.new_attachment("bridge", "p", &conf);
    let started = Instant::now();
    let r = pod.add();
    println!("dhcp bridge: ADD took {:?}", started.elapsed());
    let addr = assert_leased(&r, &pod.ns);
    assert_default_route(&r);
    assert!(
        addrs(None, &br).is_empty(),
        "isGateway false: the bridge gets no address"
    );
    assert_eq!(lan.dnsmasq_lease(&pod.id), Some(addr));
    pod.check(&r);
    assert_ping(&pod.ns.name, SERVER);
    pod.del();
    lan.wait_dnsmasq_forgets(&pod.id, Duration::from_secs(5));
    daemon.assert_no_records();
    pod.del();
}
