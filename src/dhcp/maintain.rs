//! Keeping one lease: a thread per lease (as the reference) that renews at T1, rebinds at
//! T2, and after expiry takes the interface down and asks for the same address again
//! (INIT-REBOOT) until the server grants it, then brings the interface back up. Every
//! new ACK is written to the lease's record before the thread waits again.
//!
//! The thread also notices a pod that went away without DEL: the daemon's socket keeps
//! the pod's netns alive, so the interface stays; but once the netns path no longer names
//! that namespace (the runtime removed it), the lease is released and forgotten.

use super::exchange::{Ack, Client};
use super::lease::{self, Phase, Terms};
use super::lease_files::{LeaseFiles, Record};
use super::options::ClientOptions;
use super::socket::PodSocket;
use super::{ErrorKind, Timing};
use crate::netlink::TableRoute;
use ipamd::log::Level;
use ipamd::log_at;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// A kept lease, as the service holds it.
pub struct Held {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Ends an exchange in progress when the lease is released.
    cancel: AtomicBool,
    /// The lease's socket once open (CHECK reads the interface through it).
    socket: Mutex<Option<Arc<PodSocket>>>,
}

struct State {
    record: Record,
    ack: Ack,
    phase: Phase,
    /// Released: the thread sends DHCPRELEASE and ends.
    stop: bool,
    /// The pod's routes through the interface when the lease was lost (the link going
    /// down deletes them), put back when the address is granted again.
    lost_routes: Vec<TableRoute>,
}

/// What the thread needs besides the lease.
#[derive(Clone)]
pub struct Keeper {
    pub files: LeaseFiles,
    pub timing: Timing,
    pub broadcast: bool,
    /// `-hostprefix`: the host's root as the daemon sees it (a daemon in a container).
    pub host_prefix: std::path::PathBuf,
}

impl Keeper {
    /// Where the daemon finds the netns the runtime named.
    pub fn host_path(&self, netns: &std::path::Path) -> std::path::PathBuf {
        let mut p = self.host_prefix.clone().into_os_string();
        p.push(netns.as_os_str());
        std::path::PathBuf::from(p)
    }
}

impl Held {
    /// Keeps a lease just acquired on `socket` (its record already saved).
    pub fn start(keeper: Keeper, socket: PodSocket, record: Record, ack: Ack) -> Held {
        Held::spawn(keeper, record, ack, Phase::Bound, Some(socket))
    }

    /// Resumes a lease from its record after a restart: the socket is opened by the
    /// thread, and the phase is where the timers stand now.
    pub fn resume(keeper: Keeper, record: Record, ack: Ack) -> Held {
        let phase = match lease::terms(&ack) {
            Ok(t) => t.timers.phase_at(elapsed_since(record.bound_at())),
            Err(_) => Phase::Expired,
        };
        Held::spawn(keeper, record, ack, phase, None)
    }

    fn spawn(
        keeper: Keeper,
        record: Record,
        ack: Ack,
        phase: Phase,
        socket: Option<PodSocket>,
    ) -> Held {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                record,
                ack,
                phase,
                stop: false,
                lost_routes: Vec::new(),
            }),
            wake: Condvar::new(),
            cancel: AtomicBool::new(false),
            socket: Mutex::new(None),
        });
        let for_thread = Arc::clone(&shared);
        let name = format!("dhcp {}", lock(&shared).record.attachment.container_id);
        // Detached: `release` waits for the lease to end, not for the thread.
        let spawned = std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(move || run(&keeper, &for_thread, socket));
        if let Err(e) = spawned {
            log_at!(Level::Error, "cannot start a lease thread: {e}");
            lock(&shared).phase = Phase::Ended;
        }
        Held { shared }
    }

    /// The lease's current ACK, netns path and phase.
    pub fn current(&self) -> (Ack, std::path::PathBuf, Phase) {
        let s = lock(&self.shared);
        (s.ack.clone(), s.record.netns.clone(), s.phase)
    }

    /// The options the lease was acquired with.
    pub fn options(&self) -> ClientOptions {
        lock(&self.shared).record.options.clone()
    }

    /// Whether the leased address is on the pod's interface (false while the lease's
    /// socket is not open yet).
    pub fn address_on_interface(&self, terms: &Terms) -> super::Result<bool> {
        let socket = self
            .shared
            .socket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match socket {
            Some(s) => s.has_address(terms.address.addr(), terms.address.prefix_len()),
            None => Ok(false),
        }
    }

    /// Releases the lease (DHCPRELEASE when the interface is still there), forgets its
    /// record.
    ///
    /// It returns once the thread says the lease is over, not when the thread has ended:
    /// the thread then closes the packet socket, and the kernel's close of a bound packet
    /// socket waits for an RCU grace period (≈ 25 ms), which DEL need not wait for.
    pub fn release(self) {
        let mut s = lock(&self.shared);
        s.stop = true;
        self.shared.cancel.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        // Bounded: a thread that died (a bug) must not hang DEL.
        let deadline = std::time::Instant::now() + RELEASE_WAIT;
        while s.phase != Phase::Ended {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                log_at!(
                    Level::Error,
                    "{}: the lease thread did not end within {RELEASE_WAIT:?}",
                    label_of(&s)
                );
                return;
            }
            s = self
                .shared
                .wake
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// How long a release waits for the lease's thread (an exchange in progress ends within
/// 200 ms of being cancelled; the release itself is one packet).
const RELEASE_WAIT: Duration = Duration::from_secs(10);

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

fn elapsed_since(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or_default()
}

/// The thread: open the socket if resuming, then wait, act, repeat.
fn run(keeper: &Keeper, shared: &Shared, socket: Option<PodSocket>) {
    let socket = match socket {
        Some(s) => Arc::new(s),
        None => {
            let (netns, ifname) = {
                let s = lock(shared);
                (
                    keeper.host_path(&s.record.netns),
                    s.record.attachment.ifname.clone(),
                )
            };
            match PodSocket::open(&netns, &ifname) {
                Ok(s) => Arc::new(s),
                Err(e) => {
                    log_at!(
                        Level::Info,
                        "not resuming the lease of {ifname} in {}: {e}; forgetting it",
                        netns.display()
                    );
                    return end(keeper, shared);
                }
            }
        }
    };
    *shared.socket.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&socket));
    // A resumed lease past T1 acts at once; a bound one waits for its timer.
    let mut retry_at = Some(SystemTime::now());
    loop {
        let wake_at = next_event(shared, retry_at);
        if !wait_until(shared, wake_at) {
            release(keeper, shared, &socket);
            return end(keeper, shared);
        }
        if !pod_present(&socket) {
            log_at!(
                Level::Info,
                "{}: the pod's netns or interface is gone; releasing its lease",
                label(shared)
            );
            release(keeper, shared, &socket);
            return end(keeper, shared);
        }
        retry_at = step(keeper, shared, &socket);
    }
}

/// When to act next: the phase's timer, or the retry time an exchange failure set.
fn next_event(shared: &Shared, retry_at: Option<SystemTime>) -> Option<SystemTime> {
    let s = lock(shared);
    if s.phase != Phase::Bound {
        return retry_at;
    }
    let timers = lease::terms(&s.ack).ok()?.timers;
    if timers.infinite() {
        return None;
    }
    Some(s.record.bound_at() + timers.renew)
}

/// Waits until `at` (None: until released). False once released.
fn wait_until(shared: &Shared, at: Option<SystemTime>) -> bool {
    let mut s = lock(shared);
    loop {
        if s.stop {
            return false;
        }
        let left = match at {
            Some(t) => match t.duration_since(SystemTime::now()) {
                Ok(d) if !d.is_zero() => d,
                _ => return true,
            },
            // Wake now and then to notice a pod that is gone.
            None => Duration::from_secs(60),
        };
        let (guard, timeout) = shared
            .wake
            .wait_timeout(s, left.min(Duration::from_secs(60)))
            .unwrap_or_else(|p| p.into_inner());
        s = guard;
        if timeout.timed_out() && at.is_none() {
            return true;
        }
    }
}

fn pod_present(socket: &PodSocket) -> bool {
    socket.netns_still_at_path() && socket.link_present().unwrap_or(true)
}

/// One action of the phase; the time of the next try when it failed.
fn step(keeper: &Keeper, shared: &Shared, socket: &PodSocket) -> Option<SystemTime> {
    let (ack, record, phase) = {
        let s = lock(shared);
        (s.ack.clone(), s.record.clone(), s.phase)
    };
    let timers = lease::terms(&ack).ok().map(|t| t.timers);
    let elapsed = elapsed_since(record.bound_at());
    let now = SystemTime::now();
    // Each exchange ends by the next milestone, so a short lease moves on in time.
    let until = |d: Duration| d.saturating_sub(elapsed).max(Duration::from_millis(200));
    let (outcome, window) = match (phase, timers) {
        (Phase::Bound, _) => {
            set_phase(shared, Phase::Renewing);
            return Some(now);
        }
        (Phase::Renewing, Some(t)) => (
            client(keeper, shared, socket, &record, until(t.rebind)).renew(&ack),
            until(t.rebind),
        ),
        (Phase::Rebinding, Some(t)) => (
            client(keeper, shared, socket, &record, until(t.expire)).rebind(&ack),
            until(t.expire),
        ),
        _ => (
            ask_again(keeper, shared, socket, &record, &ack),
            Duration::from_secs(120),
        ),
    };
    match outcome {
        Ok(new_ack) => {
            commit(keeper, shared, socket, new_ack, phase);
            None
        }
        Err(e) => {
            log_at!(Level::Warn, "{}: {:?}: {e}", label(shared), phase);
            let lost = e.kind == ErrorKind::Refused
                || timers.is_none_or(|t| elapsed_since(record.bound_at()) >= t.expire);
            let next_phase = match phase {
                _ if lost => Phase::Expired,
                Phase::Renewing
                    if timers.is_some_and(|t| elapsed_since(record.bound_at()) >= t.rebind) =>
                {
                    Phase::Rebinding
                }
                p => p,
            };
            if next_phase == Phase::Expired && phase != Phase::Expired {
                log_at!(Level::Error, "{}: lease of {} lost; taking the interface down until the server grants it again", label(shared), ack.message.yiaddr());
                match socket.routes_via() {
                    Ok(routes) => lock(shared).lost_routes = routes,
                    Err(e) => log_at!(Level::Warn, "{}: {e}", label(shared)),
                }
                if let Err(e) = socket.set_link_up(false) {
                    log_at!(Level::Warn, "{}: {e}", label(shared));
                }
            }
            set_phase(shared, next_phase);
            // RFC 2131 §4.4.5: wait half the time left before trying again (at least a few
            // seconds, at most a minute), but not past the next milestone (T2, the lease's
            // end: the address is not used a moment longer); after expiry, every half minute.
            if next_phase == Phase::Expired {
                return Some(SystemTime::now() + Duration::from_secs(30));
            }
            let pause = (window / 2).clamp(Duration::from_secs(2), Duration::from_secs(60));
            let retry = SystemTime::now() + pause;
            let milestone = timers.map(|t| {
                let at = if next_phase == Phase::Renewing {
                    t.rebind
                } else {
                    t.expire
                };
                record.bound_at() + at
            });
            Some(milestone.map_or(retry, |m| m.min(retry)))
        }
    }
}

/// INIT-REBOOT for the lost address. The interface is down (nothing may use an address
/// the server has not granted), and a packet cannot leave a link that is down: it comes
/// up for the exchange only, a few seconds at most, and goes down again if the server
/// does not grant the address.
fn ask_again(
    keeper: &Keeper,
    shared: &Shared,
    socket: &PodSocket,
    record: &Record,
    ack: &Ack,
) -> super::Result<Ack> {
    socket.set_link_up(true)?;
    let c = client(keeper, shared, socket, record, REBOOT_WINDOW);
    let outcome = c.reboot(ack.message.yiaddr());
    if outcome.is_err() {
        if let Err(e) = socket.set_link_up(false) {
            log_at!(Level::Warn, "{}: {e}", label(shared));
        }
    }
    outcome
}

/// How long the interface of a lost lease is up while its address is asked for again.
const REBOOT_WINDOW: Duration = Duration::from_secs(4);

fn client<'a>(
    keeper: &Keeper,
    shared: &'a Shared,
    socket: &'a PodSocket,
    record: &'a Record,
    within: Duration,
) -> Client<'a> {
    Client {
        socket,
        options: &record.options,
        timing: Timing {
            exchange: keeper.timing.exchange.min(within),
            ..keeper.timing
        },
        broadcast: keeper.broadcast,
        cancel: Some(&shared.cancel),
    }
}

/// A new ACK: recorded, then in force.
fn commit(keeper: &Keeper, shared: &Shared, socket: &PodSocket, ack: Ack, was: Phase) {
    let mut s = lock(shared);
    if ack.message.yiaddr() != s.ack.message.yiaddr() {
        log_at!(Level::Error, "{}: the server moved the lease from {} to {}; keeping the old ACK, the pod has the old address", label_of(&s), s.ack.message.yiaddr(), ack.message.yiaddr());
        return;
    }
    let record = Record::new(
        s.record.attachment.clone(),
        s.record.netns.clone(),
        s.record.options.clone(),
        &ack,
        SystemTime::now(),
    );
    // A lease not recorded is still in force: the pod has the address either way, and
    // the next renewal records it again.
    match record {
        Ok(r) => {
            if let Err(e) = keeper.files.save(&r) {
                log_at!(Level::Error, "{}: {e}", label_of(&s));
            }
            s.record = r;
        }
        Err(e) => log_at!(Level::Error, "{}: {e}", label_of(&s)),
    }
    s.ack = ack;
    s.phase = Phase::Bound;
    let lost_routes = std::mem::take(&mut s.lost_routes);
    drop(s);
    if was == Phase::Expired {
        let back = socket
            .set_link_up(true)
            .and_then(|()| socket.restore_routes(&lost_routes));
        if let Err(e) = back {
            log_at!(Level::Warn, "{}: {e}", label(shared));
        }
    }
    log_at!(
        Level::Info,
        "{}: lease renewed ({was:?} before)",
        label(shared)
    );
}

fn release(keeper: &Keeper, shared: &Shared, socket: &PodSocket) {
    let (ack, record) = {
        let s = lock(shared);
        (s.ack.clone(), s.record.clone())
    };
    if socket.link_present().unwrap_or(false) {
        let c = Client {
            socket,
            options: &record.options,
            timing: keeper.timing,
            broadcast: keeper.broadcast,
            cancel: None,
        };
        match c.release(&ack) {
            Ok(()) => log_at!(
                Level::Info,
                "{}: released {}",
                label(shared),
                ack.message.yiaddr()
            ),
            Err(e) => log_at!(Level::Warn, "{}: DHCPRELEASE not sent: {e}", label(shared)),
        }
    }
}

/// The thread's last act: the record goes, the lease is over.
fn end(keeper: &Keeper, shared: &Shared) {
    let mut s = lock(shared);
    if let Err(e) = keeper.files.remove(&s.record.attachment) {
        log_at!(Level::Error, "{}: {e}", label_of(&s));
    }
    s.phase = Phase::Ended;
    drop(s);
    *shared.socket.lock().unwrap_or_else(|p| p.into_inner()) = None;
    shared.wake.notify_all();
}

fn set_phase(shared: &Shared, phase: Phase) {
    lock(shared).phase = phase;
}

fn label(shared: &Shared) -> String {
    label_of(&lock(shared))
}

fn label_of(s: &State) -> String {
    let a = &s.record.attachment;
    format!("{}/{}/{}", a.network, a.container_id, a.ifname)
}
