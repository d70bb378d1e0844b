//! CHECK of bridge/ptp `ipMasq` on the kernel (needs root: only under the
//! isolated test runner): it passes after ADD, fails naming what went, and
//! passes again once an ADD put it back.

use super::Op;
use crate::firewall::dispatch::{self, Dispatch};
use crate::firewall::schema::{INET, MASQ_BASE};
use crate::firewall::store::transact;
use crate::firewall::test_netns::in_new_netns;
use crate::firewall::{Attachment, ErrorKind, Request, Sockets};
use ipnet::IpNet;
use std::io::Write;
use std::process::{Command, Stdio};

const ADDR: &str = "10.9.0.2";

fn subnets() -> Vec<IpNet> {
    vec!["10.9.0.0/24".parse().expect("net")]
}

fn att(id: &str) -> Attachment {
    Attachment::new("mc", id, "eth0")
}

fn add(id: &str) {
    let op = Op::Add {
        att: att(id),
        addrs: vec![ADDR.parse().expect("ip")],
        subnets: subnets(),
    };
    Request::from(op)
        .run(&Sockets::default())
        .expect("masq-add");
}

fn check(id: &str) -> crate::firewall::Result<()> {
    let op = Op::Check {
        att: att(id),
        addrs: vec![ADDR.parse().expect("ip")],
        subnets: subnets(),
    };
    Request::from(op).run(&Sockets::default())
}

/// CHECK of `id` fails as a mismatch whose message says `what`.
fn assert_missing(id: &str, what: &str) {
    let e = check(id).expect_err("CHECK must fail");
    assert_eq!(e.kind, ErrorKind::Mismatch, "{e}");
    let want = format!("CHECK: masquerade of {ADDR}: {what}");
    assert_eq!(e.message, want);
}

/// Someone else's `nft` command, as an administrator would type it.
fn nft(script: &str) {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("run nft");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(script.as_bytes()).expect("write");
    drop(stdin);
    assert!(child.wait().expect("nft").success(), "nft: {script}");
}

fn network() -> Dispatch {
    dispatch::ip_masq(true, &subnets())
}

#[test]
fn check_names_what_went_and_passes_once_add_put_it_back() {
    in_new_netns("masq-check", || {
        let d = network();
        add("c1");
        check("c1").expect("CHECK right after ADD");
        nft(&format!(
            "delete element inet cnikit {} {{ {ADDR} }}",
            d.set.name
        ));
        assert_missing("c1", &format!("set {} has no entry for {ADDR}", d.set.name));
        add("c1");
        check("c1").expect("CHECK after the ADD put the entry back");
        nft("delete table inet cnikit");
        let set = &d.set.name;
        assert_missing("c1", &format!("set {set} of table inet cnikit is missing"));
        add("c1");
        check("c1").expect("CHECK after the ADD made the table again");
    });
}

#[test]
fn check_fails_when_another_attachment_took_the_address() {
    in_new_netns("masq-check-owner", || {
        add("c1");
        add("c2");
        check("c2").expect("the address is c2's now");
        let e = check("c1").expect_err("c1 no longer holds it");
        assert_eq!(e.kind, ErrorKind::Mismatch);
        assert!(e.message.contains("belongs to"), "{}", e.message);
        assert!(e.message.contains("c2"), "{}", e.message);
    });
}

#[test]
fn check_fails_on_a_flushed_chain_or_a_lost_rule() {
    in_new_netns("masq-check-rules", || {
        let d = network();
        let chain = &d.chain.name;
        add("c1");
        nft(&format!("flush chain inet cnikit {chain}"));
        let made_with = d.chain.rules.len();
        assert_missing(
            "c1",
            &format!("chain {chain} has 0 rules, not the {made_with} it is made with"),
        );
        nft("delete table inet cnikit");
        add("c1");
        transact(&Sockets::default(), |nft, tx| {
            let handle = nft.rule_looking_up(INET, MASQ_BASE, &d.set.name)?;
            tx.delete_rule(INET, MASQ_BASE, handle.expect("the network's rule"));
            Ok(())
        })
        .expect("delete the network's rule");
        let set = &d.set.name;
        assert_missing(
            "c1",
            &format!("the rule in {MASQ_BASE} that sends set {set} to chain {chain} is missing"),
        );
    });
}
