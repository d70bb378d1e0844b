//! The firewall plugin's own table by the attachments' records, on the
//! kernel (need root: only under the isolated test runner).

use super::*;
use crate::firewall::test_netns::in_new_netns;

fn att(id: &str) -> Attachment {
    Attachment::new("fw", id, "eth0")
}

fn spec(id: &str, addrs: &[&str]) -> Spec {
    Spec {
        att: att(id),
        addrs: addrs.iter().map(|a| a.parse().expect("ip")).collect(),
        admin_chain: "CNI-ADMIN".into(),
        isolation: None,
    }
}

fn run(op: Op) {
    op.run(&Sockets::default()).expect("firewall operation");
}

/// (owner, address) of every pod element, both families.
fn pods() -> Vec<(String, IpAddr)> {
    let mut out: Vec<(String, IpAddr)> = read(&Sockets::default(), |nft| {
        let mut all = Vec::new();
        for set in [&FW4_PODS, &FW6_PODS] {
            for e in nft.dump(INET, set)? {
                let addr = match e.key.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(&e.key[..]).expect("v4")),
                    _ => IpAddr::from(<[u8; 16]>::try_from(&e.key[..]).expect("v6")),
                };
                all.push((owner_of(&e).expect("tagged"), addr));
            }
        }
        Ok(all)
    })
    .expect("dump");
    out.sort();
    out
}

fn pod(id: &str, addr: &str) -> (String, IpAddr) {
    (format!("fw/{id}/eth0"), addr.parse().expect("ip"))
}

#[test]
fn add_again_with_other_addresses_drops_the_earlier_ones() {
    in_new_netns("fw-readd", || {
        run(Op::Add(spec("c1", &["10.7.0.2", "fd07::2"])));
        run(Op::Add(spec("c2", &["10.7.0.3"])));
        run(Op::Add(spec("c1", &["10.7.0.4"])));
        assert_eq!(pods(), vec![pod("c1", "10.7.0.4"), pod("c2", "10.7.0.3")]);
        // DEL without addresses (no prevResult) goes by the record.
        run(Op::Del(Forget {
            att: att("c1"),
            addrs: vec![],
        }));
        assert_eq!(pods(), vec![pod("c2", "10.7.0.3")]);
        run(Op::Gc(Gc {
            network: "fw".into(),
            valid: vec![],
        }));
        assert_eq!(pods(), vec![]);
    });
}

/// Elements of a version that kept no records for this feature are
/// recorded at the first operation, then deleted by key like any.
#[test]
fn elements_without_a_record_are_found_once() {
    in_new_netns("fw-old", || {
        run(Op::Add(spec("c2", &["10.7.0.3"])));
        transact(&Sockets::default(), |_, tx| {
            tx.add(
                INET,
                &FW4_PODS,
                vec![own_element("10.7.0.2".parse().expect("ip"), "fw/c1/eth0")],
            );
            Ok(())
        })
        .expect("an unrecorded element");
        let marker = index::marker_path(&FORWARD);
        // As on a node upgraded from before the records (the marker, if an
        // operation wrote one, would say the sets were read already).
        let _ = std::fs::remove_file(&marker);
        run(Op::Del(Forget {
            att: att("c1"),
            addrs: vec![],
        }));
        assert_eq!(pods(), vec![pod("c2", "10.7.0.3")]);
    });
}
