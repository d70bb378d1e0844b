//! macvlan pods whose address comes from dnsmasq through the lease daemon: the version
//! matrix (result, kernel state, CHECK, the server's view of ADD and DEL), an offer
//! without a router, a LAN without a server, and a node without the daemon.

use super::*;

/// Proves, at `version`: ADD gets an address of the server's range with the server as
/// gateway, a default route and the name servers, and the address is on eth0; CHECK
/// passes; dnsmasq knows the lease by our client identifier; DEL releases it at the
/// server and forgets the record; DEL again, and DEL of a pod whose netns is gone, pass.
fn matrix(version: &str) {
    let lan = Lan::with_dnsmasq(&format!("dhcp_macvlan_{version}"), &[]);
    let env = &lan.env;
    let daemon = DhcpDaemon::start(env);
    let conf = macvlan_conf(version, &lan.master, &daemon.socket);
    let pod = env.new_attachment("macvlan", "p", &conf);
    let started = Instant::now();
    let r = pod.add();
    println!(
        "dhcp {version}: macvlan+dhcp ADD took {:?}",
        started.elapsed()
    );
    assert_eq!(r["cniVersion"], version, "{r}");
    let addr = assert_leased(&r, &pod.ns);
    assert_default_route(&r);
    assert_eq!(r["dns"]["nameservers"], json!(DNS), "{r}");
    let pod_routes = routes(Some(&pod.ns.name), "-4");
    assert!(
        pod_routes.contains(&format!("default via {SERVER} dev eth0")),
        "{pod_routes:?}"
    );
    assert!(link_up(&pod.ns));
    if version != "0.3.1" {
        pod.check(&r);
    }
    assert_eq!(lan.dnsmasq_lease(&pod.id), Some(addr.clone()));
    assert_eq!(daemon.records().len(), 1);
    assert_ping(&pod.ns.name, SERVER);

    pod.del();
    lan.wait_dnsmasq_forgets(&pod.id, Duration::from_secs(5));
    assert!(
        lan.server_log()
            .contains(&format!("DHCPRELEASE({}) {addr}", lan.server_if)),
        "{}",
        lan.server_log()
    );
    daemon.assert_no_records();
    assert!(
        link(Some(&pod.ns.name), "eth0").is_none(),
        "DEL removes eth0"
    );
    pod.del();

    // A pod whose netns the runtime removed before DEL: the daemon still releases.
    let gone = env.new_attachment("macvlan", "g", &conf);
    let r = gone.add();
    let addr = assert_leased(&r, &gone.ns);
    assert_eq!(lan.dnsmasq_lease(&gone.id), Some(addr));
    env.del_netns(&gone.ns);
    gone.del();
    lan.wait_dnsmasq_forgets(&gone.id, Duration::from_secs(5));
    daemon.assert_no_records();
    gone.del();
}

#[test]
fn macvlan_matrix_0_3_1() {
    matrix("0.3.1");
}

#[test]
fn macvlan_matrix_0_4_0() {
    matrix("0.4.0");
}

#[test]
fn macvlan_matrix_1_0_0() {
    matrix("1.0.0");
}

#[test]
fn macvlan_matrix_1_1_0() {
    matrix("1.1.0");
}

/// Proves: an offer without a router (dnsmasq `--dhcp-option=3`) gives a result without
/// a gateway and without routes, and the pod gets no default route; ADD succeeds.
#[test]
fn offer_without_a_router_gives_no_gateway_and_no_default_route() {
    let lan = Lan::with_dnsmasq("dhcp_no_router", &["--dhcp-option=3"]);
    let daemon = DhcpDaemon::start(&lan.env);
    let conf = macvlan_conf("1.0.0", &lan.master, &daemon.socket);
    let pod = lan.env.new_attachment("macvlan", "p", &conf);
    let r = pod.add();
    let addr = assert_leased(&r, &pod.ns);
    assert!(r["ips"][0].get("gateway").is_none(), "{r}");
    assert!(
        r.get("routes")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty),
        "{r}"
    );
    let pod_routes = routes(Some(&pod.ns.name), "-4");
    assert!(
        !pod_routes.iter().any(|r| r.starts_with("default")),
        "{pod_routes:?}"
    );
    pod.check(&r);
    assert_eq!(lan.dnsmasq_lease(&pod.id), Some(addr));
    pod.del();
    lan.wait_dnsmasq_forgets(&pod.id, Duration::from_secs(5));
    daemon.assert_no_records();
}

/// Proves: with no server on the LAN, ADD fails once `-resendtimeout` is over (not much
/// later), with code 11 and a message naming the interface and the wait; macvlan's
/// failed-ADD cleanup removes the pod's interface and the daemon keeps no record.
#[test]
fn no_server_fails_add_after_the_resend_timeout_and_leaves_nothing() {
    let lan = Lan::new("dhcp_no_server");
    let flags = ["-timeout", "1s", "-resendmax", "2s", "-resendtimeout", "5s"];
    let daemon = DhcpDaemon::start_with(&lan.env, &flags);
    let conf = macvlan_conf("1.0.0", &lan.master, &daemon.socket);
    let pod = lan.env.new_attachment("macvlan", "p", &conf);
    let started = Instant::now();
    let out = pod.try_add();
    let took = started.elapsed();
    let e = out.expect_err(11, &["eth0", "5s"]);
    println!("dhcp no server: ADD failed after {took:?}: {}", e.msg);
    assert!(
        took >= Duration::from_millis(4800),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_secs(8), "gave up late: {took:?}");
    assert_only_lo(&pod.ns, "a failed ADD");
    daemon.assert_no_records();
    pod.del();
}

/// Proves: without a daemon, ADD fails with code 11 and says where none answers and how
/// to start one (and macvlan removes the interface); DEL succeeds, with a note on stderr.
#[test]
fn without_the_daemon_add_says_how_to_start_it_and_del_passes() {
    let lan = Lan::with_dnsmasq("dhcp_no_daemon", &[]);
    let socket = lan.env.dir("nobody-home").join("dhcp.sock");
    let conf = macvlan_conf("1.0.0", &lan.master, &socket);
    let pod = lan.env.new_attachment("macvlan", "p", &conf);
    let sock = socket.display().to_string();
    let e = pod
        .try_add()
        .expect_err(11, &["no DHCP daemon answers at", &sock, "start it with"]);
    println!("dhcp without daemon: {}", e.msg);
    assert_only_lo(&pod.ns, "a failed ADD");
    assert!(lan.server_log().contains("DHCP, IP range"));
    assert!(!lan.server_log().contains("DHCPDISCOVER"));
    let out = pod.call("DEL").run();
    out.ok_silent();
    // The note comes from the dhcp plugin; ask it directly too (macvlan may not relay
    // its delegate's stderr).
    let direct = lan
        .env
        .plugin("dhcp")
        .attach("DEL", &pod.id, &pod.ns, "eth0")
        .conf(&conf)
        .run();
    direct.ok_silent();
    assert!(
        direct.stderr.contains("no DHCP daemon answers")
            && direct.stderr.contains("nothing released"),
        "{}",
        direct.stderr
    );
}
