//! A benchmark, not a timed assertion (ignored by default).

use super::*;
use std::time::Instant;

/// 200 attachments with 2 mappings each, then DEL all; prints ADD/DEL times
/// of the first and last. Each plugin runs inside a netns of its own (its
/// own, empty ruleset):
/// `tests/run --test it -- --ignored --nocapture portmap::scale`.
#[test]
#[ignore]
fn scale_200_attachments() {
    let (env, ns) = TestEnv::with_netns("portmap-scale");
    let net = net_name();
    let n = 200u16;
    let conf = |i: u16| {
        let prev = fake_prev(
            &format!("10.77.{}.{}", i / 250, i % 250 + 2),
            &format!("fd77::{:x}", i + 2),
        );
        let m = two_mappings(10000 + 2 * i, 10001 + 2 * i);
        portmap_conf(&net, m, Some(&prev))
    };
    let timed = |verb: &str| -> Vec<f64> {
        (0..n)
            .map(|i| {
                let t = Instant::now();
                Call::new(env.bin.join("portmap"))
                    .env("CNI_PATH", "/nonexistent")
                    .attach_at(verb, &format!("c{i}"), "/run/netns/fake")
                    .conf(&conf(i))
                    .exec_in(&ns)
                    .run()
                    .ok();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect()
    };
    let add_ms = timed("ADD");
    let del_ms = timed("DEL");
    let (ok, listing, _) = sh("ip", &["netns", "exec", &ns.name, "nft", "list", "ruleset"]);
    assert!(ok);
    assert!(!listing.contains("elements"), "entries left:\n{listing}");
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "portmap scale: ADD #1 {:.2} ms, #200 {:.2} ms, mean of first 10 {:.2} ms, last 10 {:.2} ms; \
         DEL #1 {:.2} ms, #200 {:.2} ms (ip netns exec included)",
        add_ms[0],
        add_ms[199],
        avg(&add_ms[..10]),
        avg(&add_ms[190..]),
        del_ms[0],
        del_ms[199]
    );
}
