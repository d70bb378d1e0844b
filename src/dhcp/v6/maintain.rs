//! Keeping one DHCPv6 lease: a thread per lease, as for DHCPv4 (`super::super::maintain`),
//! that RENEWs at T1, REBINDs at T2, and at the valid lifetime's end takes the address
//! off the pod's interface (the rest of the interface, its IPv4 lease included, keeps
//! working) and SOLICITs the same address every 30 s until a server grants it, then puts
//! it back. Every new REPLY is recorded before the thread waits again; a pod gone without
//! DEL is released at the next timer (at least every minute), as DHCPv4's.

use super::super::keep::{after_failure, elapsed_since, Control, HeldLease, Keeper};
use super::super::lease::Phase;
use super::super::lease_files::LeaseFiles;
use super::super::{ErrorKind, Timing};
use super::exchange::Client6;
use super::lease::{self, Lease6, Record6, Terms6};
use super::message::Identity;
use super::socket::Socket6;
use ipamd::log::Level;
use ipamd::log_at;
use ipnet::IpNet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// A kept DHCPv6 lease, as the service holds it.
pub struct Held6 {
    shared: Arc<Shared>,
}

struct Shared {
    control: Control,
    state: Mutex<State>,
    socket: Mutex<Option<Arc<Socket6>>>,
}

struct State {
    record: Record6,
    id: Identity,
    lease: Lease6,
}

impl Held6 {
    /// Keeps a lease just acquired on `socket` (its record already saved).
    pub fn start(
        keeper: Keeper,
        socket: Socket6,
        record: Record6,
        lease: Lease6,
    ) -> super::super::Result<Held6> {
        let id = record.identity()?;
        Ok(Held6::spawn(
            keeper,
            record,
            id,
            lease,
            Phase::Bound,
            Some(socket),
        ))
    }

    /// Resumes a lease from its record after a restart.
    pub fn resume(keeper: Keeper, record: Record6) -> super::super::Result<Held6> {
        let (id, lease) = (record.identity()?, record.lease()?);
        let phase = match lease::terms(&lease, id.iaid) {
            Ok(t) => t.timers.phase_at(elapsed_since(record.bound_at())),
            Err(_) => Phase::Expired,
        };
        Ok(Held6::spawn(keeper, record, id, lease, phase, None))
    }

    fn spawn(
        keeper: Keeper,
        record: Record6,
        id: Identity,
        lease: Lease6,
        phase: Phase,
        socket: Option<Socket6>,
    ) -> Held6 {
        let name = format!("dhcp6 {}", record.attachment.container_id);
        let shared = Arc::new(Shared {
            control: Control::new(phase),
            state: Mutex::new(State { record, id, lease }),
            socket: Mutex::new(None),
        });
        let for_thread = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(move || run(&keeper, &for_thread, socket));
        if let Err(e) = spawned {
            log_at!(Level::Error, "cannot start a DHCPv6 lease thread: {e}");
            shared.control.set_phase(Phase::Ended);
        }
        Held6 { shared }
    }

    /// The lease's terms, netns path and phase.
    pub fn current(&self) -> (super::super::Result<Terms6>, std::path::PathBuf, Phase) {
        let s = lock(&self.shared.state);
        let terms = lease::terms(&s.lease, s.id.iaid);
        (terms, s.record.netns.clone(), self.shared.control.phase())
    }

    /// Releases the lease (RELEASE when the interface is still there) and forgets its
    /// record; returns once the thread says the lease is over (bounded).
    pub fn release(self) {
        let label = label(&self.shared);
        self.shared.control.stop_and_wait(&label);
    }
}

impl HeldLease for Held6 {
    fn leased(&self) -> super::super::Result<(IpNet, Phase)> {
        let (terms, _, phase) = self.current();
        Ok((IpNet::V6(terms?.address), phase))
    }

    fn address_on_interface(&self, address: IpNet) -> super::super::Result<bool> {
        match lock(&self.shared.socket).clone() {
            Some(s) => s.link().has_address(address),
            None => Ok(false),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn run(keeper: &Keeper, shared: &Shared, socket: Option<Socket6>) {
    let socket = match socket {
        Some(s) => Arc::new(s),
        None => {
            let (netns, ifname) = {
                let s = lock(&shared.state);
                (
                    keeper.host_path(&s.record.netns),
                    s.record.attachment.ifname.clone(),
                )
            };
            match Socket6::open(&netns, &ifname, keeper.timing.exchange) {
                Ok(s) => Arc::new(s),
                Err(e) => {
                    log_at!(
                        Level::Info,
                        "not resuming the DHCPv6 lease of {ifname} in {}: {e}; forgetting it",
                        netns.display()
                    );
                    return end(&keeper.files, shared);
                }
            }
        }
    };
    *lock(&shared.socket) = Some(Arc::clone(&socket));
    let mut retry_at = Some(SystemTime::now());
    loop {
        let wake_at = next_event(shared, retry_at);
        if !shared.control.wait_until(wake_at) {
            release(keeper, shared, &socket);
            return end(&keeper.files, shared);
        }
        if !socket.link().present() {
            log_at!(
                Level::Info,
                "{}: the pod's netns or interface is gone; releasing its DHCPv6 lease",
                label(shared)
            );
            release(keeper, shared, &socket);
            return end(&keeper.files, shared);
        }
        retry_at = step(keeper, shared, &socket);
    }
}

fn next_event(shared: &Shared, retry_at: Option<SystemTime>) -> Option<SystemTime> {
    if shared.control.phase() != Phase::Bound {
        return retry_at;
    }
    let s = lock(&shared.state);
    let timers = lease::terms(&s.lease, s.id.iaid).ok()?.timers;
    if timers.infinite() {
        return None;
    }
    Some(s.record.bound_at() + timers.renew)
}

/// One action of the phase; the time of the next try when it failed.
fn step(keeper: &Keeper, shared: &Shared, socket: &Socket6) -> Option<SystemTime> {
    let (lease, id, bound_at) = {
        let s = lock(&shared.state);
        (s.lease.clone(), s.id.clone(), s.record.bound_at())
    };
    let phase = shared.control.phase();
    let terms = lease::terms(&lease, id.iaid).ok();
    let timers = terms.as_ref().map(|t| t.timers);
    let elapsed = elapsed_since(bound_at);
    let until = |d: Duration| d.saturating_sub(elapsed).max(Duration::from_millis(200));
    let client = |within: Duration| Client6 {
        socket,
        id: &id,
        timing: Timing {
            exchange: keeper.timing.exchange.min(within),
            ..keeper.timing
        },
        cancel: Some(&shared.control.cancel),
    };
    let (outcome, window) = match (phase, timers) {
        (Phase::Bound, _) => {
            shared.control.set_phase(Phase::Renewing);
            return Some(SystemTime::now());
        }
        (Phase::Renewing, Some(t)) => (client(until(t.rebind)).renew(&lease), until(t.rebind)),
        (Phase::Rebinding, Some(t)) => (client(until(t.expire)).rebind(&lease), until(t.expire)),
        _ => (
            client(ASK_AGAIN_WINDOW).acquire(lease.address(id.iaid)),
            Duration::from_secs(120),
        ),
    };
    match outcome {
        Ok(new) => {
            commit(keeper, shared, socket, new, phase);
            None
        }
        Err(e) => {
            log_at!(Level::Warn, "{}: DHCPv6 {:?}: {e}", label(shared), phase);
            let refused = e.kind == ErrorKind::Refused;
            let (next, retry) = after_failure(phase, timers, bound_at, refused, window);
            if next == Phase::Expired && phase != Phase::Expired {
                if let Some(t) = &terms {
                    log_at!(Level::Error, "{}: DHCPv6 lease of {} lost; its address is off the interface until a server grants it again", label(shared), t.address);
                    set_address(socket, t, false);
                }
            }
            shared.control.set_phase(next);
            Some(retry)
        }
    }
}

/// How long a lost lease's SOLICIT for its address goes on each time.
const ASK_AGAIN_WINDOW: Duration = Duration::from_secs(4);

/// Adds or removes the leased address on the pod's interface (a lost lease's address
/// goes; the one granted again comes back as the plugin added it: without DAD).
fn set_address(socket: &Socket6, terms: &Terms6, on: bool) {
    let link = socket.link();
    let done = link.netlink().and_then(|mut nl| {
        let r = match on {
            true => nl.add_ipv6_address(link.ifindex(), terms.address, true),
            false => nl.del_address(link.ifindex(), IpNet::V6(terms.address)),
        };
        r.map_err(|e| link.netlink_error(&e))
    });
    if let Err(e) = done {
        log_at!(Level::Warn, "{}: {e}", link.describe());
    }
}

/// A new REPLY: recorded, then in force.
fn commit(keeper: &Keeper, shared: &Shared, socket: &Socket6, new: Lease6, was: Phase) {
    let mut s = lock(&shared.state);
    let (old, now) = (s.lease.address(s.id.iaid), new.address(s.id.iaid));
    if old != now {
        log_at!(Level::Error, "{}: the server moved the DHCPv6 lease from {old:?} to {now:?}; releasing the new one, the pod keeps the old address", label_of(&s));
        let c = Client6 {
            socket,
            id: &s.id,
            timing: keeper.timing,
            cancel: None,
        };
        if let Err(e) = c.release(&new) {
            log_at!(Level::Warn, "{}: {e}", label_of(&s));
        }
        return;
    }
    match Record6::new(
        s.record.attachment.clone(),
        s.record.netns.clone(),
        &s.id,
        &new,
        SystemTime::now(),
    ) {
        Ok(r) => {
            if let Err(e) = keeper.files.save(&r) {
                log_at!(Level::Error, "{}: {e}", label_of(&s));
            }
            s.record = r;
        }
        Err(e) => log_at!(Level::Error, "{}: {e}", label_of(&s)),
    }
    s.lease = new;
    let terms = lease::terms(&s.lease, s.id.iaid);
    drop(s);
    shared.control.set_phase(Phase::Bound);
    if let (Phase::Expired, Ok(t)) = (was, &terms) {
        set_address(socket, t, true);
    }
    log_at!(
        Level::Info,
        "{}: DHCPv6 lease renewed ({was:?} before)",
        label(shared)
    );
}

fn release(keeper: &Keeper, shared: &Shared, socket: &Socket6) {
    let (lease, id) = {
        let s = lock(&shared.state);
        (s.lease.clone(), s.id.clone())
    };
    if socket.link().link_present().unwrap_or(false) {
        let c = Client6 {
            socket,
            id: &id,
            timing: keeper.timing,
            cancel: None,
        };
        match c.release(&lease) {
            Ok(()) => log_at!(
                Level::Info,
                "{}: released {:?}",
                label(shared),
                lease.address(id.iaid)
            ),
            Err(e) => log_at!(
                Level::Warn,
                "{}: DHCPv6 RELEASE not sent: {e}",
                label(shared)
            ),
        }
    }
}

fn end(files: &LeaseFiles, shared: &Shared) {
    let attachment = lock(&shared.state).record.attachment.clone();
    if let Err(e) = files.remove::<Record6>(&attachment) {
        log_at!(Level::Error, "{}: {e}", label(shared));
    }
    *lock(&shared.socket) = None;
    shared.control.set_phase(Phase::Ended);
}

fn label(shared: &Shared) -> String {
    label_of(&lock(&shared.state))
}

fn label_of(s: &State) -> String {
    let a = &s.record.attachment;
    format!("{}/{}/{} (v6)", a.network, a.container_id, a.ifname)
}
