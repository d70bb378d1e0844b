//! Pure unit tests always run; the kernel tests create links and namespaces
//! and therefore only run with CNIKIT_ISOLATED=1 (root, in a throw-away
//! network namespace set up by the isolated test runner). Every kernel test
//! works inside its own `ip netns` namespaces, removed again on drop.
use super::link::{format_mac, parse_mac};
use super::*;
use std::process::Command;

fn isolated(test: &str) -> bool {
    if std::env::var("CNIKIT_ISOLATED").as_deref() == Ok("1") {
        return true;
    }
    eprintln!("skipping {test}: needs an isolated root namespace (set CNIKIT_ISOLATED=1)");
    false
}

/// For `test`, if it may run here: a host and a pod namespace, named `{prefix}-h`
/// and `{prefix}-c`.
pub(super) fn host_and_pod(test: &str, prefix: &str) -> Option<(TestNs, TestNs)> {
    if !isolated(test) {
        return None;
    }
    let host = TestNs::new(&format!("{prefix}-h"));
    let cont = TestNs::new(&format!("{prefix}-c"));
    Some((host, cont))
}

/// A named netns (`ip netns add`), deleted on drop.
pub(super) struct TestNs {
    name: String,
    pub(super) ns: NetNs,
}

impl TestNs {
    pub(super) fn new(tag: &str) -> TestNs {
        let name = format!("cnikit-{}-{tag}", std::process::id());
        ip(&["netns", "add", &name]);
        let ns = NetNs::open(format!("/run/netns/{name}")).expect("open test netns");
        TestNs { name, ns }
    }

    pub(super) fn netlink(&self) -> Netlink {
        Netlink::open_in(&self.ns).expect("netlink socket in test netns")
    }

    /// The link `name`, which must exist here.
    pub(super) fn link(&self, name: &str) -> Link {
        let link = self.netlink().link_by_name(name).expect("read");
        link.unwrap_or_else(|| panic!("no link {name} in {}", self.name))
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(super) fn veth<'a>(host: &str, peer: &str, ns: &'a NetNs) -> VethSpec<'a> {
    VethSpec {
        host_name: host.into(),
        peer_name: peer.into(),
        peer_netns: ns,
        mtu: Some(1400),
        peer_mac: Some("0a:58:0a:16:00:05".into()),
        master: None,
    }
}

#[test]
fn mac_round_trip() {
    let mac = parse_mac("0A:58:0a:16:00:05").expect("valid mac");
    assert_eq!(format_mac(&mac), "0a:58:0a:16:00:05");
    assert!(parse_mac("0a:58:0a:16:00").is_err());
    assert!(parse_mac("0a:58:0a:16:00:zz").is_err());
}

#[test]
fn missing_netns_is_netns_not_found() {
    let err = NetNs::open("/run/netns/cnikit-definitely-missing").expect_err("must fail");
    assert_eq!(err.kind, ErrorKind::NetnsNotFound);
    assert_eq!(
        err.message,
        "network namespace /run/netns/cnikit-definitely-missing does not exist"
    );
    let err = NetNs::open("/proc/self/ns/uts").expect_err("uts is not a netns");
    assert_eq!(err.kind, ErrorKind::NetnsNotFound);
}

#[test]
fn bridge_veth_hairpin() {
    let Some((host, cont)) = host_and_pod("bridge_veth_hairpin", "bvh") else {
        return;
    };
    // Two concurrent first ADDs: both must get the same bridge.
    let spec = BridgeSpec {
        name: "cni0".into(),
        mtu: Some(1450),
        ..Default::default()
    };
    let results: Vec<Link> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| host.netlink().ensure_bridge(spec.clone())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread").expect("ensure_bridge"))
            .collect()
    });
    assert!(results.iter().all(|l| l.index == results[0].index && l.up));

    let mut nl = host.netlink();
    let br = results[0].clone();
    let enslaved = VethSpec {
        master: Some(br.index),
        ..veth("veth1234abcd", "eth0", &cont.ns)
    };
    let pair = nl.create_veth(enslaved).expect("veth");
    let made = nl
        .link_by_index(pair.host_index)
        .expect("read")
        .expect("made");
    assert_eq!(made.master, Some(br.index), "enslaved by the create");
    assert!(!made.up, "a port comes up only with its flags");
    let again = nl
        .create_veth(veth("veth1234abcd", "eth0", &cont.ns))
        .expect_err("dup");
    assert_eq!(again.kind, ErrorKind::AlreadyExists);
    assert!(again
        .message
        .starts_with("create veth veth1234abcd (peer eth0 in netns"));

    let port = BridgePort {
        hairpin: true,
        isolated: true,
    };
    nl.bridge_port_up(pair.host_index, "bridge owner", port)
        .expect("port up");
    let shown = ip(&["-j", "-d", "-n", &host.name, "link", "show", "veth1234abcd"]);
    for want in [
        "\"hairpin\":true",
        "\"isolated\":true",
        "\"ifalias\":\"bridge owner\"",
        "\"inet6_addr_gen_mode\":\"none\"",
    ] {
        assert!(shown.contains(want), "{want} in {shown}");
    }
    assert!(shown.contains("\"UP\""), "admin up: {shown}");

    let peer = cont.link("eth0");
    assert_eq!(peer.index, pair.peer_index);
    assert_eq!(peer.mac.as_deref(), Some("0a:58:0a:16:00:05"));
    assert_eq!(peer.mtu, 1400);
    let host_end = nl
        .link_by_index(pair.host_index)
        .expect("read")
        .expect("host");
    assert_eq!(host_end.master, Some(br.index));
    assert_eq!(host_end.link, Some(pair.peer_index));

    let not_bridge = nl.ensure_bridge(BridgeSpec {
        name: "veth1234abcd".into(),
        ..Default::default()
    });
    let err = not_bridge.expect_err("veth is no bridge");
    assert_eq!(
        err.message,
        "interface veth1234abcd exists but is a veth, not a bridge"
    );

    nl.delete_link(pair.host_index).expect("delete");
    let gone = nl.delete_link(pair.host_index).expect_err("deleted twice");
    assert_eq!(gone.kind, ErrorKind::NotFound);
    assert!(cont.netlink().link_by_name("eth0").expect("read").is_none());
}

#[test]
fn veth_peer_with_same_index() {
    // Fresh namespaces: both ends get ifindex 2, and the kernel then omits
    // IFLA_LINK; the pair must still be reported correctly.
    let Some((host, cont)) = host_and_pod("veth_peer_with_same_index", "same") else {
        return;
    };
    let pair = host
        .netlink()
        .create_veth(veth("vethsame", "eth0", &cont.ns))
        .expect("veth");
    let peer = cont.link("eth0");
    assert_eq!(peer.index, pair.peer_index);
}

#[test]
fn addresses_and_routes() {
    let Some((host, cont)) = host_and_pod("addresses_and_routes", "ar") else {
        return;
    };
    host.netlink()
        .create_veth(veth("vethar", "eth0", &cont.ns))
        .expect("veth");
    let mut nl = cont.netlink();
    let eth0 = nl.link_by_name("eth0").expect("read").expect("eth0");
    nl.set_up(eth0.index).expect("up");
    let v4: ipnet::IpNet = "10.22.0.5/16".parse().expect("net");
    let v6: ipnet::IpNet = "fd00::5/64".parse().expect("net");
    for addr in [v4, v4, v6] {
        nl.add_address(eth0.index, addr)
            .expect("add address (EEXIST is ok)");
    }
    let addrs = nl.addresses(eth0.index).expect("list");
    assert!(addrs.contains(&v4) && addrs.contains(&v6), "{addrs:?}");
    let only_v4 = nl.family_addresses(eth0.index, true).expect("list v4");
    assert_eq!(only_v4, vec![v4]);
    let only_v6 = nl.family_addresses(eth0.index, false).expect("list v6");
    assert!(only_v6.contains(&v6) && only_v6.iter().all(|a| a.addr().is_ipv6()));
    let lo = nl.link_by_name("lo").expect("read").expect("lo");
    assert_eq!(
        nl.family_addresses(lo.index, true).expect("list lo"),
        vec![]
    );

    let mut default = Route::new("0.0.0.0/0".parse().expect("net"));
    default.gateway = Some("10.22.0.1".parse().expect("ip"));
    nl.add_route(&default).expect("add default");
    nl.add_route(&default).expect("EEXIST is ok");
    let mut link_route = Route::new("192.168.7.0/24".parse().expect("net"));
    link_route.oif = Some(eth0.index);
    link_route.mtu = Some(1300);
    nl.add_route(&link_route).expect("add link route");
    let routes = nl.routes().expect("routes");
    let found = routes
        .iter()
        .find(|r| r.dst == link_route.dst)
        .expect("link route listed");
    assert_eq!(
        (found.mtu, found.scope, found.oif),
        (Some(1300), Some(253), Some(eth0.index))
    );
    let def = nl
        .default_route_link()
        .expect("default link")
        .expect("some");
    assert_eq!(def.index, eth0.index);

    nl.del_route(&link_route).expect("del route");
    assert_eq!(
        nl.del_route(&link_route).expect_err("twice").kind,
        ErrorKind::NotFound
    );
    nl.del_address(eth0.index, v6).expect("del address");
    let err = nl.del_address(eth0.index, v6).expect_err("twice");
    assert_eq!(err.kind, ErrorKind::NotFound);

    let accept_dad = cont.ns.run(|| {
        sysctl::set("net/ipv6/conf/eth0/accept_dad", "0")?;
        sysctl::get("net/ipv6/conf/eth0/accept_dad")
    });
    assert_eq!(accept_dad.expect("run").expect("sysctl"), "0");
}

#[test]
fn large_link_dump() {
    if !isolated("large_link_dump") {
        return;
    }
    // Several hundred links need more than one 32 KiB dump datagram.
    let host = TestNs::new("dump-h");
    let mut nl = host.netlink();
    let me = NetNs::open(host.ns.path()).expect("reopen");
    for i in 0..150 {
        let spec = VethSpec {
            host_name: format!("vd{i}a"),
            peer_name: format!("vd{i}b"),
            peer_netns: &me,
            mtu: None,
            peer_mac: None,
            master: None,
        };
        nl.create_veth(spec).expect("veth");
    }
    assert_eq!(nl.links().expect("dump").len(), 301);
}

#[test]
fn rules_and_routes_moved_between_tables() {
    let Some((host, cont)) = host_and_pod("rules_and_tables", "rt") else {
        return;
    };
    host.netlink()
        .create_veth(veth("vethrt", "net1", &cont.ns))
        .expect("veth");
    let mut nl = cont.netlink();
    let net1 = nl.link_by_name("net1").expect("read").expect("net1");
    nl.set_up(net1.index).expect("up");
    nl.add_address(net1.index, "10.23.0.5/24".parse().expect("net"))
        .expect("address");
    let src: std::net::IpAddr = "10.23.0.5".parse().expect("ip");
    let v6: std::net::IpAddr = "fd00:23::5".parse().expect("ip");
    nl.add_source_rule(src, 100).expect("rule");
    nl.add_source_rule(v6, 70000)
        .expect("rule with a 32-bit table");
    let rules = nl.rules().expect("rules");
    let ours = |t: u32| {
        rules
            .iter()
            .find(|r| r.table == t)
            .cloned()
            .expect("listed")
    };
    assert_eq!(ours(100).src, Some("10.23.0.5/32".parse().expect("net")));
    assert_eq!(
        ours(70000).src,
        Some("fd00:23::5/128".parse().expect("net"))
    );
    assert!(ours(100).priority.is_some(), "{rules:?}");
    assert!(rules
        .iter()
        .any(|r| r.table == MAIN_TABLE && r.src.is_none()));
    nl.del_rule(&ours(70000)).expect("delete as listed");
    nl.del_source_rule(src, 100).expect("delete by source");
    let e = nl.del_source_rule(src, 100).expect_err("twice");
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(!nl
        .rules()
        .expect("rules")
        .iter()
        .any(|r| r.table == 100 || r.table == 70000));

    // The kernel's subnet route (proto kernel, scope link, src) moves to table 100 whole.
    let main = nl.all_routes().expect("routes");
    let subnet = main
        .iter()
        .find(|r| r.table == MAIN_TABLE && r.oif == Some(net1.index) && r.dst.addr().is_ipv4())
        .expect("subnet route")
        .clone();
    assert_eq!(subnet.prefsrc, Some(src));
    nl.replace_route(&subnet.in_table(100)).expect("copy");
    nl.replace_route(&subnet.in_table(100))
        .expect("replace is idempotent");
    nl.delete_table_route(&subnet).expect("delete from main");
    let shown = ip(&["-n", &cont.name, "route", "show", "table", "100"]);
    let moved = "10.23.0.0/24 dev net1 proto kernel scope link src 10.23.0.5";
    assert!(shown.starts_with(moved), "{shown}");
    assert!(!ip(&["-n", &cont.name, "route", "show"]).contains("10.23.0.0/24"));
    nl.restore_route(&subnet).expect("back in main");
    nl.restore_route(&subnet).expect("EEXIST is ok");
    nl.delete_table_route(&subnet.in_table(100))
        .expect("out of 100");
    assert!(ip(&["-n", &cont.name, "route", "show", "table", "100"])
        .trim()
        .is_empty());
}

#[test]
fn taps_made_in_a_namespace() {
    let Some((_host, cont)) = host_and_pod("taps", "tp") else {
        return;
    };
    let spec = TapSpec {
        name: "tap0".into(),
        multi_queue: true,
        vnet_hdr: false,
        owner: Some(4242),
        group: Some(4343),
    };
    let index = cont.ns.create_tap(&spec).expect("create");
    let mut nl = cont.netlink();
    let link = nl
        .link_by_name("tap0")
        .expect("read")
        .expect("tap0 in the pod");
    assert_eq!((link.index, link.kind.as_deref()), (index, Some("tun")));
    let info = nl.tun_info(index).expect("read").expect("tun info");
    let want = TunInfo {
        tap: true,
        multi_queue: true,
        vnet_hdr: false,
        persist: true,
        owner: Some(4242),
        group: Some(4343),
    };
    assert_eq!(info, want);
    let e = cont.ns.create_tap(&spec).expect_err("the name is taken");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e:?}");
    ip(&[
        "-n", &cont.name, "link", "add", "veth9", "type", "veth", "peer", "name", "veth8",
    ]);
    let taken = TapSpec {
        name: "veth9".into(),
        ..TapSpec::default()
    };
    let e = cont.ns.create_tap(&taken).expect_err("a veth has the name");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e:?}");
    let plain = TapSpec {
        name: "tap1".into(),
        vnet_hdr: true,
        ..TapSpec::default()
    };
    let index = cont.ns.create_tap(&plain).expect("create");
    let info = nl.tun_info(index).expect("read").expect("tun info");
    assert!(info.tap && info.vnet_hdr && !info.multi_queue && info.owner.is_none());
    let veth = nl.link_by_name("veth9").expect("read").expect("veth9");
    assert_eq!(nl.tun_info(veth.index).expect("read"), None);
    nl.delete_link(index).expect("a tap deletes like any link");
}

/// Proves: a link's name by index (ioctl, no RTNL) is the one netlink reads,
/// in the calling thread's netns only, and a missing index is `None`.
#[test]
fn link_name_by_index_matches_netlink() {
    let Some((host, cont)) = host_and_pod("link_name_by_index_matches_netlink", "lni") else {
        return;
    };
    let pair = host
        .netlink()
        .create_veth(veth("veth5678abcd", "eth0", &cont.ns))
        .expect("veth");
    let in_host = |index| {
        host.ns
            .run(|| link_name(index))
            .expect("enter")
            .expect("name")
    };
    assert_eq!(in_host(pair.host_index).as_deref(), Some("veth5678abcd"));
    let pod_end = cont.link("eth0");
    let in_pod = cont.ns.run(|| link_name(pod_end.index)).expect("enter");
    assert_eq!(in_pod.expect("name").as_deref(), Some("eth0"));
    let missing = host.ns.run(|| link_name(999_999)).expect("enter");
    assert_eq!(missing.expect("no error"), None);
}
