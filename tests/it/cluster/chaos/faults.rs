//! The two fault injectors of the chaos test.
//!
//! The long one cuts one node at a time off from etcd (a partition, its daemon SIGSTOPped,
//! or SIGKILLed), either until `pool show` no longer gives it the blocks it had (timed: the
//! reclaim time) and a while longer, or for a time that ends somewhere between the session's
//! expiry and `reclaimAfter` + TTL + 1.5 s after the cut (the node returns while its blocks
//! are being reclaimed, or just before); then it lets the node return and times until the
//! node serves an ADD again. The short one, every 1–3 s, SIGKILLs or SIGSTOPs one etcd
//! member for up to 2.5 s, or a node daemon, or partitions a node, for up to 1 s (a third of
//! the TTL). Denser member faults (every 0.3–1.5 s) made a reclaim overrun its bound now and
//! then: every node able to take the reclaimer's role was restarting or fenced for seconds.

use super::world::{blocks, Block, ReclaimTime, Reclaimed, StopOnDrop, World};
use super::*;

/// How a node is cut off from etcd, and how it comes back.
#[derive(Clone, Copy, Debug)]
enum Cut {
    Partition,
    Freeze,
    Kill,
}

impl Cut {
    fn name(self, full: bool) -> &'static str {
        match (self, full) {
            (Cut::Partition, true) => "partition",
            (Cut::Freeze, true) => "sigstop",
            (Cut::Kill, true) => "sigkill",
            (Cut::Partition, false) => "partition-in-reclaim-window",
            (Cut::Freeze, false) => "sigstop-in-reclaim-window",
            (Cut::Kill, false) => "sigkill-in-reclaim-window",
        }
    }

    fn apply(self, n: &netns::NsNode, on: bool) {
        match (self, on) {
            (Cut::Partition, _) => n.partition(on),
            (Cut::Freeze, _) => n.freeze(on),
            (Cut::Kill, true) => n.kill(),
            (Cut::Kill, false) => n.restart(),
        }
    }
}

/// The blocks of `shown` among `which`.
fn among(shown: &Value, which: &[ipnet::IpNet]) -> Vec<Block> {
    blocks(shown)
        .into_iter()
        .filter(|b| which.contains(&b.cidr))
        .collect()
}

/// The blocks of `owned` that node `ni` no longer has (`now`, from `pool show`): each must
/// be quarantined (no node, `reclaimedFrom` it), not freed nor handed to another node (the
/// pool has never-used space left). They are recorded as seen reclaimed now.
fn reclaimed(w: &World, what: &str, ni: usize, owned: &[ipnet::IpNet], now: &[Block]) {
    let seen = Instant::now();
    let name = w.name(ni);
    for b in owned {
        match now.iter().find(|x| x.cidr == *b) {
            None => w.violation(format!("{what}: block {b} freed, not quarantined")),
            Some(x) if x.node == name => continue,
            Some(x) if x.reclaimed_from(name) => {}
            Some(x) => w.violation(format!("{what}: block {b} reclaimed as {x:?}")),
        }
        lock(&w.reclaimed).push(Reclaimed {
            block: *b,
            from: ni,
            seen,
        });
    }
}

/// Wait until `pool show` gives node `ni` none of `owned`, and record how long that took
/// since `t0` (and when `pool show` first said the node had no session, and first counted
/// its absence); longer than `reclaimAfter` + TTL + 10 s is a violation.
fn await_reclaim(w: &World, what: &str, ni: usize, owned: &[ipnet::IpNet], t0: Instant) {
    let bound = RECLAIM_AFTER + TTL + Duration::from_secs(10);
    let (mut orphaned, mut counted) = (None, None);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let Some(shown) = w.show() else { continue };
        let now = among(&shown, owned);
        let mine: Vec<&Block> = now.iter().filter(|b| b.node == w.name(ni)).collect();
        if orphaned.is_none() && mine.iter().any(|b| b.state == "orphaned") {
            orphaned = Some(t0.elapsed());
        }
        if counted.is_none() && mine.iter().any(|b| b.absent_for.is_some()) {
            counted = Some(t0.elapsed());
        }
        if mine.is_empty() {
            let took = t0.elapsed();
            w.say(&format!(
                "{what}: blocks reclaimed after {took:?} (orphaned after {orphaned:?}, absence counted after {counted:?}): {now:?}"
            ));
            reclaimed(w, what, ni, owned, &now);
            if took > bound {
                w.violation(format!(
                    "{what}: blocks reclaimed after {took:?} > {bound:?}"
                ));
                w.dump_logs(t0);
            } else if took + Duration::from_secs(3) > bound {
                w.say(&format!(
                    "{what}: close to the bound; what the daemons said:"
                ));
                w.dump_logs(t0);
            }
            lock(&w.reclaim_times).push(ReclaimTime {
                what: what.to_string(),
                took,
                orphaned,
                counted,
            });
            return;
        }
        if t0.elapsed() > bound + Duration::from_secs(5) {
            w.violation(format!("{what}: {now:?} not reclaimed within {bound:?}"));
            w.dump_logs(t0);
            return;
        }
    }
}

/// One long round on node `ni`.
fn long_round(w: &World, rng: &mut Rng, round: usize, ni: usize, cut: Cut, full: bool) {
    let name = w.name(ni).to_string();
    let what = format!("round {round}: {} of {name}", cut.name(full));
    let t = Instant::now();
    let owned = loop {
        let owned: Vec<ipnet::IpNet> = (w.show().map(|s| blocks(&s)).into_iter().flatten())
            .filter(|b| b.node == name)
            .map(|b| b.cidr)
            .collect();
        if !owned.is_empty() {
            break owned;
        }
        if t.elapsed() > Duration::from_secs(10) {
            w.violation(format!("{what}: {name} owns no block to lose"));
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    w.say(&format!("{what} (owning {owned:?})"));
    w.timing.store(full, Ordering::SeqCst);
    let t0 = Instant::now();
    cut.apply(&w.nodes[ni], true);
    lock(&w.cuts).push((ni, t0));
    w.cut_off[ni].store(true, Ordering::SeqCst);
    if full {
        await_reclaim(w, &what, ni, &owned, t0);
        w.timing.store(false, Ordering::SeqCst);
        // Sometimes back at once, sometimes a while later.
        std::thread::sleep(ms(rng, 0, 2500));
    } else {
        let lo = (TTL + Duration::from_millis(500)).as_millis() as u64;
        let hi = (TTL + RECLAIM_AFTER + Duration::from_millis(1500)).as_millis() as u64;
        std::thread::sleep(t0 + ms(rng, lo, hi) - Instant::now());
    }
    cut.apply(&w.nodes[ni], false);
    w.say(&format!("{what}: back after {:?}", t0.elapsed()));
    if let Some(took) = w.serves_again(ni, &format!("back{round}"), RETURN_LIMIT) {
        w.say(&format!("{what}: serving again after {took:?}"));
        lock(&w.return_times).push((what.clone(), took));
    }
    if !full {
        // Whichever won the race, each block is the node's or quarantined.
        if let Some(shown) = w.show() {
            let now = among(&shown, &owned);
            w.say(&format!("{what}: the blocks it had are now {now:?}"));
            reclaimed(w, &what, ni, &owned, &now);
        }
    }
    *lock(&w.long_rounds).entry(cut.name(full)).or_default() += 1;
}

/// The long injector: rounds until the time is up and `rounds` were run. The first round
/// is a partition until the reclaim; later ones pick a partition twice as often as the
/// others, and one in three ends in the reclaim window.
pub(super) fn long_faults(w: &World, s: &Settings, deadline: Instant) {
    let _stop = StopOnDrop(&w.stop);
    let mut rng = s.rng(1);
    let mut round = 0;
    while (Instant::now() < deadline || round < s.rounds) && !w.stop.load(Ordering::SeqCst) {
        let (cut, full) = match round {
            0 => (Cut::Partition, true),
            _ => (
                *rng.pick(&[Cut::Partition, Cut::Partition, Cut::Freeze, Cut::Kill]),
                rng.below(3) != 0,
            ),
        };
        let ni = rng.below(NODES);
        if !w.take(ni) {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        round += 1;
        long_round(w, &mut rng, round, ni, cut, full);
        w.give_back(ni);
        std::thread::sleep(ms(&mut rng, 500, 2000));
    }
}

/// The short injector, until `done`: one fault at a time.
pub(super) fn short_faults(w: &World, etcd: &mut Etcd, s: &Settings, done: &AtomicBool) {
    let _stop = StopOnDrop(&w.stop);
    let mut rng = s.rng(2);
    while !done.load(Ordering::SeqCst) && !w.stop.load(Ordering::SeqCst) {
        let kind = rng.below(5);
        let name: &'static str = if kind < 2 {
            let n = etcd.member_count();
            let timing = w.timing.load(Ordering::SeqCst);
            let m = if timing {
                // A new leader gives every lease its whole TTL again: the cut-off node's
                // session would outlive the TTL the reclaim bound counts from the cut.
                let Some(leader) = etcd.leader() else {
                    continue;
                };
                (leader + 1 + rng.below(n - 1)) % n
            } else {
                rng.below(n)
            };
            let d = ms(&mut rng, 300, 2500);
            let which = if timing {
                format!("{m} (a follower: a reclaim is timed)")
            } else {
                m.to_string()
            };
            if kind == 0 {
                w.say(&format!("SIGKILL etcd member {which} for {d:?}"));
                etcd.kill(m);
                std::thread::sleep(d);
                etcd.restart(m);
                etcd.wait(m);
                "etcd-sigkill"
            } else {
                w.say(&format!("SIGSTOP etcd member {which} for {d:?}"));
                etcd.freeze(m, true);
                std::thread::sleep(d);
                etcd.freeze(m, false);
                "etcd-sigstop"
            }
        } else {
            let ni = rng.below(NODES);
            if !w.take(ni) {
                continue;
            }
            let n = &w.nodes[ni];
            // At most a third of the TTL: the session outlives it.
            let d = ms(&mut rng, 100, 1000);
            let (name, cut) = match kind {
                2 => ("node-sigkill", Cut::Kill),
                3 => ("node-sigstop", Cut::Freeze),
                _ => ("node-partition", Cut::Partition),
            };
            cut.apply(n, true);
            std::thread::sleep(d);
            cut.apply(n, false);
            w.say(&format!("{name} of {} for {d:?}", n.node.name));
            w.give_back(ni);
            name
        };
        *lock(&w.short_rounds).entry(name).or_default() += 1;
        std::thread::sleep(ms(&mut rng, 1000, 3000));
    }
}
