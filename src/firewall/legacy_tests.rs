//! The upgrade from 0.1's layout, on the kernel (need root: only under the
//! isolated test runner).

use super::*;
use crate::firewall::test_netns::in_new_netns;
use std::io::Write;
use std::process::{Command, Stdio};

/// What cnikit 0.1 left in the kernel for two bridge pods with ipMasq (one
/// dual-stack) and two portmap pods (hairpin + localhost, and masqAll).
const LAYOUT_0_1: &str = r#"
table inet cnikit {
  set masq4 { type ipv4_addr; }
  set masq6 { type ipv6_addr; }
  set masq4-skip { type ipv4_addr . ipv4_addr; flags interval; }
  set masq6-skip { type ipv6_addr . ipv6_addr; flags interval; }
  chain masq-postrouting {
    type nat hook postrouting priority 100;
    meta nfproto ipv4 ip daddr 224.0.0.0/4 return
    meta nfproto ipv4 ip saddr . ip daddr @masq4-skip return
    meta nfproto ipv4 ip saddr @masq4 masquerade
    meta nfproto ipv6 ip6 daddr ff00::/8 return
    meta nfproto ipv6 ip6 saddr . ip6 daddr @masq6-skip return
    meta nfproto ipv6 ip6 saddr @masq6 masquerade
  }
  set pm4-addr { type ipv4_addr; }
  set pm6-addr { type ipv6_addr; }
  set pm4-masq { type ipv4_addr . ipv4_addr; flags interval; }
  set pm6-masq { type ipv6_addr . ipv6_addr; flags interval; }
  chain pm-postrouting {
    type nat hook postrouting priority 100;
    ct status dnat meta nfproto ipv4 ip saddr . ip daddr @pm4-masq masquerade
    ct status dnat meta nfproto ipv6 ip6 saddr . ip6 daddr @pm6-masq masquerade
  }
}
add element inet cnikit masq4 { 10.1.0.5 comment "n/c1/eth0", 10.1.0.6 comment "n/c2/eth0" }
add element inet cnikit masq6 { fd00:1::5 comment "n/c1/eth0" }
add element inet cnikit masq4-skip { 10.1.0.5 . 10.1.0.0/16 comment "n/c1/eth0", 10.1.0.6 . 10.1.0.0/16 comment "n/c2/eth0" }
add element inet cnikit masq6-skip { fd00:1::5 . fd00:1::/64 comment "n/c1/eth0" }
add element inet cnikit pm4-addr { 10.1.0.5 comment "n/c1/eth0", 10.1.0.6 comment "n/c2/eth0" }
add element inet cnikit pm4-masq { 10.1.0.0/16 . 10.1.0.5 comment "n/c1/eth0", 127.0.0.0/8 . 10.1.0.5 comment "n/c1/eth0", 0.0.0.0/0 . 10.1.0.6 comment "n/c2/eth0" }
"#;

fn nft(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run nft");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("nft");
    assert!(out.status.success(), "nft {args:?} failed");
    String::from_utf8(out.stdout).expect("utf-8")
}

fn via(map: &SetDef, addr: &str) -> Option<(String, String)> {
    let addr: IpAddr = addr.parse().expect("ip");
    let e = read(&Sockets::default(), |nft| {
        nft.get(INET, map, &key(&[Value::Ip(addr)]))
    })
    .expect("get")?;
    Some((owner_of(&e)?, e.goto?))
}

#[test]
fn the_first_operation_moves_0_1_elements_into_the_current_layout() {
    in_new_netns("legacy", || {
        nft(&["-f", "-"], Some(LAYOUT_0_1));
        upgrade_masq(&Sockets::default()).expect("upgrade masq");
        upgrade_portmap(&Sockets::default()).expect("upgrade portmap");
        let listing = nft(&["list", "table", "inet", "cnikit"], None);
        for gone in [
            "chain masq-postrouting ",
            "chain pm-postrouting ",
            "set masq4 ",
            "set masq4-skip ",
            "set pm4-masq ",
            "set pm4-addr ",
        ] {
            assert!(!listing.contains(gone), "{gone} is left:\n{listing}");
        }
        let c1 = masq_chain(true, &["10.1.0.0/16".parse().expect("net")]).name;
        assert_eq!(
            via(&MASQ4_VIA, "10.1.0.5"),
            Some(("n/c1/eth0".into(), c1.clone()))
        );
        assert_eq!(via(&MASQ4_VIA, "10.1.0.6"), Some(("n/c2/eth0".into(), c1)));
        let c6 = masq_chain(false, &["fd00:1::/64".parse().expect("net")]).name;
        assert_eq!(via(&MASQ6_VIA, "fd00:1::5"), Some(("n/c1/eth0".into(), c6)));
        let hairpin = hairpin_chain("10.1.0.0/16".parse().expect("net")).name;
        assert_eq!(
            via(&PM4_MASQ_VIA, "10.1.0.5"),
            Some(("n/c1/eth0".into(), hairpin))
        );
        assert_eq!(
            via(&PM4_MASQ_VIA, "10.1.0.6"),
            Some(("n/c2/eth0".into(), PM_MASQ_ALL.to_string()))
        );
        // Once done, an upgrade finds nothing to do.
        upgrade_masq(&Sockets::default()).expect("again");
        assert_eq!(nft(&["list", "table", "inet", "cnikit"], None), listing);
    });
}
