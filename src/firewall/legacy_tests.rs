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

/// The owner of `addr`'s element in `d`'s set, if it is there.
fn owner_in(d: &Dispatch, addr: &str) -> Option<String> {
    let addr: IpAddr = addr.parse().expect("ip");
    let e = read(&Sockets::default(), |nft| {
        nft.get(INET, &d.set, &d.element(addr, "").key)
    })
    .expect("get")?;
    owner_of(&e)
}

fn net(s: &str) -> IpNet {
    s.parse().expect("net")
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
        let masq4 = dispatch::ip_masq(true, &[net("10.1.0.0/16")]);
        assert_eq!(owner_in(&masq4, "10.1.0.5").as_deref(), Some("n/c1/eth0"));
        assert_eq!(owner_in(&masq4, "10.1.0.6").as_deref(), Some("n/c2/eth0"));
        let masq6 = dispatch::ip_masq(false, &[net("fd00:1::/64")]);
        assert_eq!(owner_in(&masq6, "fd00:1::5").as_deref(), Some("n/c1/eth0"));
        let hairpin = dispatch::pm_hairpin(net("10.1.0.0/16"));
        assert_eq!(owner_in(&hairpin, "10.1.0.5").as_deref(), Some("n/c1/eth0"));
        let all = dispatch::pm_masq_all(true);
        assert_eq!(owner_in(&all, "10.1.0.6").as_deref(), Some("n/c2/eth0"));
        for d in [&masq4, &masq6, &hairpin, &all] {
            assert!(
                listing.contains(&format!("goto {}", d.chain.name)),
                "{listing}"
            );
        }
        // The moved elements are recorded: a DEL without prevResult finds them.
        crate::firewall::Request::from(crate::firewall::masq::Op::Del(crate::firewall::Del {
            att: crate::firewall::Attachment::new("n", "c1", "eth0"),
        }))
        .run(&Sockets::default())
        .expect("DEL of c1");
        assert_eq!(owner_in(&masq4, "10.1.0.5"), None);
        assert_eq!(owner_in(&masq6, "fd00:1::5"), None);
        assert_eq!(owner_in(&masq4, "10.1.0.6").as_deref(), Some("n/c2/eth0"));
        let listing = nft(&["list", "table", "inet", "cnikit"], None);
        // Once done, an upgrade finds nothing to do.
        upgrade_masq(&Sockets::default()).expect("again");
        assert_eq!(nft(&["list", "table", "inet", "cnikit"], None), listing);
    });
}
