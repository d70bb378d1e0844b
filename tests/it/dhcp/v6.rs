//! DHCPv6 (`"ipv6": true`) against dnsmasq, which serves both families on the LAN
//! (fd00:99::/64 beside 10.99.0.0/24) and sends router advertisements: dual-stack and
//! IPv6-only pods, what the result and the pod hold, the server's view of ADD and DEL,
//! a LAN without a DHCPv6 server.

use super::*;

/// The server's IPv6 address on the LAN.
pub(super) const SERVER6: &str = "fd00:99::1";
/// The IPv6 name server dnsmasq hands out (option 23).
const DNS6: &str = "fd00:99::53";

/// The `ipam` section asking for `v4` and `v6`.
fn ipam(socket: &Path, v4: bool, v6: bool) -> Value {
    json!({"type": "dhcp", "daemonSocketPath": socket, "ipv4": v4, "ipv6": v6})
}

/// A macvlan network on `master` leasing the families asked for.
pub(super) fn conf6(master: &str, socket: &Path, v4: bool, v6: bool) -> Value {
    let mut c = macvlan_conf("1.0.0", master, socket);
    c["ipam"] = ipam(socket, v4, v6);
    c
}

/// The result's IPv6 address ("fd00:99::5a/128") and its bare form.
pub(super) fn result_v6(r: &Value) -> (String, String) {
    let cidr = r["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| a.contains(':'))
        .unwrap_or_else(|| panic!("no IPv6 address in {r}"))
        .to_string();
    let bare = bare(&cidr).to_string();
    (cidr, bare)
}

/// Asserts the IPv6 address is a /128 of `prefix`, without gateway, and on eth0.
pub(super) fn assert_leased6(r: &Value, ns: &Netns, prefix: &str) -> String {
    let (cidr, addr) = result_v6(r);
    assert!(
        cidr.starts_with(prefix) && cidr.ends_with("/128"),
        "{cidr} is not a /128 of {prefix}: {r}"
    );
    let ip = r["ips"]
        .as_array()
        .and_then(|l| l.iter().find(|i| i["address"] == cidr.as_str()))
        .cloned()
        .unwrap_or_default();
    assert!(ip.get("gateway").is_none(), "DHCPv6 names no gateway: {r}");
    assert!(
        addrs(Some(&ns.name), "eth0").contains(&cidr),
        "{cidr} is not on eth0 of {}: {:?}",
        ns.name,
        addrs(Some(&ns.name), "eth0")
    );
    addr
}

/// Proves: a dual-stack pod gets its DHCPv4 lease (as before) and a DHCPv6 address of
/// dnsmasq's range as a /128, both on eth0 and in the result with both families' name
/// servers; the router advertisements give the on-link prefix and the pod reaches the
/// server over IPv6; CHECK passes; dnsmasq lists both leases; DEL releases both (dnsmasq
/// forgets them, its log shows the DHCPv6 RELEASE) and the records go.
#[test]
fn dual_stack_with_dnsmasq() {
    let lan = Lan::with_dnsmasq6("dhcp6_dual", &[]);
    let daemon = DhcpDaemon::start(&lan.env);
    let conf = conf6(&lan.master, &daemon.socket, true, true);
    let pod = lan.env.new_attachment("macvlan", "p", &conf);
    let started = Instant::now();
    let r = pod.add();
    println!(
        "dhcp6 dual-stack: macvlan+dhcp ADD took {:?}",
        started.elapsed()
    );
    let ips = r["ips"].as_array().cloned().unwrap_or_default();
    assert_eq!(ips.len(), 2, "{r}");
    let v4 = assert_leased(&r, &pod.ns);
    assert_default_route(&r);
    let v6 = assert_leased6(&r, &pod.ns, "fd00:99::");
    let servers = r["dns"]["nameservers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        servers.contains(&json!(DNS6)) && servers.contains(&json!(DNS[0])),
        "{r}"
    );
    pod.check(&r);
    assert_eq!(lan.dnsmasq_lease(&pod.id), Some(v4.clone()));
    assert!(lan.dnsmasq_has6(&v6), "{}", lan.server_leases());
    assert_eq!(daemon.records().len(), 2);
    // Router advertisements (dnsmasq's --enable-ra) give the on-link prefix.
    wait_until(
        "an RA gives eth0 the on-link prefix",
        Duration::from_secs(10),
        || {
            routes(Some(&pod.ns.name), "-6")
                .iter()
                .any(|r| r.starts_with("fd00:99::/64"))
        },
        || format!("{:?}", routes(Some(&pod.ns.name), "-6")),
    );
    assert_ping(&pod.ns.name, SERVER6);
    assert_ping(&pod.ns.name, SERVER);

    pod.del();
    lan.wait_dnsmasq_forgets(&pod.id, Duration::from_secs(5));
    wait_until(
        "dnsmasq forgets the DHCPv6 lease",
        Duration::from_secs(5),
        || !lan.dnsmasq_has6(&v6),
        || lan.server_leases() + &lan.server_log(),
    );
    // Both RELEASEs reached dnsmasq: the DHCPv4 one and the DHCPv6 one.
    let releases = lan.server_log().matches("DHCPRELEASE(").count();
    assert!(releases >= 2, "{}", lan.server_log());
    daemon.assert_no_records();
    pod.del();
}

/// Proves: an IPv6-only pod (`"ipv4": false`) gets only a DHCPv6 address (no IPv4 on
/// eth0, no DHCPv4 lease at dnsmasq), CHECK passes, ADD again returns the same lease,
/// DEL releases it.
#[test]
fn ipv6_only_with_dnsmasq() {
    let lan = Lan::with_dnsmasq6("dhcp6_only", &[]);
    let daemon = DhcpDaemon::start(&lan.env);
    let conf = conf6(&lan.master, &daemon.socket, false, true);
    let pod = lan.env.new_attachment("macvlan", "p", &conf);
    let started = Instant::now();
    let r = pod.add();
    println!("dhcp6 IPv6-only: ADD took {:?}", started.elapsed());
    assert_eq!(r["ips"].as_array().map(Vec::len), Some(1), "{r}");
    let v6 = assert_leased6(&r, &pod.ns, "fd00:99::");
    assert!(
        addrs(Some(&pod.ns.name), "eth0")
            .iter()
            .all(|a| a.contains(':')),
        "no IPv4 on eth0: {:?}",
        addrs(Some(&pod.ns.name), "eth0")
    );
    assert_eq!(lan.dnsmasq_lease(&pod.id), None);
    assert!(lan.dnsmasq_has6(&v6), "{}", lan.server_leases());
    assert_eq!(daemon.records().len(), 1);
    pod.check(&r);
    pod.del();
    wait_until(
        "dnsmasq forgets the DHCPv6 lease",
        Duration::from_secs(5),
        || !lan.dnsmasq_has6(&v6),
        || lan.server_leases() + &lan.server_log(),
    );
    daemon.assert_no_records();
}

/// Proves: a dual-stack ADD on a LAN with no DHCPv6 server fails after the resend
/// timeout with code 11 naming DHCPv6 and the interface, and leaves nothing: the DHCPv4
/// lease it got meanwhile goes back to the server (all or nothing), no record is left.
#[test]
fn no_dhcpv6_server_fails_add_and_gives_the_ipv4_lease_back() {
    let lan = Lan::with_dnsmasq("dhcp6_no_server", &[]);
    let flags = ["-timeout", "1s", "-resendmax", "2s", "-resendtimeout", "4s"];
    let daemon = DhcpDaemon::start_with(&lan.env, &flags);
    let conf = conf6(&lan.master, &daemon.socket, true, true);
    let pod = lan.env.new_attachment("macvlan", "p", &conf);
    let started = Instant::now();
    let e = pod.try_add().expect_err(11, &["DHCPv6", "eth0"]);
    println!(
        "dhcp6 no server: ADD failed after {:?}: {}",
        started.elapsed(),
        e.msg
    );
    lan.wait_dnsmasq_forgets(&pod.id, Duration::from_secs(5));
    daemon.assert_no_records();
    pod.del();
}

/// Proves: `"ipv4": false` without `"ipv6": true` is a config error (code 7) naming both
/// keys, before any daemon is asked.
#[test]
fn neither_family_is_a_config_error() {
    let lan = Lan::new("dhcp6_neither");
    let conf = conf6(&lan.master, Path::new("/nonexistent.sock"), false, false);
    let pod = lan.env.new_attachment("macvlan", "p", &conf);
    let e = pod.try_add().expect_err(7, &["ipv4", "ipv6"]);
    println!("dhcp6 neither family: {}", e.msg);
}
