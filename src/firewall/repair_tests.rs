//! Repairs on the kernel (need root: only under the isolated test runner):
//! what a flush, a deleted element or a flushed chain took comes back, and
//! nothing else does.

use super::restore;
use crate::firewall::cleanup::Del;
use crate::firewall::forward;
use crate::firewall::portmap::{self, Mapping, Masquerade, Proto, Spec};
use crate::firewall::schema::{INET, PORTMAP};
use crate::firewall::store::{owner_of, read};
use crate::firewall::test_netns::in_new_netns;
use crate::firewall::{index, macspoof, masq, Attachment, Request, Sockets};
use std::process::Command;

fn att(id: &str) -> Attachment {
    Attachment::new("net", id, "eth0")
}

fn run(op: impl Into<Request>) {
    op.into()
        .run(&Sockets::default())
        .expect("firewall operation");
}

fn nft(args: &str) -> String {
    let out = Command::new("nft")
        .args(args.split(' '))
        .output()
        .expect("run nft");
    assert!(
        out.status.success(),
        "nft {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// cnikit's two tables as `nft` prints them (no handles), each set and
/// chain a block: the blocks sorted, since `nft` lists them in the order
/// they were made, which a repair need not keep (rules keep theirs).
fn ours() -> String {
    let tables = nft("list tables");
    let mut out = String::new();
    for t in ["inet cnikit", "bridge cnikit"] {
        if !tables.contains(&format!("table {t}")) {
            continue;
        }
        let text = nft(&format!("list table {t}"));
        let mut blocks: Vec<String> = text
            .split("\n\n")
            .map(|b| b.trim_start_matches(&format!("table {t} {{\n")).to_string())
            .collect();
        blocks.sort();
        out += &format!("table {t}:\n{}", blocks.join("\n"));
    }
    out
}

fn portmap_spec(id: &str, addr: &str) -> Spec {
    Spec {
        att: att(id),
        container: vec![
            addr.parse().expect("net"),
            "fd00:9::2/64".parse().expect("net"),
        ],
        mappings: vec![
            Mapping {
                host_ip: None,
                host_port: 18080,
                proto: Proto::Tcp,
                container_port: 80,
            },
            Mapping {
                host_ip: Some("127.0.0.1".parse().expect("ip")),
                host_port: 15353,
                proto: Proto::Udp,
                container_port: 53,
            },
        ],
        masq: Masquerade {
            snat: true,
            masq_all: false,
        },
    }
}

fn masq_add(id: &str, addr: &str) -> masq::Op {
    masq::Op::Add {
        att: att(id),
        addrs: vec![addr.parse().expect("ip")],
        subnets: vec!["10.9.0.0/24".parse().expect("net")],
    }
}

/// One pod with every feature: host ports, ipMasq, the MAC spoof check and
/// the firewall plugin (in our table: the test netns has no iptables).
fn add_pod(id: &str) {
    run(portmap::Op::Add(portmap_spec(id, "10.9.0.2/24")));
    run(masq_add(id, "10.9.0.2"));
    run(macspoof::Op::add(&att(id), "veth9", "0a:58:0a:09:00:02").expect("mac"));
    run(forward::Op::Add(forward::Spec {
        att: att(id),
        addrs: vec!["10.9.0.2".parse().expect("ip")],
        admin_chain: "CNI-ADMIN".into(),
        isolation: None,
    }));
}

fn repaired() -> super::Repaired {
    restore(&Sockets::default()).expect("restore")
}

#[test]
fn a_flushed_ruleset_comes_back_whole_and_others_tables_stay_as_loaded() {
    in_new_netns("repair-flush", || {
        add_pod("c1");
        let before = ours();
        // What Debian's nftables.service loads: a flush, then the operator's own tables.
        nft("flush ruleset");
        nft("add table ip operator");
        nft("add chain ip operator input { type filter hook input priority 0 ; policy accept ; }");
        nft("add rule ip operator input tcp dport 22 counter accept");
        let theirs = nft("list table ip operator");
        let done = repaired();
        assert!(done.changes > 0, "{done:?}");
        assert_eq!(done.restored, vec![att("c1").tag()], "{done:?}");
        assert_eq!(done.attachments, 1, "one pod, four features: {done:?}");
        assert_eq!(ours(), before);
        assert_eq!(nft("list table ip operator"), theirs);
        let again = repaired();
        assert_eq!(
            again.changes, 0,
            "a second repair changes nothing: {again:?}"
        );
    });
}

#[test]
fn a_deleted_table_element_or_flushed_chain_comes_back() {
    in_new_netns("repair-parts", || {
        add_pod("c1");
        let before = ours();
        nft("delete table inet cnikit");
        repaired();
        assert_eq!(ours(), before);
        nft("delete element inet cnikit pm4-any { tcp . 18080 }");
        nft("flush chain inet cnikit pm-hostports");
        let done = repaired();
        assert_eq!(done.restored, vec![att("c1").tag()], "{done:?}");
        assert_eq!(ours(), before);
    });
}

#[test]
fn what_a_del_removed_after_a_flush_does_not_come_back() {
    in_new_netns("repair-del", || {
        add_pod("c1");
        add_pod_on("c2", "10.9.0.3");
        nft("flush ruleset");
        for op in [
            Request::from(portmap::Op::Del(Del { att: att("c1") })),
            masq::Op::Del(Del { att: att("c1") }).into(),
            macspoof::Op::Del(Del { att: att("c1") }).into(),
            forward::Op::Del(forward::Forget {
                att: att("c1"),
                addrs: Vec::new(),
            })
            .into(),
        ] {
            run(op);
        }
        let done = repaired();
        assert_eq!(done.restored, vec![att("c2").tag()], "{done:?}");
        let table = ours();
        assert!(!table.contains("10.9.0.2"), "c1 came back:\n{table}");
        assert!(table.contains("10.9.0.3"), "c2 did not:\n{table}");
    });
}

/// A second pod's host ports and masquerade only.
fn add_pod_on(id: &str, addr: &str) {
    let mut spec = portmap_spec(id, &format!("{addr}/24"));
    spec.container.truncate(1);
    for m in &mut spec.mappings {
        m.host_port += 1;
    }
    run(portmap::Op::Add(spec));
    run(masq_add(id, addr));
}

#[test]
fn a_reused_address_goes_to_the_later_attachment_and_old_records_are_reported() {
    in_new_netns("repair-later", || {
        run(masq_add("old", "10.9.0.2"));
        std::thread::sleep(std::time::Duration::from_millis(5));
        // The same address again: "old" went without DEL.
        run(masq_add("new", "10.9.0.2"));
        // A record of an older cnikit: keys only.
        let key = (PORTMAP.sets[0].clone(), vec![6, 0, 0x1f, 0x90]);
        index::remember(&PORTMAP, &att("v1").tag(), &vec![key]).expect("record");
        nft("flush ruleset");
        let done = repaired();
        assert_eq!(done.restored, vec![att("new").tag()], "{done:?}");
        assert_eq!(done.skipped.len(), 1, "{done:?}");
        assert!(done.skipped[0].1.contains("later attachment"), "{done:?}");
        assert_eq!(done.keys_only.len(), 1, "{done:?}");
        let d = super::super::dispatch::ip_masq(true, &["10.9.0.0/24".parse().expect("net")]);
        let elem = d.element("10.9.0.2".parse().expect("ip"), "");
        let have = read(&Sockets::default(), |nft| nft.get(INET, &d.set, &elem.key))
            .expect("read")
            .expect("element");
        assert_eq!(owner_of(&have), Some(att("new").tag()));
        // The old record still goes by its DEL.
        run(masq::Op::Del(Del { att: att("old") }));
        run(portmap::Op::Del(Del { att: att("v1") }));
    });
}

#[test]
fn an_attachment_whose_key_someone_else_took_is_reported_and_the_others_come_back() {
    in_new_netns("repair-conflict", || {
        run(portmap::Op::Add(portmap_spec("c1", "10.9.0.2/24")));
        add_pod_on("c2", "10.9.0.3");
        nft("delete element inet cnikit pm4-any { tcp . 18080 }");
        nft("delete element inet cnikit pm4-any { tcp . 18081 }");
        // An untagged entry for c1's host port: not cnikit's to take.
        nft("add element inet cnikit pm4-any { tcp . 18080 : 10.9.0.99 . 80 }");
        let done = repaired();
        assert_eq!(done.restored, vec![att("c2").tag()], "{done:?}");
        assert_eq!(done.skipped.len(), 1, "{done:?}");
        assert!(done.skipped[0].1.contains("already mapped"), "{done:?}");
        let map = nft("list map inet cnikit pm4-any");
        assert!(map.contains("tcp . 18081"), "{map}");
        assert!(map.contains("10.9.0.99"), "{map}");
    });
}

#[test]
fn a_repeated_add_that_failed_leaves_the_applied_one_to_replay() {
    in_new_netns("repair-readd", || {
        run(portmap::Op::Add(portmap_spec("c1", "10.9.0.2/24")));
        add_pod_on("c2", "10.9.0.3");
        // c1 again, now asking for c2's host port: refused, nothing changed.
        let mut taken = portmap_spec("c1", "10.9.0.2/24");
        taken.mappings[0].host_port = 18081;
        let refused = Request::from(portmap::Op::Add(taken)).run(&Sockets::default());
        assert!(refused.is_err(), "{refused:?}");
        nft("flush ruleset");
        let done = repaired();
        assert!(done.skipped.is_empty(), "{done:?}");
        let map = nft("list map inet cnikit pm4-any");
        assert!(map.contains("tcp . 18080 comment \"net/c1/eth0\""), "{map}");
        assert!(map.contains("tcp . 18081 comment \"net/c2/eth0\""), "{map}");
    });
}

#[test]
fn a_port_a_repeated_add_gave_up_is_not_held_against_its_next_owner() {
    in_new_netns("repair-moved", || {
        let mut moved = portmap_spec("c1", "10.9.0.2/24");
        run(portmap::Op::Add(moved.clone()));
        moved.mappings[0].host_port = 18070;
        run(portmap::Op::Add(moved.clone()));
        // c2 takes 18080, which c1 gave up; then c1's ADD comes again.
        let mut next = portmap_spec("c2", "10.9.0.3/24");
        next.container.truncate(1);
        next.mappings.truncate(1);
        run(portmap::Op::Add(next));
        run(portmap::Op::Add(moved));
        nft("flush ruleset");
        let done = repaired();
        assert!(done.skipped.is_empty(), "{done:?}");
        let map = nft("list map inet cnikit pm4-any");
        assert!(map.contains("tcp . 18080 comment \"net/c2/eth0\""), "{map}");
        assert!(map.contains("tcp . 18070 comment \"net/c1/eth0\""), "{map}");
    });
}
