//! DEL and GC by the attachments' records, on the kernel (need root: only
//! under the isolated test runner).

use crate::firewall::cleanup::{Del, Gc};
use crate::firewall::dispatch;
use crate::firewall::portmap::{self, Mapping, Masquerade, Proto, Spec};
use crate::firewall::schema::{key, Value, INET, PM4_ANY};
use crate::firewall::store::{owned, read, transact};
use crate::firewall::test_netns::in_new_netns;
use crate::firewall::{masq, Attachment, Sockets};

fn att(id: &str) -> Attachment {
    Attachment::new("idx", id, "eth0")
}

fn spec(id: &str, addr: &str, port: u16) -> Spec {
    Spec {
        att: att(id),
        container: vec![format!("{addr}/24").parse().expect("net")],
        mappings: vec![Mapping {
            host_ip: None,
            host_port: port,
            proto: Proto::Tcp,
            container_port: 80,
        }],
        masq: Masquerade {
            snat: true,
            masq_all: false,
        },
    }
}

fn run(op: impl Into<crate::firewall::Request>) {
    let req: crate::firewall::Request = op.into();
    req.run(&Sockets::default()).expect("firewall operation");
}

/// The tags of what the portmap maps hold.
fn portmap_owners() -> Vec<String> {
    read(&Sockets::default(), |nft| {
        let mut owners = Vec::new();
        let hairpin = dispatch::pm_hairpin("10.9.0.0/24".parse().expect("net"));
        for set in [&PM4_ANY, &hairpin.set] {
            owners.extend(
                nft.dump(INET, set)?
                    .iter()
                    .filter_map(crate::firewall::store::owner_of),
            );
        }
        Ok(owners)
    })
    .expect("dump")
}

#[test]
fn del_without_keys_removes_what_the_record_names() {
    in_new_netns("idx-del", || {
        run(portmap::Op::Add(spec("c1", "10.9.0.2", 18080)));
        run(portmap::Op::Add(spec("c2", "10.9.0.3", 18081)));
        run(portmap::Op::Del(Del { att: att("c1") }));
        assert_eq!(portmap_owners(), vec!["idx/c2/eth0"; 2]);
        // A second DEL (runtimes repeat it) finds nothing and succeeds.
        run(portmap::Op::Del(Del { att: att("c1") }));
    });
}

#[test]
fn gc_removes_the_attachments_not_listed() {
    in_new_netns("idx-gc", || {
        run(portmap::Op::Add(spec("c1", "10.9.0.2", 18080)));
        run(portmap::Op::Add(spec("c2", "10.9.0.3", 18081)));
        run(masq::Op::Add {
            att: att("c1"),
            addrs: vec!["10.9.0.2".parse().expect("ip")],
            subnets: vec!["10.9.0.0/24".parse().expect("net")],
        });
        let gc = Gc {
            network: "idx".into(),
            valid: vec![att("c2")],
        };
        run(portmap::Op::Gc(gc.clone()));
        run(masq::Op::Gc(gc));
        assert_eq!(portmap_owners(), vec!["idx/c2/eth0"; 2]);
        let masq_left = read(&Sockets::default(), |nft| {
            let d = dispatch::ip_masq(true, &["10.9.0.0/24".parse().expect("net")]);
            nft.dump(INET, &d.set)
        })
        .expect("dump");
        assert!(masq_left.is_empty(), "{masq_left:?}");
    });
}

/// Elements a version without records made (tagged, no record) are found
/// once by reading the sets, then deleted by key like any.
#[test]
fn elements_without_a_record_are_recorded_at_the_first_del() {
    in_new_netns("idx-old", || {
        run(portmap::Op::Add(spec("c2", "10.9.0.3", 18081)));
        let old = owned(
            key(&[Value::Proto(6), Value::Port(18080)]),
            Some(key(&[
                Value::Ip("10.9.0.2".parse().expect("ip")),
                Value::Port(80),
            ])),
            "idx/c1/eth0",
        );
        transact(&Sockets::default(), |_, tx| {
            tx.add(INET, &PM4_ANY, vec![old.clone()]);
            Ok(())
        })
        .expect("add an unrecorded element");
        // The marker a fresh node's first DEL writes would hide it: gone, as
        // after an upgrade from a version without records.
        let marker = super::marker_path(&crate::firewall::schema::PORTMAP);
        let _ = std::fs::remove_file(&marker);
        run(portmap::Op::Del(Del { att: att("c1") }));
        assert_eq!(portmap_owners(), vec!["idx/c2/eth0"; 2]);
        assert!(std::path::Path::new(&marker).exists());
    });
}

/// An ADD repeated with another host port and masquerade leaves nothing of
/// the first: its DNAT element and its hairpin element go in the same batch.
#[test]
fn a_repeated_add_drops_what_the_first_made() {
    in_new_netns("idx-readd", || {
        run(portmap::Op::Add(spec("c1", "10.9.0.2", 18080)));
        let mut again = spec("c1", "10.9.0.2", 18081);
        again.masq = Masquerade {
            snat: true,
            masq_all: true,
        };
        run(portmap::Op::Add(again));
        let (dnat, hairpin, masq_all) = read(&Sockets::default(), |nft| {
            let hairpin = dispatch::pm_hairpin("10.9.0.0/24".parse().expect("net"));
            Ok((
                nft.dump(INET, &PM4_ANY)?,
                nft.dump(INET, &hairpin.set)?,
                nft.dump(INET, &dispatch::pm_masq_all(true).set)?,
            ))
        })
        .expect("dump");
        let port = |e: &crate::firewall::nft::Element| e.key.clone();
        assert_eq!(
            dnat.iter().map(port).collect::<Vec<_>>(),
            vec![key(&[Value::Proto(6), Value::Port(18081)])]
        );
        assert!(hairpin.is_empty(), "{hairpin:?}");
        assert_eq!(masq_all.len(), 1);
    });
}

/// An ADD refused (a host port another attachment holds) leaves no record.
#[test]
fn a_failed_add_leaves_no_record() {
    in_new_netns("idx-failed", || {
        run(portmap::Op::Add(spec("c1", "10.9.0.2", 18080)));
        let refused =
            crate::firewall::Request::from(portmap::Op::Add(spec("c2", "10.9.0.3", 18080)))
                .run(&Sockets::default());
        assert!(refused.is_err(), "the port is c1's");
        let keys = super::recorded(&crate::firewall::schema::PORTMAP, "idx/c2/eth0")
            .expect("read records");
        assert!(keys.is_empty(), "{keys:?}");
    });
}

/// A pod attached by a development build of 0.2.0 has its masquerade entry
/// in the verdict map of that layout (`masq4-via`), and its record names it:
/// DEL removes it there by key.
#[test]
fn del_removes_an_entry_of_the_retired_verdict_map() {
    in_new_netns("idx-retired", || {
        let layout = r#"
table inet cnikit {
  chain masq-x { return; }
  map masq4-via { type ipv4_addr : verdict; }
}
add element inet cnikit masq4-via { 10.9.0.2 comment "idx/c1/eth0" : goto masq-x }
add element inet cnikit masq4-via { 10.9.0.3 comment "idx/c2/eth0" : goto masq-x }
"#;
        let ok = std::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .expect("stdin")
                    .write_all(layout.as_bytes())?;
                child.wait()
            })
            .expect("nft");
        assert!(ok.success());
        let via = dispatch::set_named("masq4-via").expect("a retired set");
        let ip = |a: &str| key(&[Value::Ip(a.parse().expect("ip"))]);
        super::remember(
            &crate::firewall::schema::MASQ,
            "idx/c1/eth0",
            &vec![(via.clone(), ip("10.9.0.2"))],
        )
        .expect("record");
        run(masq::Op::Del(Del { att: att("c1") }));
        let left: Vec<_> = read(&Sockets::default(), |nft| nft.dump(INET, &via))
            .expect("dump")
            .iter()
            .filter_map(crate::firewall::store::owner_of)
            .collect();
        assert_eq!(left, vec!["idx/c2/eth0"]);
    });
}
