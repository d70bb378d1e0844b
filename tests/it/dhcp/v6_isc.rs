//! A DHCPv6 lease's life after ADD, against ISC `dhcpd -6` and leases of 12 s (T1 4 s,
//! T2 7 s), read from the server's log: renewal at T1 (with ISC `dhcpd -4` serving the
//! pod's IPv4 side at once), rebinding at T2 when the server was away at T1, a daemon
//! SIGKILLed and restarted, a pod removed without DEL, a server gone for good, and the
//! four-message exchange of a server without Rapid Commit.

use super::lan::isc_conf;
use super::lifecycle::{held_by_another, RANGE};
use super::v6::{assert_leased6, conf6};
use super::*;

/// ISC's DHCPv6 lease: valid 12 s, T1 4 s, T2 7 s.
const LEASE6: u64 = 12;

/// ISC `dhcpd -6` for fd00:99::/64 (valid and preferred lifetime `lease` s, T1 4 s, T2
/// 7 s), Rapid Commit when `rapid`.
fn isc6_conf(rapid: bool, lease: u64) -> String {
    format!(
        "authoritative;\n\
         default-lease-time {lease};\nmax-lease-time {lease};\nmin-lease-time {lease};\n\
         preferred-lifetime {lease};\n\
         option dhcp-renewal-time 4;\noption dhcp-rebinding-time 7;\n\
         {}\
         subnet6 fd00:99::/64 {{\n\
         \x20 range6 fd00:99::100 fd00:99::1ff;\n\
         \x20 option dhcp6.name-servers fd00:99::53;\n\
         }}\n",
        if rapid {
            "option dhcp6.rapid-commit;\n"
        } else {
            ""
        }
    )
}

/// A LAN with IPv6, ISC `dhcpd -6` (and `dhcpd -4` when `v4`), our daemon, and a
/// macvlan pod's config asking for IPv6 (and IPv4 when `v4`).
struct Isc6 {
    daemon: DhcpDaemon,
    lan: Lan,
    conf: Value,
    leases6: PathBuf,
}

impl Isc6 {
    fn new(test: &str, v4: bool, rapid: bool) -> Isc6 {
        Isc6::with_lease(test, v4, rapid, LEASE6)
    }

    fn with_lease(test: &str, v4: bool, rapid: bool, lease6: u64) -> Isc6 {
        let lan = Lan::new(test);
        lan.add_v6();
        if v4 {
            let leases = lan.isc_lease_file("isc4");
            lan.start_isc(&isc_conf(8, RANGE), &leases);
        }
        let leases6 = lan.isc_lease_file("isc6");
        lan.start_isc6(&isc6_conf(rapid, lease6), &leases6);
        let daemon = DhcpDaemon::start(&lan.env);
        let conf = conf6(&lan.master, &daemon.socket, v4, true);
        Isc6 {
            daemon,
            lan,
            conf,
            leases6,
        }
    }

    fn context(&self) -> String {
        format!(
            "dhcpd -6 log:\n{}\ndaemon log:\n{}",
            self.lan.server6_log(),
            self.daemon.log_text()
        )
    }

    /// How often the server logged `what` ("Renew message from").
    fn count(&self, what: &str) -> usize {
        self.lan.server6_log().matches(what).count()
    }

    /// Waits until the server has logged `what` more than `n` times.
    fn wait_for(&self, what: &str, n: usize, limit: Duration) -> Duration {
        wait_until(
            &format!("dhcpd -6 logs {what:?} more than {n} times"),
            limit,
            || self.count(what) > n,
            || self.context(),
        )
    }
}

/// Proves, dual-stack against ISC's two servers: the DHCPv6 lease is renewed at T1 again
/// and again (RENEW to the server, REPLY) while the DHCPv4 one is renewed too; CHECK
/// passes past the first lease's end; DEL sends RELEASE (ISC logs it) and the records go.
#[test]
fn isc_dual_stack_renews_at_t1_and_releases() {
    let s = Isc6::new("dhcp6_isc_renew", true, true);
    let pod = s.lan.env.new_attachment("macvlan", "p", &s.conf);
    let r = pod.add();
    let added = Instant::now();
    let v4 = assert_leased(&r, &pod.ns);
    assert_leased6(&r, &pod.ns, "fd00:99::");
    assert!(s.count("Solicit message from") >= 1, "{}", s.context());
    assert_eq!(s.count("Renew message from"), 0, "{}", s.context());
    let first = s.wait_for("Renew message from", 0, Duration::from_secs(8));
    assert!(
        added.elapsed() >= Duration::from_millis(3500),
        "renewed before T1: {first:?}"
    );
    s.wait_for("Renew message from", 1, Duration::from_secs(8));
    println!(
        "dhcp6 ISC renewal: 12 s lease renewed twice by {:?} after ADD",
        added.elapsed()
    );
    assert!(s.lan.isc_acks(&v4) >= 2, "the IPv4 lease is renewed too");
    std::thread::sleep(Duration::from_secs(LEASE6).saturating_sub(added.elapsed()));
    pod.check(&r);
    assert!(!s.daemon.log_text().contains("lost"), "{}", s.context());
    pod.del();
    s.wait_for("Release message from", 0, Duration::from_secs(5));
    s.daemon.assert_no_records();
}

/// Proves, IPv6-only: with the server away at T1 the RENEWs go unanswered; past T2 the
/// daemon REBINDs (to any server), and the server, back with its lease file, answers the
/// REBIND: the lease is kept, CHECK passes, nothing was lost.
#[test]
fn isc_v6_only_rebinds_at_t2_when_the_server_was_away() {
    let s = Isc6::new("dhcp6_isc_rebind", false, true);
    let pod = s.lan.env.new_attachment("macvlan", "p", &s.conf);
    let r = pod.add();
    let added = Instant::now();
    assert_eq!(r["ips"].as_array().map(Vec::len), Some(1), "{r}");
    assert_leased6(&r, &pod.ns, "fd00:99::");
    s.lan.stop_server6();
    // Back after T2 (7 s): only REBINDs can reach it.
    std::thread::sleep(Duration::from_millis(7500).saturating_sub(added.elapsed()));
    s.lan.start_isc6(&isc6_conf(true, LEASE6), &s.leases6);
    let took = s.wait_for("Rebind message from", 0, Duration::from_secs(4));
    println!(
        "dhcp6 ISC rebind: REBIND answered {:?} after ADD",
        added.elapsed()
    );
    let _ = took;
    wait_until(
        "the daemon records the rebinding",
        Duration::from_secs(3),
        || {
            s.daemon
                .log_text()
                .contains("DHCPv6 lease renewed (Rebinding before)")
        },
        || s.context(),
    );
    assert_eq!(s.count("Renew message from"), 0, "{}", s.context());
    pod.check(&r);
    pod.del();
    s.wait_for("Release message from", 0, Duration::from_secs(5));
    s.daemon.assert_no_records();
}

/// Proves: a daemon SIGKILLed while holding a dual-stack pod's leases, started again,
/// resumes both from their records ("resumed 2 lease(s)"), RENEWs the DHCPv6 one at T1
/// with the same client (ISC sees the same DUID), and releases it at DEL.
#[test]
fn isc_a_killed_daemon_resumes_its_dhcpv6_lease() {
    let mut s = Isc6::new("dhcp6_isc_restart", true, true);
    let pod = s.lan.env.new_attachment("macvlan", "p", &s.conf);
    let r = pod.add();
    let added = Instant::now();
    assert_leased6(&r, &pod.ns, "fd00:99::");
    assert_eq!(s.daemon.records().len(), 2);
    s.daemon.kill();
    s.daemon.spawn();
    s.wait_for("Renew message from", 0, Duration::from_secs(8));
    println!(
        "dhcp6 ISC restart: resumed lease renewed {:?} after ADD",
        added.elapsed()
    );
    let log = s.daemon.log_text();
    assert!(log.contains("resumed 2 lease"), "{log}");
    pod.check(&r);
    pod.del();
    s.wait_for("Release message from", 0, Duration::from_secs(5));
    s.daemon.assert_no_records();
    // One client throughout (the same DUID and IAID after the restart): every IA_NA
    // statement in ISC's lease file names the same one.
    let leases = s.lan.server6_leases();
    let ids: std::collections::BTreeSet<&str> = leases
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ia-na "))
        .collect();
    assert_eq!(ids.len(), 1, "one IA_NA at ISC: {leases}");
}

/// Proves: a pod removed without DEL (its netns deleted) is noticed at its next timer
/// (T1, 4 s): the daemon RELEASEs the DHCPv6 lease (ISC logs it) and forgets its record.
#[test]
fn isc_a_pod_gone_without_del_is_released() {
    let s = Isc6::new("dhcp6_isc_gone", false, true);
    let pod = s.lan.env.new_attachment("macvlan", "p", &s.conf);
    let r = pod.add();
    assert_leased6(&r, &pod.ns, "fd00:99::");
    s.lan.env.del_netns(&pod.ns);
    let took = s.wait_for("Release message from", 0, Duration::from_secs(10));
    println!("dhcp6 ISC pod gone: released {took:?} after the netns was deleted");
    wait_until(
        "the record goes",
        Duration::from_secs(3),
        || s.daemon.records().is_empty(),
        || s.context(),
    );
    pod.del();
}

/// Proves: a server gone for good: RENEW at T1 and REBIND at T2 go unanswered, and at
/// the valid lifetime's end the address leaves eth0 (CHECK fails: Expired) while the
/// link stays up; DEL passes.
#[test]
fn isc_a_silent_server_takes_the_address_off_at_expiry() {
    let s = Isc6::new("dhcp6_isc_silent", false, false);
    let pod = s.lan.env.new_attachment("macvlan", "p", &s.conf);
    // The lease starts when the server grants it, within the ADD: its end is at least
    // LEASE6 after the ADD was asked.
    let asked = Instant::now();
    let r = pod.add();
    let (cidr, _) = super::v6::result_v6(&r);
    assert_leased6(&r, &pod.ns, "fd00:99::");
    // No Rapid Commit at this server: the four-message exchange.
    assert!(s.count("Request message from") >= 1, "{}", s.context());
    s.lan.stop_server6();
    wait_until(
        "the address leaves eth0",
        Duration::from_secs(LEASE6 + 6),
        || !addrs(Some(&pod.ns.name), "eth0").contains(&cidr),
        || s.daemon.log_text(),
    );
    let gone = asked.elapsed();
    println!(
        "dhcp6 ISC silent server: address off eth0 {gone:?} after ADD began ({LEASE6} s lease)"
    );
    assert!(gone >= Duration::from_secs(LEASE6), "{gone:?}");
    assert!(link_up(&pod.ns));
    let log = s.daemon.log_text();
    assert!(
        log.contains("Renewing") && log.contains("Rebinding"),
        "{log}"
    );
    let e = pod.call("CHECK").conf(&with_prev(&s.conf, &r)).run().err();
    assert!(e.msg.contains("Expired"), "{e:?}");
    pod.del();
    s.daemon.assert_no_records();
}

/// Proves, dual-stack: when the DHCPv4 lease is refused (ISC NAKs its renewal) the daemon
/// takes eth0 down, which deletes the pod's IPv6 addresses with it; once the DHCPv4 lease
/// is granted again, eth0 comes back with them (its link-local address and the DHCPv6
/// /128), CHECK passes for both, and the DHCPv6 lease (120 s, rebinding meanwhile) is
/// renewed.
#[test]
fn isc_dual_stack_a_lost_ipv4_lease_brings_the_ipv6_addresses_back() {
    let s = Isc6::with_lease("dhcp6_isc_nak", true, true, 120);
    let pod = s.lan.env.new_attachment("macvlan", "p", &s.conf);
    let r = pod.add();
    let v4 = assert_leased(&r, &pod.ns);
    let v6 = assert_leased6(&r, &pod.ns, "fd00:99::");
    let (cidr6, _) = super::v6::result_v6(&r);
    let taken = s.lan.isc_lease_file("taken");
    std::fs::write(&taken, held_by_another(&v4)).expect("write the lease file");
    s.lan.start_isc(&isc_conf(8, RANGE), &taken);
    wait_until(
        "the daemon takes eth0 down",
        Duration::from_secs(15),
        || !link_up(&pod.ns),
        || s.context(),
    );
    assert!(
        !addrs(Some(&pod.ns.name), "eth0").contains(&cidr6),
        "the kernel deletes IPv6 addresses of a link that goes down"
    );
    s.lan
        .start_isc(&isc_conf(8, RANGE), &s.lan.isc_lease_file("isc4"));
    let back = Instant::now();
    wait_until(
        "eth0 comes back up",
        Duration::from_secs(40),
        || link_up(&pod.ns),
        || s.context(),
    );
    assert!(
        addrs(Some(&pod.ns.name), "eth0").contains(&cidr6),
        "{v6} back on eth0: {:?}\n{}",
        addrs(Some(&pod.ns.name), "eth0"),
        s.context()
    );
    println!(
        "dhcp6 ISC v4 NAK: eth0 up with its IPv6 address {:?} after the IPv4 server came back",
        back.elapsed()
    );
    pod.check(&r);
    wait_until(
        "the DHCPv6 lease is renewed after the outage",
        Duration::from_secs(65),
        || {
            s.daemon
                .log_text()
                .contains("DHCPv6 lease renewed (Rebinding before)")
        },
        || s.context(),
    );
    pod.del();
    s.wait_for("Release message from", 0, Duration::from_secs(5));
    s.daemon.assert_no_records();
}
