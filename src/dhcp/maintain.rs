//! Keeping one lease: a thread per lease (as the reference) that renews at T1, rebinds at
//! T2, and after expiry takes the interface down and asks for the same address again
//! (INIT-REBOOT) until the server grants it, then brings the interface back up. Every
//! new ACK is written to the lease's record before the thread waits again.
//!
//! The thread also notices a pod that went away without DEL: the daemon's socket keeps
//! the pod's netns alive, so the interface stays; but once the netns path no longer names
//! that namespace (the runtime removed it), the lease is released and forgotten.

use super::exchange::{Ack, Client};
use super::keep::{after_failure, elapsed_since, kept_or_given_back, Control, HeldLease, Keeper};
use super::lease::{self, Phase, Terms};
use super::lease_files::Record;
use super::options::ClientOptions;
use super::socket::PodSocket;
use super::{ErrorKind, Timing};
use crate::netlink::TableRoute;
use ipamd::attachment::Attachment;
use ipamd::log::Level;
use ipamd::log_at;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// A kept lease, as the service holds it.
pub struct Held {
    shared: Arc<Shared>,
}

struct Shared {
    control: Control,
    state: Mutex<State>,
    /// The lease's socket once open (CHECK reads the interface through it).
    socket: Mutex<Option<Arc<PodSocket>>>,
}

struct State {
    record: Record,
    ack: Ack,
    /// The pod's routes through the interface when the lease was lost (the link going
    /// down deletes them), put back when the address is granted again.
    lost_routes: Vec<TableRoute>,
    /// Its IPv6 addresses then (a dual-stack pod's: the link going down deletes them too).
    lost_v6: Vec<ipnet::Ipv6Net>,
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
            control: Control::new(phase),
            state: Mutex::new(State {
                record,
                ack,
                lost_routes: Vec::new(),
                lost_v6: Vec::new(),
            }),
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
            shared.control.set_phase(Phase::Ended);
        }
        Held { shared }
    }

    /// The lease's current ACK, netns path and phase.
    pub fn current(&self) -> (Ack, std::path::PathBuf, Phase) {
        let s = lock(&self.shared);
        (
            s.ack.clone(),
            s.record.netns.clone(),
            self.shared.control.phase(),
        )
    }

    /// The options the lease was acquired with.
    pub fn options(&self) -> ClientOptions {
        lock(&self.shared).record.options.clone()
    }

    /// Releases the lease (DHCPRELEASE when the interface is still there), forgets its
    /// record.
    ///
    /// It returns once the thread says the lease is over, not when the thread has ended:
    /// the thread then closes the packet socket, and the kernel's close of a bound packet
    /// socket waits for an RCU grace period (≈ 25 ms), which DEL need not wait for.
    pub fn release(self) {
        let label = label(&self.shared);
        self.shared.control.stop_and_wait(&label);
    }
}

impl HeldLease for Held {
    fn leased(&self) -> super::Result<(ipnet::IpNet, Phase)> {
        let (ack, _, phase) = self.current();
        Ok((ipnet::IpNet::V4(lease::terms(&ack)?.address), phase))
    }

    fn address_on_interface(&self, address: ipnet::IpNet) -> super::Result<bool> {
        let socket = self.shared.socket.lock().unwrap_or_else(|p| p.into_inner());
        match socket.clone() {
            Some(s) => s.link().has_address(address),
            None => Ok(false),
        }
    }
}

impl Held {
    /// A new DHCPv4 lease for the attachment (DISCOVER … ACK in its netns), recorded,
    /// then kept by a thread of its own.
    pub fn acquire(
        keeper: &Keeper,
        attachment: &Attachment,
        netns: &Path,
        options: &ClientOptions,
    ) -> super::Result<(Terms, Held)> {
        let path = keeper.host_path(netns);
        let socket = PodSocket::open(&path, &attachment.ifname)?;
        let client = Client {
            socket: &socket,
            options,
            timing: keeper.timing,
            broadcast: keeper.broadcast,
            cancel: None,
        };
        let ack = client.acquire(None)?;
        let bound_at = SystemTime::now();
        // Nothing is answered before the lease is usable and on disk; a lease that is
        // not goes back to the server at once.
        let kept = lease::terms(&ack).and_then(|terms| {
            let record = Record::new(
                attachment.clone(),
                netns.to_path_buf(),
                options.clone(),
                &ack,
                bound_at,
            )?;
            keeper.files.save(&record)?;
            Ok((terms, record))
        });
        let give_back = || client.release(&ack);
        let (terms, record) = kept_or_given_back(kept, give_back, attachment, ack.yiaddr(), netns)?;
        Ok((terms, Held::start(keeper.clone(), socket, record, ack)))
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
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
        if !shared.control.wait_until(wake_at) {
            release(keeper, shared, &socket);
            return end(keeper, shared);
        }
        if !socket.link().present() {
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
    if shared.control.phase() != Phase::Bound {
        return retry_at;
    }
    let s = lock(shared);
    let timers = lease::terms(&s.ack).ok()?.timers;
    if timers.infinite() {
        return None;
    }
    Some(s.record.bound_at() + timers.renew)
}

/// One action of the phase; the time of the next try when it failed.
fn step(keeper: &Keeper, shared: &Shared, socket: &PodSocket) -> Option<SystemTime> {
    let (ack, record) = {
        let s = lock(shared);
        (s.ack.clone(), s.record.clone())
    };
    let phase = shared.control.phase();
    let timers = lease::terms(&ack).ok().map(|t| t.timers);
    let elapsed = elapsed_since(record.bound_at());
    let now = SystemTime::now();
    // Each exchange ends by the next milestone, so a short lease moves on in time.
    let until = |d: Duration| d.saturating_sub(elapsed).max(Duration::from_millis(200));
    let (outcome, window) = match (phase, timers) {
        (Phase::Bound, _) => {
            shared.control.set_phase(Phase::Renewing);
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
            let refused = e.kind == ErrorKind::Refused;
            let (next_phase, retry) =
                after_failure(phase, timers, record.bound_at(), refused, window);
            if next_phase == Phase::Expired && phase != Phase::Expired {
                log_at!(Level::Error, "{}: lease of {} lost; taking the interface down until the server grants it again", label(shared), ack.message.yiaddr());
                let link = socket.link();
                match link
                    .routes_via()
                    .and_then(|r| Ok((r, link.ipv6_addresses()?)))
                {
                    Ok((routes, v6)) => {
                        let mut s = lock(shared);
                        (s.lost_routes, s.lost_v6) = (routes, v6);
                    }
                    Err(e) => log_at!(Level::Warn, "{}: {e}", label(shared)),
                }
                if let Err(e) = socket.set_link_up(false) {
                    log_at!(Level::Warn, "{}: {e}", label(shared));
                }
            }
            shared.control.set_phase(next_phase);
            Some(retry)
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
        cancel: Some(&shared.control.cancel),
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
    let lost_routes = std::mem::take(&mut s.lost_routes);
    let lost_v6 = std::mem::take(&mut s.lost_v6);
    drop(s);
    shared.control.set_phase(Phase::Bound);
    if was == Phase::Expired {
        // Addresses before routes: an IPv6 route's gateway is reached through them.
        let back = socket
            .set_link_up(true)
            .and_then(|()| socket.link().restore_ipv6_addresses(&lost_v6))
            .and_then(|()| socket.link().restore_routes(&lost_routes));
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
    if socket.link().link_present().unwrap_or(false) {
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
    let s = lock(shared);
    if let Err(e) = keeper.files.remove::<Record>(&s.record.attachment) {
        log_at!(Level::Error, "{}: {e}", label_of(&s));
    }
    drop(s);
    *shared.socket.lock().unwrap_or_else(|p| p.into_inner()) = None;
    shared.control.set_phase(Phase::Ended);
}

fn label(shared: &Shared) -> String {
    label_of(&lock(shared))
}

fn label_of(s: &State) -> String {
    let a = &s.record.attachment;
    format!("{}/{}/{}", a.network, a.container_id, a.ifname)
}
