//! DHCPv4 (and, with `ipam.ipv6`, DHCPv6: [`v6`]) for pods: the client machinery behind the `dhcp` IPAM plugin, run by the lease
//! daemon (`dhcp daemon`, or `cnikit ipamd daemon`, which hosts the same service).
//!
//! A pod's lease is acquired from inside the pod's network namespace, on the interface
//! the interface plugin made, through a packet socket opened there (the socket stays in
//! that namespace for its whole life, so one daemon thread serves any number of pods).
//! The plugin process only asks the daemon; the daemon keeps each lease: it renews at T1,
//! rebinds at T2, takes the address back after expiry, and writes every lease to a file
//! so that a restarted (or killed) daemon resumes them.
//!
//! - [`socket`]: the packet socket in the pod's netns, bounded receives.
//! - [`wire`]: DHCP messages (dhcproto) in IPv4/UDP frames (etherparse), both ways.
//! - [`exchange`]: the client's exchanges (acquire, renew, rebind, reboot, release),
//!   with the retransmission schedule and a deadline for each.
//! - [`lease`]: what an ACK gives a pod (address, gateway, routes, DNS, timers), and the
//!   CNI result made of it.
//! - [`options`]: the `request`/`provide` options and the client identifier.
//! - [`lease_files`]: one file per held lease, written before the plugin is answered.
//! - [`maintain`]: one thread per lease keeping it until release.
//! - [`service`]: the daemon's `dhcp` service: acquire, release, check, status, gc.
//! - [`daemon`]: `dhcp daemon` with the reference's flags (`-socketpath`, `-timeout`, ...).
//! - [`pod_link`]: the pod's interface (netns handle, index, MAC) and its checks, for both
//!   families.
//! - [`keep`]: what every lease thread shares: the daemon's settings, the phase and stop.
//! - [`v6`]: the DHCPv6 client (IA_NA), run beside the DHCPv4 one on the same interface.

pub mod daemon;
pub mod exchange;
pub mod keep;
pub mod lease;
pub mod lease_files;
pub mod maintain;
pub mod options;
pub mod pod_link;
pub mod service;
pub mod socket;
pub mod v6;
pub mod wire;

use std::time::{Duration, Instant};

/// The reference daemon's socket (`-socketpath`) and the plugin's `daemonSocketPath` default.
pub const DEFAULT_SOCKET: &str = "/run/cni/dhcp.sock";

/// How long the client waits and retransmits (the reference daemon's flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `-timeout`: the longest wait for the answer to one transmission.
    pub reply: Duration,
    /// `-resendmax`: the longest pause between retransmissions.
    pub resend_max: Duration,
    /// `-resendtimeout`: how long one exchange may take in all (ADD waits at most this).
    pub exchange: Duration,
}

/// One exchange of a client `C` with the servers, either family: what it is (for
/// messages), the time it has, and the count of what it sent (`S`).
pub(crate) struct Exchange<'c, C, S> {
    pub client: &'c C,
    /// e.g. "the renewal of 10.1.2.3 at 10.1.2.1 "; empty for a v4 acquire.
    pub what: String,
    /// From its first transmission (the `secs`/elapsed time it reports count from there)
    /// to the deadline after which it gives up.
    pub start: Instant,
    pub deadline: Instant,
    pub sent: S,
}

impl<'c, C, S: Default> Exchange<'c, C, S> {
    pub fn open(client: &'c C, what: String, length: Duration) -> Self {
        let start = Instant::now();
        Exchange {
            client,
            what,
            start,
            deadline: start + length,
            sent: S::default(),
        }
    }

    pub fn is_open(&self) -> bool {
        Instant::now() < self.deadline
    }
}

impl Default for Timing {
    /// The reference's defaults.
    fn default() -> Self {
        Timing {
            reply: Duration::from_secs(10),
            resend_max: Duration::from_secs(62),
            exchange: Duration::from_secs(208),
        }
    }
}

/// What a DHCP client failure was, for the plugin's error code and the daemon's logs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ErrorKind {
    /// No server answered within the exchange's time.
    NoAnswer,
    /// The server refused (DHCPNAK), or its answers were unusable (no address, no mask).
    Refused,
    /// The pod's netns or interface is not there (or was removed meanwhile).
    NoInterface,
    /// A socket or kernel call failed.
    Io,
    /// The request was malformed or named something the daemon cannot act on.
    Invalid,
    /// The caller may not have this done.
    Forbidden,
}

/// A DHCP client error: its kind and a message a person can act on (it names the
/// interface and the netns, and how long the client waited).
pub type Error = crate::failure::Failure<ErrorKind>;

pub type Result<T> = std::result::Result<T, Error>;
