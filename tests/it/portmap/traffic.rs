//! Mappings carrying real TCP and UDP: from the host, the gateway and
//! hairpin, per hostIP, after a stale UDP conntrack entry, and next to
//! iptables-nft rules of other software.

use super::*;

fn traffic(kind: Ipam) {
    let env = TestEnv::new("portmap-traffic");
    let net = net_name();
    let nets = env.subnets();
    let br = env.link_name("pmbr");
    let ipam = env.ipam(kind, nets.dual_ranges());
    let mut bridge = bridge_conf(&net, &br, ipam.clone());
    let socket = (kind == Ipam::IpamdDaemon).then(|| use_daemon(&mut bridge, &ipam));
    // A container reaching its own mapping gets its packets back on the port
    // they came in on; with br_netfilter loaded that is bridged, which needs
    // hairpin mode on the port (as with the reference plugins).
    bridge["hairpinMode"] = json!(true);
    let (tcp, udp) = (host_port(), host_port());
    let mappings = two_mappings(tcp, udp);
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let b = attach(&env, &net, &bridge, None);
    let _servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    let (gw4, gw6) = (nets.v4_addr(1), nets.v6_addr(1));
    let b_ns = Some(b.ns.path.as_str());
    let a_ns = Some(a.ns.path.as_str());

    // From the host: localhost and the gateway, v4 and v6, TCP and UDP.
    let targets = [
        (None, "127.0.0.1"),
        (None, gw4.as_str()),
        (None, gw6.as_str()),
        (b_ns, gw4.as_str()),
        (b_ns, gw6.as_str()),
        (a_ns, gw4.as_str()),
        (a_ns, gw6.as_str()),
    ];
    for (from, host) in targets {
        let who = format!("from {} to {host}", from.unwrap_or("host"));
        let t = eventually_answers(|| tcp_ask(from, &sock(host, tcp)));
        assert!(
            t.as_deref().is_some_and(|r| r.starts_with("A ")),
            "tcp {who}: {t:?}"
        );
        let u = eventually_answers(|| udp_ask(from, &sock(host, udp)));
        assert!(
            u.as_deref().is_some_and(|r| r.starts_with("A ")),
            "udp {who}: {u:?}"
        );
    }
    // Hairpin is masqueraded: A sees the gateway, not B, as the peer.
    let seen = tcp_ask(b_ns, &sock(&gw4, tcp)).unwrap_or_default();
    assert_eq!(
        seen,
        format!("A {gw4}"),
        "hairpin from B must be masqueraded"
    );

    let pm = portmap(&a, &net, &mappings, true);
    pm.check(&a.result);
    pm.del();
    for (from, host) in targets {
        assert_eq!(
            tcp_ask(from, &sock(host, tcp)),
            None,
            "tcp to {host} after DEL"
        );
        assert_eq!(
            udp_ask(from, &sock(host, udp)),
            None,
            "udp to {host} after DEL"
        );
    }
    assert_no_trace("after DEL", &traces(&a.id, &a.result));
    a.del();
    b.del();
    assert_fw_ops(
        socket.as_ref(),
        &[
            ("portmap-add", 1),
            ("portmap-check", 1),
            ("portmap-del-keys", 1),
            // The UDP mapping's stale-conntrack flush on ADD, too.
            ("conntrack-flush-udp", 1),
        ],
    );
}

#[test]
fn traffic_ipamd() {
    traffic(Ipam::Ipamd);
}

/// The same with `cnikit ipamd daemon` applying every firewall change: the
/// daemon's metrics prove the plugins used it.
#[test]
fn traffic_ipamd_daemon() {
    traffic(Ipam::IpamdDaemon);
}

#[test]
fn traffic_host_local() {
    traffic(Ipam::HostLocal);
}

/// A mapping with a hostIP answers on that address only (here the IPv6
/// gateway), and ::1 is never mapped: the kernel never routes ::1 off the
/// loopback device (there is no IPv6 route_localnet), so [::1]:hostPort
/// must fail cleanly rather than hang or reach something else.
#[test]
fn host_ip_mappings_and_ipv6_localhost() {
    let env = TestEnv::new("portmap-host-ip");
    let (net, bridge, nets) = network(&env, true);
    let (any, only6) = (host_port(), host_port());
    let (gw4, gw6) = (nets.v4_addr(1), nets.v6_addr(1));
    let mappings = json!([
        {"hostPort": any, "containerPort": CTR_TCP},
        {"hostPort": only6, "containerPort": CTR_TCP, "hostIP": gw6},
    ]);
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let _servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    assert!(eventually_answers(|| tcp_ask(None, &sock(&gw6, any))).is_some());
    assert_eq!(tcp_ask(None, &sock("::1", any)), None);
    assert!(eventually_answers(|| tcp_ask(None, &sock(&gw6, only6))).is_some());
    for host in [gw4.as_str(), "127.0.0.1", "::1"] {
        assert_eq!(
            tcp_ask(None, &sock(host, only6)),
            None,
            "{host} is not the hostIP"
        );
    }
    portmap(&a, &net, &mappings, true).del();
    assert_no_trace("after DEL", &traces(&a.id, &a.result));
}

/// A UDP flow tracked before the mapping existed must not keep bypassing the
/// DNAT: ADD deletes the stale conntrack entry, so the same socket (same
/// tuple) reaches the container right after ADD.
#[test]
fn add_flushes_stale_udp_conntrack() {
    let env = TestEnv::new("portmap-conntrack");
    let (net, bridge, nets) = network(&env, false);
    let a = attach(&env, &net, &bridge, None);
    let _servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    let udp = host_port();
    let target = sock(&nets.v4_addr(1), udp);
    // The NAT chains must exist before the first datagram: only then does
    // its flow get a (null) NAT binding that later packets keep using.
    let other = json!([{"hostPort": host_port(), "containerPort": 1}]);
    let other = portmap_conf(&net, other, Some(&a.result));
    pm_call(&env, "ADD", "other", &other).result();

    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket.connect(&target).unwrap();
    socket
        .set_read_timeout(Some(std::time::Duration::from_millis(300)))
        .unwrap();
    let _ = socket.send(b"before"); // tracked, unanswered (no host listener)
    std::thread::sleep(std::time::Duration::from_millis(100));

    let mappings = json!([{"hostPort": udp, "containerPort": CTR_UDP, "protocol": "udp"}]);
    let conf = portmap_conf(&net, mappings.clone(), Some(&a.result));
    a.chained("portmap", &conf).add();
    let mut buf = [0u8; 256];
    let mut answer = None;
    for _ in 0..10 {
        let _ = socket.send(b"after");
        if let Ok(n) = socket.recv(&mut buf) {
            answer = Some(String::from_utf8_lossy(&buf[..n]).into_owned());
            break;
        }
    }
    assert!(
        answer.as_deref().is_some_and(|a| a.starts_with("A ")),
        "the old flow still bypasses the mapping: {answer:?}"
    );
    portmap(&a, &net, &mappings, true).del();
    pm_call(&env, "DEL", "other", &other).ok_silent();
}

/// Pod replacement. A UDP flow to a host port DNATed to pod A keeps its
/// conntrack entry, and with it A's address, for as long as the client
/// sends. DEL deletes it: once A is gone the same socket's next datagrams
/// reach the host's own listener on the port, and pod B once B maps it.
#[test]
fn del_flushes_the_udp_flows_it_dnated() {
    let env = TestEnv::new("portmap-udp-del");
    let (net, bridge, nets) = network(&env, false);
    let udp = host_port();
    let mappings = json!([{"hostPort": udp, "containerPort": CTR_UDP, "protocol": "udp"}]);
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let a_servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    let client = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    client.connect(sock(&nets.v4_addr(1), udp)).unwrap();
    let wait = Some(std::time::Duration::from_millis(300));
    client.set_read_timeout(wait).unwrap();
    let answer = udp_exchange(&client, &client);
    assert!(answer.starts_with("A "), "the flow reaches A: {answer}");

    // The host's own service on the port; A's mapping shadowed it.
    let host = std::net::UdpSocket::bind(("0.0.0.0", udp)).unwrap();
    host.set_read_timeout(wait).unwrap();
    portmap(&a, &net, &mappings, true).del();
    drop(a_servers);
    a.del();
    let got = udp_exchange(&client, &host);
    assert_eq!(got, "ping", "the flow still goes to A's old address");

    let b = attach(&env, &net, &bridge, Some(&mappings));
    let _b_servers = Servers::start(&b.ns.path, "B", CTR_TCP, CTR_UDP);
    let answer = udp_exchange(&client, &client);
    assert!(answer.starts_with("B "), "the flow reaches B: {answer}");
    portmap(&b, &net, &mappings, true).del();
    b.del();
}

/// Sends "ping" on `client` until `receiver` gets a datagram (at most ten
/// tries); what it got.
fn udp_exchange(client: &std::net::UdpSocket, receiver: &std::net::UdpSocket) -> String {
    let mut buf = [0u8; 256];
    for _ in 0..10 {
        let _ = client.send(b"ping");
        if let Ok(n) = receiver.recv(&mut buf) {
            return String::from_utf8_lossy(&buf[..n]).into_owned();
        }
    }
    panic!("no datagram came through");
}

/// Docker / kube-proxy style iptables-nft rules (unrelated addresses only)
/// do not disturb the mappings, and the mappings do not disturb them.
#[test]
fn works_alongside_iptables_nft_rules() {
    let env = TestEnv::new("portmap-iptables");
    let rules: [&[&str]; 4] = [
        &["-t", "nat", "-N", "CNIKIT-TEST-DOCKER"],
        &[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            "192.0.2.1/32",
            "-j",
            "CNIKIT-TEST-DOCKER",
        ],
        &[
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            "198.51.100.0/24",
            "-j",
            "MASQUERADE",
        ],
        &["-A", "FORWARD", "-s", "203.0.113.0/24", "-j", "DROP"],
    ];
    for r in rules {
        let (ok, _, err) = sh("iptables", r);
        assert!(ok || err.contains("exists"), "iptables {r:?}: {err}");
    }
    let (_, before, _) = sh("iptables-save", &[]);

    let (net, bridge, nets) = network(&env, false);
    let tcp = host_port();
    let mappings = json!([{"hostPort": tcp, "containerPort": CTR_TCP}]);
    let a = attach(&env, &net, &bridge, Some(&mappings));
    let _servers = Servers::start(&a.ns.path, "A", CTR_TCP, CTR_UDP);
    for host in ["127.0.0.1", nets.v4_addr(1).as_str()] {
        let t = eventually_answers(|| tcp_ask(None, &sock(host, tcp)));
        assert!(t.is_some(), "tcp to {host} with iptables rules present");
    }
    portmap(&a, &net, &mappings, true).del();
    let (_, after, _) = sh("iptables-save", &[]);
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" [").next().unwrap_or(l).to_string())
            .collect()
    };
    assert_eq!(strip(&before), strip(&after), "iptables rules changed");
    a.del();
}
