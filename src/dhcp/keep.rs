//! What every lease's thread has, whatever the family: the daemon's settings for it
//! ([`Keeper`]) and the lease's phase with the means to stop it ([`Control`]): the
//! service stops a lease and waits (bounded) until its thread says it is over, and the
//! thread sleeps until its next timer or until it is stopped.

use super::lease::{Phase, Timers};
use super::lease_files::LeaseFiles;
use super::{Error, ErrorKind, Result, Timing};
use ipamd::attachment::Attachment;
use ipamd::log::Level;
use ipamd::log_at;
use ipnet::IpNet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// What CHECK asks of a held lease, whichever its family.
pub trait HeldLease {
    /// The leased address (with its prefix) and the lease's phase now.
    fn leased(&self) -> Result<(IpNet, Phase)>;

    /// Whether `address` is on the pod's interface (false while the lease's socket is not
    /// open yet).
    fn address_on_interface(&self, address: IpNet) -> Result<bool>;

    /// CHECK of the lease: in force, and its address on the interface.
    fn check_in_force(&self, ifname: &str) -> Result<()> {
        let (address, phase) = self.leased()?;
        match phase {
            Phase::Expired | Phase::Ended => Err(Error::new(
                ErrorKind::Refused,
                format!("the lease of {address} on {ifname} is {phase:?}"),
            )),
            _ if !self.address_on_interface(address)? => Err(Error::new(
                ErrorKind::Refused,
                format!("the leased address {address} is not on {ifname}"),
            )),
            _ => Ok(()),
        }
    }
}

/// What a lease's thread needs besides the lease.
#[derive(Clone)]
pub struct Keeper {
    pub files: LeaseFiles,
    pub timing: Timing,
    pub broadcast: bool,
    /// `-hostprefix`: the host's root as the daemon sees it (a daemon in a container).
    pub host_prefix: PathBuf,
}

impl Keeper {
    /// Where the daemon finds the netns the runtime named.
    pub fn host_path(&self, netns: &Path) -> PathBuf {
        let mut p = self.host_prefix.clone().into_os_string();
        p.push(netns.as_os_str());
        PathBuf::from(p)
    }
}

/// How long a release waits for the lease's thread (an exchange in progress ends within
/// 200 ms of being cancelled; the release itself is one packet).
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// A lease's phase, its stop flag, and the condition its thread and the service wait on.
pub struct Control {
    state: Mutex<(Phase, bool)>,
    wake: Condvar,
    /// Ends an exchange in progress when the lease is released.
    pub cancel: AtomicBool,
}

impl Control {
    pub fn new(phase: Phase) -> Control {
        Control {
            state: Mutex::new((phase, false)),
            wake: Condvar::new(),
            cancel: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (Phase, bool)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn phase(&self) -> Phase {
        self.lock().0
    }

    /// Sets the phase; `Ended` wakes a release waiting for it.
    pub fn set_phase(&self, phase: Phase) {
        self.lock().0 = phase;
        self.wake.notify_all();
    }

    /// Stops the lease (its thread releases it) and waits until its thread says it is
    /// over; bounded: a thread that died (a bug) must not hang DEL.
    pub fn stop_and_wait(&self, label: &str) {
        let mut s = self.lock();
        s.1 = true;
        self.cancel.store(true, Ordering::SeqCst);
        self.wake.notify_all();
        let deadline = Instant::now() + RELEASE_WAIT;
        while s.0 != Phase::Ended {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log_at!(
                    Level::Error,
                    "{label}: the lease thread did not end within {RELEASE_WAIT:?}"
                );
                return;
            }
            s = self
                .wake
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits until `at` (None: until stopped, waking every minute so that the thread
    /// notices a pod that is gone). False once stopped.
    pub fn wait_until(&self, at: Option<SystemTime>) -> bool {
        let mut s = self.lock();
        loop {
            if s.1 {
                return false;
            }
            let left = match at {
                Some(t) => match t.duration_since(SystemTime::now()) {
                    Ok(d) if !d.is_zero() => d,
                    _ => return true,
                },
                None => Duration::from_secs(60),
            };
            let (guard, timeout) = self
                .wake
                .wait_timeout(s, left.min(Duration::from_secs(60)))
                .unwrap_or_else(|p| p.into_inner());
            s = guard;
            if timeout.timed_out() && at.is_none() {
                return true;
            }
        }
    }
}

/// How long ago `t` was (0 if it is ahead: a clock set back).
pub fn elapsed_since(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or_default()
}

/// Where a failed exchange of a lease in `phase` leaves it, and when to try again. The
/// lease is lost when the server refused it or its end has passed; a renewal past T2
/// becomes a rebinding. RFC 2131 §4.4.5 (RFC 8415 alike): wait half the time left before
/// trying again (at least a few seconds, at most a minute), but not past the next
/// milestone (T2, the lease's end: the address is not used a moment longer); after
/// expiry, every half minute.
pub fn after_failure(
    phase: Phase,
    timers: Option<Timers>,
    bound_at: SystemTime,
    refused: bool,
    window: Duration,
) -> (Phase, SystemTime) {
    let elapsed = elapsed_since(bound_at);
    let lost = refused || timers.is_none_or(|t| elapsed >= t.expire);
    let next = match phase {
        _ if lost => Phase::Expired,
        Phase::Renewing if timers.is_some_and(|t| elapsed >= t.rebind) => Phase::Rebinding,
        p => p,
    };
    let now = SystemTime::now();
    if next == Phase::Expired {
        return (next, now + Duration::from_secs(30));
    }
    let retry = now + (window / 2).clamp(Duration::from_secs(2), Duration::from_secs(60));
    let milestone = timers.map(|t| {
        bound_at
            + if next == Phase::Renewing {
                t.rebind
            } else {
                t.expire
            }
    });
    (next, milestone.map_or(retry, |m| m.min(retry)))
}

/// A lease just granted is kept only once it is usable and recorded (`kept`); when it is
/// not, it goes back to the server at once (`give_back`) and ADD fails. Kept, it is logged.
pub fn kept_or_given_back<T>(
    kept: Result<T>,
    give_back: impl FnOnce() -> Result<()>,
    attachment: &Attachment,
    address: impl std::fmt::Display,
    netns: &Path,
) -> Result<T> {
    match kept {
        Ok(k) => {
            log_at!(
                Level::Info,
                "dhcp: {} got {address} on {} in {}",
                attachment.container_id,
                attachment.ifname,
                netns.display()
            );
            Ok(k)
        }
        Err(e) => {
            if let Err(r) = give_back() {
                log_at!(Level::Warn, "dhcp: {r}");
            }
            Err(e)
        }
    }
}
