//! Kernel tests of the transaction store (need root: only under the isolated
//! test runner).

use super::*;
use crate::firewall::schema::{self, Value, INET, PM4_ANY};
use crate::firewall::Sockets;
use crate::netlink::NetNs;
use std::process::Command;

/// Runs `f` inside a new named netns (needs root: only under the
/// isolated test runner, CNIKIT_ISOLATED=1).
fn in_new_netns(tag: &str, f: impl FnOnce()) {
    if std::env::var("CNIKIT_ISOLATED").as_deref() != Ok("1") {
        eprintln!("skipping {tag}: needs an isolated root namespace (CNIKIT_ISOLATED=1)");
        return;
    }
    let name = format!("cnikit-{}-{tag}", std::process::id());
    let ip = |args: &[&str]| Command::new("ip").args(args).status().expect("run ip");
    assert!(ip(&["netns", "add", &name]).success());
    let ns = NetNs::open(format!("/run/netns/{name}")).expect("open netns");
    let out = ns.run(f);
    ip(&["netns", "del", &name]);
    out.expect("enter netns");
}

/// One message per element, as a portmap ADD of many mappings sends:
/// the batch must report the commit although it is far larger than the
/// socket's receive buffer would be in acks.
#[test]
fn a_batch_of_thousands_of_messages_reports_its_commit() {
    in_new_netns("big-batch", || {
        let owner = "big/c1/eth0";
        let elems: Vec<Element> = (0..3000u16)
            .map(|port| {
                let k = schema::key(&[Value::Proto(6), Value::Port(10000 + port)]);
                let ip = "10.1.2.3".parse().expect("ip");
                let d = schema::key(&[Value::Ip(ip), Value::Port(80)]);
                owned(k, Some(d), owner)
            })
            .collect();
        transact(&Sockets::default(), |nft, tx| {
            schema::ensure(nft, tx, &schema::PORTMAP)?;
            for e in &elems {
                tx.add(INET, &PM4_ANY, vec![e.clone()]);
            }
            Ok(())
        })
        .expect("a large batch commits");
        let have = read(&Sockets::default(), |nft| nft.dump(INET, &PM4_ANY)).expect("dump");
        assert_eq!(have.len(), elems.len());

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
        let have = read(&Sockets::default(), |nft| nft.dump(INET, &PM4_ANY)).expect("dump");
        assert_eq!(have.len(), elems.len());

        transact(&Sockets::default(), |nft, tx| {
            release(nft, tx, INET, &[&PM4_ANY], &|o| o == owner)
        })
        .expect("release");
        let have = read(&Sockets::default(), |nft| nft.dump(INET, &PM4_ANY)).expect("dump");
        assert!(have.is_empty());
    });
}

/// A removal planned from a read that another writer overtook (the element
/// is already gone when the batch arrives) is not an error: the plan is made
/// again from what is there now, and the rest of the batch applies.
#[test]
fn a_removal_of_an_element_already_gone_replans_instead_of_failing() {
    in_new_netns("stale-del", || {
        let element = |port: u16, owner: &str| {
            let k = schema::key(&[Value::Proto(6), Value::Port(port)]);
            let ip = "10.1.2.3".parse().expect("ip");
            owned(
                k,
                Some(schema::key(&[Value::Ip(ip), Value::Port(80)])),
                owner,
            )
        };
        let (kept, gone) = (element(20001, "n/kept/eth0"), element(20002, "n/gone/eth0"));
        transact(&Sockets::default(), |nft, tx| {
            schema::ensure(nft, tx, &schema::PORTMAP)?;
            tx.add(INET, &PM4_ANY, vec![kept.clone()]);
            Ok(())
        })
        .expect("add");
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
        let have = read(&Sockets::default(), |nft| nft.dump(INET, &PM4_ANY)).expect("dump");
        assert!(have.is_empty(), "the element that was there is removed");
    });
}
