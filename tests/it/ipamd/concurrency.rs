//! Many plugin processes at once: against the daemon, against the store
//! in-process, both while the daemon comes up, and while it is SIGKILLed.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// Launch ADDs for containers `c{range}` in threads that all start at once.
fn launch(
    fix: &Arc<Fix>,
    conf: &Value,
    ids: std::ops::Range<usize>,
    done: &Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<(String, Outcome)>> {
    let barrier = Arc::new(Barrier::new(ids.len()));
    ids.map(|i| {
        let (fix, conf, barrier, done) = (
            Arc::clone(fix),
            conf.clone(),
            Arc::clone(&barrier),
            Arc::clone(done),
        );
        std::thread::spawn(move || {
            let cid = format!("conc-{i:02}");
            barrier.wait();
            let o = fix.add(&cid, &conf);
            done.fetch_add(1, Ordering::SeqCst);
            (cid, o)
        })
    })
    .collect()
}

/// Every ADD succeeded with a distinct allocatable address of the fixture's
/// /24, and the store lists exactly those leases.
fn check_all_distinct(fix: &Fix, results: Vec<(String, Outcome)>) {
    let nets = &fix.nets;
    let subnet: ipnet::IpNet = nets.v4.parse().expect("subnet");
    let mut by_cid = BTreeMap::new();
    let mut addrs = BTreeSet::new();
    for (cid, o) in results {
        let a = only_addr(&o.result());
        assert!(subnet.contains(&a), "{a} is not in {subnet}");
        assert!(
            a != addr(&nets.v4_addr(0))
                && a != addr(&nets.v4_addr(1))
                && a != addr(&nets.v4_addr(255)),
            "{cid} got the network, gateway or broadcast address {a}"
        );
        assert!(addrs.insert(a), "address {a} handed out twice");
        by_cid.insert(cid, a);
    }
    assert_eq!(by_cid.len(), 64);
    let leases = fix.leases();
    let listed: BTreeMap<String, IpAddr> = leases
        .iter()
        .map(|l| {
            assert_eq!(l.ifname, "eth0");
            (l.cid.clone(), l.addr)
        })
        .collect();
    assert_eq!(
        leases.len(),
        64,
        "the store must hold the 64 leases: {leases:?}"
    );
    assert_eq!(
        listed, by_cid,
        "the store's leases differ from the ADD results"
    );
}

/// Joins every client thread.
fn joined(handles: Vec<std::thread::JoinHandle<(String, Outcome)>>) -> Vec<(String, Outcome)> {
    handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect()
}

/// Proves: 64 plugin processes started at once against one /24 get 64
/// distinct addresses, all leased — with the daemon serving them all
/// (`concurrent_64::daemon`) and with no daemon, all in-process
/// (`concurrent_64::in_process`).
fn concurrent_64(mode: Mode, test: &str) {
    let fix = Arc::new(Fix::new(test, mode));
    let conf = fix.conf_24();
    let done = Arc::new(AtomicUsize::new(0));
    let results = joined(launch(&fix, &conf, 0..64, &done));
    check_all_distinct(&fix, results);
    if mode == Mode::Daemon {
        assert_eq!(
            metric(&fix.sock, ALLOCATE_OK),
            64,
            "the daemon should have served every ADD"
        );
    }
    // The files say the same once the daemon is gone.
    let mut fix = Arc::into_inner(fix).expect("threads joined");
    fix.stop_daemon();
    assert_eq!(fix.leases().len(), 64);
}
both_modes!(concurrent_64);

/// Proves: 64 plugin processes against one /24 while the daemon comes up
/// halfway through the launches (some work in-process, some through the
/// daemon, some of each at the same moment): still 64 distinct addresses, all
/// leased, whichever process wrote them.
#[test]
fn concurrent_64_mixed() {
    let fix = Arc::new(Fix::new("conc64_mixed", Mode::InProcess));
    let conf = fix.conf_24();
    let done = Arc::new(AtomicUsize::new(0));
    // 32 at once with no daemon...
    let mut handles = launch(&fix, &conf, 0..32, &done);
    // ...the daemon starts as soon as the first of them has finished...
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no ADD finished within 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut daemon = Daemon::spawn(&fix.sock, &fix.data, &[], &[]);
    // ...16 more while it is starting, 16 once it serves.
    handles.extend(launch(&fix, &conf, 32..48, &done));
    daemon.wait_ready();
    handles.extend(launch(&fix, &conf, 48..64, &done));
    let results = joined(handles);
    let served = metric(&fix.sock, ALLOCATE_OK);
    eprintln!("concurrent_64_mixed: the daemon served {served} of 64 ADDs");
    assert!(
        (16..64).contains(&served),
        "the daemon should have served between 16 and 63 of the ADDs, served {served}"
    );
    check_all_distinct(&fix, results);
    daemon.stop();
    assert_eq!(fix.leases().len(), 64);
}

/// What the client loops saw.
#[derive(Default)]
struct Ledger {
    /// ADD succeeded and no DEL succeeded since: must be leased with this address.
    held: BTreeMap<String, IpAddr>,
    /// DEL succeeded: must not be leased.
    deleted: BTreeSet<String>,
    /// Failed calls (there should be none: the client falls back in-process).
    failures: Vec<String>,
    adds: usize,
    /// Calls whose daemon died under them and that were redone in-process.
    redone: usize,
}

impl Ledger {
    /// The leases are exactly what the clients were told (`from`: where they were read).
    fn check(&self, leases: Vec<Lease>, from: &str) {
        let listed: BTreeMap<String, IpAddr> =
            leases.iter().map(|l| (l.cid.clone(), l.addr)).collect();
        assert_eq!(
            listed.len(),
            leases.len(),
            "a container holds two leases ({from})"
        );
        for (cid, addr) in &self.held {
            assert_eq!(
                listed.get(cid),
                Some(addr),
                "acknowledged ADD of {cid} ({addr}) lost or changed ({from})"
            );
        }
        for cid in &self.deleted {
            assert!(!listed.contains_key(cid), "DEL of {cid} was lost ({from})");
        }
        assert_eq!(
            listed.len(),
            self.held.len(),
            "leases nobody acknowledged ({from})"
        );
    }
}

/// Whether the daemon died under the call and the plugin redid it in-process
/// (its warning "…; retrying TARGET in-process").
fn redone_in_process(o: &Outcome) -> bool {
    o.stderr
        .lines()
        .any(|l| l.contains("retrying ") && l.contains(" in-process"))
}

/// One client loop: ADD, and DEL half of them, until `deadline`.
fn client(t: usize, fix: &Fix, conf: &Value, ledger: &Mutex<Ledger>, deadline: Instant) {
    const MAX_ITERS: usize = 200;
    let mut rng = Rng::from_clock(t as u64 + 1);
    for i in 0..MAX_ITERS {
        if Instant::now() >= deadline {
            break;
        }
        let cid = format!("crash-{t}-{i}");
        let o = fix.add(&cid, conf);
        let mut l = lock(ledger);
        l.adds += 1;
        l.redone += usize::from(redone_in_process(&o));
        if !o.success() {
            l.failures.push(format!("ADD {cid}: {}", o.stdout.trim()));
            drop(l);
            // What a runtime does after a failed ADD.
            if !fix.del(&cid, conf).success() {
                lock(ledger)
                    .failures
                    .push(format!("DEL after failed ADD {cid}"));
            }
            continue;
        }
        l.held.insert(cid.clone(), only_addr(&o.result()));
        drop(l);
        if rng.below(2) == 0 {
            let d = fix.del(&cid, conf);
            let mut l = lock(ledger);
            l.redone += usize::from(redone_in_process(&d));
            if d.success() {
                l.held.remove(&cid);
                l.deleted.insert(cid);
            } else {
                l.failures.push(format!("DEL {cid}: {}", d.stdout.trim()));
            }
        }
    }
}

/// Proves: with the daemon SIGKILLed every 100–300 ms (and restarted) while 8
/// client loops ADD and DEL, every ADD that succeeded and was not deleted is
/// still leased with the address it returned, every successful DEL stuck, no
/// address is held twice, and no call failed (clients fall back in-process
/// when the daemon dies under them). Checked through the last daemon and
/// again from the files alone.
#[test]
fn crash_safety_sigkill() {
    const CLIENTS: usize = 8;
    const RUN_FOR: Duration = Duration::from_secs(8);
    let fix = Arc::new(Fix::new("crash_sigkill", Mode::InProcess));
    let mut daemon = Daemon::start(&fix.sock, &fix.data, &[], &[]);
    // Room for every ADD without exhaustion: the test is about durability.
    let conf = fix.conf_v4("10.251.0.0/20");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let running = Arc::new(AtomicUsize::new(CLIENTS));
    let deadline = Instant::now() + RUN_FOR;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (fix, conf, ledger, running) = (
                Arc::clone(&fix),
                conf.clone(),
                Arc::clone(&ledger),
                Arc::clone(&running),
            );
            std::thread::spawn(move || {
                client(t, &fix, &conf, &ledger, deadline);
                running.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect();

    let mut rng = Rng::from_clock(99);
    let mut kills = 0;
    while running.load(Ordering::SeqCst) > 0 {
        std::thread::sleep(Duration::from_millis(100 + rng.below(201) as u64));
        if running.load(Ordering::SeqCst) == 0 {
            break;
        }
        daemon.kill();
        kills += 1;
        // Restart at once, without waiting: clients meanwhile find a stale
        // socket (connection refused) and work in-process.
        daemon = Daemon::spawn(&fix.sock, &fix.data, &[], &[]);
    }
    for c in clients {
        c.join().expect("client thread");
    }
    daemon.wait_ready();
    let ledger = Arc::into_inner(ledger)
        .expect("clients joined")
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "crash_safety_sigkill: {} ADDs, {} kept, {} deleted, {kills} daemon kills, {} calls redone in-process after the daemon died under them",
        ledger.adds,
        ledger.held.len(),
        ledger.deleted.len(),
        ledger.redone
    );
    assert!(kills >= 5, "the daemon was killed only {kills} times");
    assert!(
        ledger.redone > 0,
        "no call was caught by a kill mid-request: the test did not test that"
    );
    assert!(
        ledger.failures.is_empty(),
        "calls failed while the daemon was being killed:\n{}",
        ledger.failures.join("\n")
    );
    ledger.check(fix.leases(), "through the daemon");
    daemon.stop();
    ledger.check(fix.leases(), "from the files");
}
