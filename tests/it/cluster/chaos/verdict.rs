//! The end of a chaos run: every node serves again, then the journals, the pool and the
//! clients' record are held against each other, the report is printed (and written to
//! `CNIKIT_CHAOS_REPORT` if set), and the test fails listing every violation.

use super::world::{blocks, Block, World, NETWORK};
use super::*;
use std::collections::BTreeSet;

/// The leases of node `ni`'s journal: (address, container).
fn journal(w: &World, ni: usize) -> Vec<(IpAddr, String)> {
    let n = &w.nodes[ni].node;
    leases_json(&n.data, &n.sock, Some(NETWORK))
        .iter()
        .map(|l| {
            let addr = l["address"].as_str().and_then(|a| a.parse().ok());
            let cid = l["containerId"].as_str().unwrap_or("?").to_string();
            (
                addr.unwrap_or_else(|| panic!("lease without address: {l}")),
                cid,
            )
        })
        .collect()
}

/// The lines of node `ni`'s daemon logs that say its etcd session expired.
fn logged_expiries(w: &World, ni: usize) -> Vec<String> {
    (w.nodes[ni].log_lines(0.0, f64::MAX).into_iter())
        .filter(|(_, l)| l.contains("etcd session") && l.contains("expired"))
        .map(|(t, l)| format!("{:.2}s {l}", t - w.unix0))
        .collect()
}

/// Every check; the report; panic on any violation.
pub fn judge(w: &World, s: &Settings, started: Instant) {
    for ni in 0..NODES {
        w.serves_again(ni, "final", RETURN_LIMIT);
    }
    let held: Vec<Vec<(IpAddr, String)>> = (0..NODES).map(|ni| journal(w, ni)).collect();
    let live = lock(&w.live).clone();
    // Never two holders, live or not.
    let mut holders: BTreeMap<IpAddr, Vec<(usize, String)>> = BTreeMap::new();
    for (ni, leases) in held.iter().enumerate() {
        for (a, cid) in leases {
            holders.entry(*a).or_default().push((ni, cid.clone()));
        }
    }
    // (Two live attachments with one address were caught when the second was acknowledged.)
    for (a, hs) in holders.iter().filter(|(_, hs)| hs.len() > 1) {
        let hs: Vec<String> = hs
            .iter()
            .map(|h| {
                let state = if live.get(a) == Some(h) {
                    "live"
                } else {
                    "not live"
                };
                format!("{} on {} ({state})", h.1, w.name(h.0))
            })
            .collect();
        w.violation(format!("{a} is in two journals: {}", hs.join(" and ")));
    }
    // The journals hold exactly the live attachments.
    let expiries: Vec<Vec<String>> = (0..NODES).map(|ni| logged_expiries(w, ni)).collect();
    for (ni, lines) in expiries.iter().enumerate() {
        for l in lines {
            eprintln!("chaos: {} logged: {l}", w.name(ni));
        }
    }
    let lost_session: Vec<bool> = (0..NODES)
        .map(|ni| w.cut_off[ni].load(Ordering::SeqCst) || !expiries[ni].is_empty())
        .collect();
    let mut missing_where_lost = Vec::new();
    for (a, (ni, cid)) in &live {
        if held[*ni].iter().any(|(x, c)| x == a && c == cid) {
            continue;
        }
        if lost_session[*ni] {
            missing_where_lost.push(format!("{a} of {cid} on {}", w.name(*ni)));
        } else {
            w.violation(format!(
                "acknowledged lease {a} of {cid} on {} lost",
                w.name(*ni)
            ));
        }
    }
    for (ni, leases) in held.iter().enumerate() {
        for (a, cid) in leases {
            if live.get(a) != Some(&(ni, cid.clone())) {
                w.violation(format!(
                    "{a} of {cid} on {} is in its journal but not live (DELed or never acknowledged)",
                    w.name(ni)
                ));
            }
        }
    }
    // Every lease in a block of its node's, or reclaimed from it.
    let shown = show(&w.endpoints, POOL);
    let all = blocks(&shown);
    for (ni, leases) in held.iter().enumerate() {
        let name = w.name(ni);
        for (a, cid) in leases {
            match all.iter().find(|b| b.cidr.contains(a)) {
                Some(b) if b.node == name || b.reclaimed_from(name) => {}
                other => w.violation(format!("{a} of {cid} on {name} lies in block {other:?}")),
            }
        }
    }
    // Reclaimed blocks: still quarantined, and nothing handed out from them once seen so.
    let reclaimed = lock(&w.reclaimed).clone();
    for r in &reclaimed {
        if let Some(b) = all.iter().find(|b| b.cidr == r.block && !b.node.is_empty()) {
            w.violation(format!(
                "reclaimed block {} is {}'s at the end",
                r.block, b.node
            ));
        }
    }
    let acks = lock(&w.acks).clone();
    for a in &acks {
        for r in reclaimed.iter().filter(|r| r.block.contains(&a.addr)) {
            if a.started > r.seen {
                w.violation(format!(
                    "{} acknowledged to {} on {}: an ADD started {:?} after its block {} was seen reclaimed from {}",
                    a.addr,
                    a.cid,
                    w.name(a.node),
                    a.started - r.seen,
                    r.block,
                    w.name(r.from)
                ));
            }
        }
    }
    // An address in a block that was reclaimed from its node must have been handed out
    // before the node's session could have expired in a later cut: before that cut's
    // start + TTL. After that, or after the node returned, the block was not its to use.
    // A session the node lost to the etcd members' faults counts as a cut too, from when
    // the node noticed (no earlier than it began: later is the lenient side).
    let mut cuts = lock(&w.cuts).clone();
    for ni in 0..NODES {
        for (t, _) in (w.nodes[ni].log_lines(0.0, f64::MAX).into_iter())
            .filter(|(_, l)| l.contains("etcd session") && l.contains("expired"))
        {
            let since = Duration::from_secs_f64((t - w.unix0).max(0.0));
            cuts.push((ni, w.t0 + since));
        }
    }
    for a in &acks {
        let from_it = |b: &&Block| b.cidr.contains(&a.addr) && b.reclaimed_from(w.name(a.node));
        let Some(b) = all.iter().find(from_it) else {
            continue;
        };
        let last = cuts.iter().filter(|c| c.0 == a.node).map(|c| c.1).max();
        if last.is_none_or(|cut| a.started >= cut + TTL) {
            w.violation(format!(
                "{} acknowledged to {} on {}: in block {} reclaimed from it, by an ADD that started {}",
                a.addr,
                a.cid,
                w.name(a.node),
                b.cidr,
                match last {
                    Some(cut) => format!("{:?} after its last cut", a.started - cut),
                    None => "while it was never cut off".to_string(),
                }
            ));
        }
    }
    // The pool was sized so that never-used space remained: quarantine alone had to keep
    // reclaimed addresses from being handed out again.
    let free = &shown["usage"]["blocksFree"];
    if free.as_u64().is_none_or(|n| n == 0) {
        w.violation(format!(
            "no free block left ({free}): the pool was too small"
        ));
    }
    let report = report(w, s, started, &all, &missing_where_lost, &lost_session);
    eprintln!("{report:#}");
    if let Some(path) = std::env::var_os("CNIKIT_CHAOS_REPORT") {
        std::fs::write(&path, format!("{report:#}\n")).expect("write CNIKIT_CHAOS_REPORT");
    }
    let v = lock(&w.violations).clone();
    assert!(
        v.is_empty(),
        "chaos run with seed {:#x} (CNIKIT_CHAOS_SEED): {} violation(s):\n{}\n\
         (CNIKIT_KEEP_TMP=1 keeps the daemons' and members' logs in {})",
        s.seed,
        v.len(),
        v.join("\n"),
        w.env.tmp.display()
    );
}

/// The run in numbers.
fn report(
    w: &World,
    s: &Settings,
    started: Instant,
    all: &[super::world::Block],
    missing_where_lost: &[String],
    lost_session: &[bool],
) -> Value {
    let reclaims = lock(&w.reclaim_times).clone();
    let returns = lock(&w.return_times).clone();
    let worst = reclaims.iter().map(|r| r.took).max();
    let long = lock(&w.long_rounds).clone();
    let short = lock(&w.short_rounds).clone();
    let rounds = long.values().sum::<usize>() + short.values().sum::<usize>();
    let states: BTreeSet<String> = all.iter().map(|b| b.state.clone()).collect();
    let c = &w.counts;
    json!({
        "seed": format!("{:#x}", s.seed),
        "faultSecs": s.secs,
        "wallClockSecs": started.elapsed().as_secs_f64(),
        "rounds": rounds,
        "longRounds": long,
        "shortRounds": short,
        "worstReclaimSecs": worst.map(|d| d.as_secs_f64()),
        "reclaimBoundSecs": (RECLAIM_AFTER + TTL).as_secs() + 10,
        "reclaims": reclaims.iter().map(|r| json!({
            "round": r.what,
            "secs": r.took.as_secs_f64(),
            "orphanedAfterSecs": r.orphaned.map(|d| d.as_secs_f64()),
            "absenceCountedAfterSecs": r.counted.map(|d| d.as_secs_f64()),
        })).collect::<Vec<_>>(),
        "returns": returns.iter().map(|(w, d)| json!([w, d.as_secs_f64()])).collect::<Vec<_>>(),
        "addsAcknowledged": c.adds_ok.load(Ordering::Relaxed),
        "addsFailed": c.adds_failed.load(Ordering::Relaxed),
        "dels": c.dels.load(Ordering::Relaxed),
        "liveAtEnd": lock(&w.live).len(),
        "blocksAtEnd": all.len(),
        "blockStates": states,
        "nodesThatMayHaveLostTheirSession": (0..NODES)
            .filter(|&ni| lost_session[ni])
            .map(|ni| w.name(ni))
            .collect::<Vec<_>>(),
        "acknowledgedLeasesMissingOnThoseNodes": missing_where_lost,
        "violations": lock(&w.violations).len(),
    })
}
