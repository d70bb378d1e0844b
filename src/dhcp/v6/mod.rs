//! DHCPv6 for pods (RFC 8415, IA_NA only): the `dhcp` plugin's `"ipv6": true`. The lease
//! daemon runs it beside the DHCPv4 client, on the same interface of the same pod, with
//! the same guarantees: the lease recorded before the plugin is answered, RENEW at T1,
//! REBIND at T2, RELEASE at DEL, resumed after a restart, released when the pod is gone.
//!
//! - [`message`]: the client's identity (DUID-LL, IAID) and its messages (dhcproto's `v6`).
//! - [`socket`]: a UDP socket in the pod's netns, bound to the interface's link-local
//!   address and port 546.
//! - [`lease`]: the REPLY kept for a lease, the terms it grants, the lease's record.
//! - [`exchange`]: SOLICIT (with Rapid Commit) / ADVERTISE / REQUEST / REPLY, RENEW,
//!   REBIND, RELEASE, retransmitted as RFC 8415 §15 says and bounded by the daemon's flags.
//! - [`maintain`]: the thread keeping one lease.

pub mod exchange;
pub mod lease;
pub mod maintain;
pub mod message;
pub mod service;
pub mod socket;
