//! Kernel tests of the transaction store (need root: only under the isolated
//! test runner).

use super::*;
use crate::firewall::schema::{self, Value, INET, PM4_ANY};
use crate::firewall::test_netns::in_new_netns;
use crate::firewall::Sockets;

/// A portmap DNAT element of `owner`: TCP `port` to 10.1.2.3:80.
fn dnat(port: u16, owner: &str) -> Element {
    let k = schema::key(&[Value::Proto(6), Value::Port(port)]);
    let ip = "10.1.2.3".parse().expect("ip");
    let d = schema::key(&[Value::Ip(ip), Value::Port(80)]);
    owned(k, Some(d), owner)
}

/// Makes the portmap table and adds `elems` to PM4_ANY, one message each (as a portmap
/// ADD of many mappings sends them).
fn add_to_pm4_any(elems: &[Element]) -> Result<()> {
    transact(&Sockets::default(), |nft, tx| {
        schema::ensure(nft, tx, &schema::PORTMAP)?;
        for e in elems {
            tx.add(INET, &PM4_ANY, vec![e.clone()]);
        }
        Ok(())
    })
}

/// What PM4_ANY holds now.
fn pm4_any() -> Vec<Element> {
    read(&Sockets::default(), |nft| nft.dump(INET, &PM4_ANY)).expect("dump")
}

/// One message per element, as a portmap ADD of many mappings sends:
/// the batch must report the commit although it is far larger than the
/// socket's receive buffer would be in acks.
#[test]
fn a_batch_of_thousands_of_messages_reports_its_commit() {
    in_new_netns("big-batch", || {
        let owner = "big/c1/eth0";
        let elems: Vec<Element> = (10000..13000).map(|port| dnat(port, owner)).collect();
        add_to_pm4_any(&elems).expect("a large batch commits");
        assert_eq!(pm4_any().len(), elems.len());

        // One failing message among thousands: nothing applies, and the
        // error names that message.
        let err = transact(&Sockets::default(), |_, tx| {
            for (i, e) in elems.iter().enumerate() {
                if i == 1500 {
                    tx.flush_chain(INET, "no-such-chain");
                }
                tx.del(INET, &PM4_ANY, vec![e.clone()]);
            }
            Ok(())
        })
        .expect_err("a missing chain fails the batch");
        assert!(
            err.message
                .starts_with("flush chain no-such-chain (nothing was changed): "),
            "{}",
            err.message
        );
        assert_eq!(pm4_any().len(), elems.len());

        // Thousands of deletions in one batch, split across messages.
        transact(&Sockets::default(), |nft, tx| {
            tx.del(INET, &PM4_ANY, nft.dump(INET, &PM4_ANY)?);
            Ok(())
        })
        .expect("release");
        assert!(pm4_any().is_empty());
    });
}

/// A removal planned from a read that another writer overtook (the element
/// is already gone when the batch arrives) is not an error: the plan is made
/// again from what is there now, and the rest of the batch applies.
#[test]
fn a_removal_of_an_element_already_gone_replans_instead_of_failing() {
    in_new_netns("stale-del", || {
        let (kept, gone) = (dnat(20001, "n/kept/eth0"), dnat(20002, "n/gone/eth0"));
        add_to_pm4_any(&[kept]).expect("add");
        let mut plans = 0;
        transact(&Sockets::default(), |nft, tx| {
            plans += 1;
            // The first plan still believes in `gone`, as a DEL would whose
            // dump raced another writer's removal of it.
            let mut stale = nft.dump(INET, &PM4_ANY)?;
            if plans == 1 {
                stale.push(gone.clone());
            }
            tx.del(INET, &PM4_ANY, stale);
            Ok(())
        })
        .expect("a stale removal is planned again, not reported");
        assert_eq!(plans, 2, "planned once more after the stale removal");
        assert!(
            pm4_any().is_empty(),
            "the element that was there is removed"
        );
    });
}

/// An element of a network's set is found by its key, with its owner tag:
/// what CHECK and DEL by exact key rely on.
#[test]
fn a_network_set_element_is_found_by_its_key() {
    in_new_netns("set-get", || {
        let addr: std::net::IpAddr = "10.1.2.3".parse().expect("ip");
        let d = crate::firewall::dispatch::ip_masq(true, &["10.1.2.0/24".parse().expect("net")]);
        let elem = d.element(addr, "n/c1/eth0");
        transact(&Sockets::default(), |nft, tx| {
            schema::ensure(nft, tx, &schema::MASQ)?;
            crate::firewall::dispatch::ensure(nft, tx, &d)?;
            // Once per batch, however many pods of the network it adds.
            crate::firewall::dispatch::ensure(nft, tx, &d)?;
            tx.add(INET, &d.set, vec![elem.clone()]);
            Ok(())
        })
        .expect("add");
        let got = read(&Sockets::default(), |nft| nft.get(INET, &d.set, &elem.key)).expect("get");
        let got = got.expect("found by its key");
        assert_eq!(owner_of(&got).as_deref(), Some("n/c1/eth0"));
    });
}

/// DEL by key removes the elements the owner holds under those keys and
/// nothing else: another owner's element under one of the keys stays, as
/// does every element under other keys; keys asked for twice or missing are
/// no error.
#[test]
fn release_keys_removes_only_what_the_owner_holds() {
    in_new_netns("release-keys", || {
        let mine = dnat(20001, "n/mine/eth0");
        let theirs = dnat(20002, "n/theirs/eth0");
        let other = dnat(20003, "n/mine/eth0");
        add_to_pm4_any(&[mine.clone(), theirs.clone(), other.clone()]).expect("add");
        let missing = schema::key(&[Value::Proto(6), Value::Port(20009)]);
        let keys = vec![
            (PM4_ANY.clone(), mine.key.clone()),
            (PM4_ANY.clone(), mine.key.clone()),
            (PM4_ANY.clone(), theirs.key.clone()),
            (PM4_ANY.clone(), missing),
        ];
        transact(&Sockets::default(), |nft, tx| {
            release_keys(nft, tx, INET, &keys, "n/mine/eth0")
        })
        .expect("release by key");
        let have = pm4_any();
        let keys: Vec<_> = have.iter().map(|e| e.key.clone()).collect();
        assert_eq!(keys.len(), 2, "{have:?}");
        assert!(
            keys.contains(&theirs.key) && keys.contains(&other.key),
            "{have:?}"
        );
    });
}
