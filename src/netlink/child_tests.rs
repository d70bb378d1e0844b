//! Kernel tests of child links (macvlan, ipvlan) and the specs the other tests make them with;
//! they run only isolated, as `tests.rs` says.
use super::tests::{host_and_pod, veth, TestNs};
use super::*;

/// A child of `master` named `name`, of the master's MTU, arp_notify off.
pub(super) fn child_link<'a>(name: &str, master: u32, netns: Option<&'a NetNs>) -> ChildLink<'a> {
    ChildLink {
        name: name.into(),
        master_index: master,
        mtu: None,
        netns,
        arp_notify: false,
    }
}

/// A bridge-mode macvlan with the kernel's MAC.
pub(super) fn bridge_macvlan(link: ChildLink) -> MacvlanSpec {
    MacvlanSpec {
        link,
        mode: MacvlanMode::Bridge,
        mac: None,
        bc_queue_len: None,
    }
}

#[test]
fn macvlan_and_ipvlan() {
    let Some((host, cont)) = host_and_pod("macvlan_and_ipvlan", "mv") else {
        return;
    };
    let mut nl = host.netlink();
    let master = nl
        .create_veth(veth("mvmaster", "mvpeer", &cont.ns))
        .expect("veth master");
    let mv = nl
        .create_macvlan(MacvlanSpec {
            link: ChildLink {
                mtu: Some(1300),
                ..child_link("mv0", master.host_index, Some(&cont.ns))
            },
            mode: MacvlanMode::Bridge,
            mac: Some("02:11:22:33:44:55".into()),
            bc_queue_len: None,
        })
        .expect("macvlan");
    assert_eq!(mv.macvlan_mode, Some(MacvlanMode::Bridge));
    assert_eq!(mv.mac.as_deref(), Some("02:11:22:33:44:55"));
    assert!(cont.netlink().link_by_name("mv0").expect("read").is_some());
    assert!(nl.link_by_name("mv0").expect("read").is_none());

    let iv = nl.create_ipvlan(IpvlanSpec {
        link: child_link("ipv0", master.host_index, Some(&cont.ns)),
        mode: IpvlanMode::L2,
    });
    match iv {
        Ok(link) => assert_eq!(link.ipvlan_mode, Some(IpvlanMode::L2)),
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::Unsupported, "{}", e.message);
            assert!(e
                .message
                .ends_with("this kernel has no ipvlan support (CONFIG_IPVLAN)"));
        }
    }
}

/// A child created into another netns under a name the creating netns uses
/// too (a node's own eth0) lands there under that name, on every kernel; a
/// clash inside the target is AlreadyExists and leaves no link behind.
#[test]
fn child_named_like_a_host_link() {
    let Some((host, cont)) = host_and_pod("child_named_like_a_host_link", "nm") else {
        return;
    };
    let far = TestNs::new("nm-f");
    let mut nl = host.netlink();
    let eth0 = nl
        .create_veth(veth("eth0", "eth0", &far.ns))
        .expect("the host's eth0")
        .host_index;
    let spec = || bridge_macvlan(child_link("eth0", eth0, Some(&cont.ns)));
    let mv = nl.create_macvlan(spec()).expect("eth0 into the pod");
    assert_eq!(mv.name, "eth0");
    let there = cont.netlink().link_by_name("eth0").expect("read");
    assert_eq!(there.map(|l| l.index), Some(mv.index));
    let here = nl.link_by_name("eth0").expect("read").expect("host eth0");
    assert_eq!((here.index, here.kind.as_deref()), (eth0, Some("veth")));

    let e = nl
        .create_macvlan(spec())
        .expect_err("eth0 is taken in the pod");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{}", e.message);
    let mut names: Vec<String> = cont
        .netlink()
        .links()
        .expect("dump")
        .into_iter()
        .map(|l| l.name)
        .collect();
    names.sort();
    assert_eq!(names, ["eth0", "lo"], "no temporary link left");
}
