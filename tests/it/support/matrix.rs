//! The version matrices' shared steps (bridge, ptp): which layouts carry interfaces and
//! which versions have CHECK, one test per cell, two pods' traffic and CHECK, and the
//! daemon having served the ADDs. Each suite keeps its own layout and kernel checks.

use super::attachment::Attachment;
use super::fixture::Ipam;
use super::ipamd::ipamd_daemon_allocations;
use super::kernel::assert_ping;
use serde_json::Value;

/// The interface-carrying layouts (0.3.0 and later).
pub fn has_interfaces(version: &str) -> bool {
    !matches!(version, "0.1.0" | "0.2.0")
}

/// Two pods `a` and `b` with results `ra` and `rb` at `version`: each pings the other's
/// address of each family (`addr_of(result, v6)`); then, where the version has CHECK
/// (0.4.0 on), CHECK of each passes.
pub fn assert_pods_ping_each_other_and_check(
    version: &str,
    [(a, ra), (b, rb)]: [(&Attachment, &Value); 2],
    addr_of: impl Fn(&Value, bool) -> String,
) {
    for (from, to) in [(a, rb), (b, ra)] {
        for v6 in [false, true] {
            assert_ping(&from.ns.name, &addr_of(to, v6));
        }
    }
    if version >= "0.4.0" {
        a.check(ra);
        b.check(rb);
    }
}

/// With IPAM served by the ipamd daemon (`kind`), the daemon, not the in-process
/// fallback, made both pods' allocations.
pub fn assert_daemon_served_both(kind: Ipam, ipam: &Value) {
    if kind == Ipam::IpamdDaemon {
        assert!(
            ipamd_daemon_allocations(ipam) >= 2,
            "the daemon, not the in-process fallback, served the ADDs"
        );
    }
}

/// One test per cell of a version matrix, so a failure names its version and IPAM: each
/// `name: "version", Kind;` row is a `#[test]` calling `body(version, Ipam::Kind)`.
macro_rules! matrix_cells {
    ($body:ident; $($(#[$doc:meta])* $name:ident: $version:literal, $kind:ident;)*) => {
        $(
            $(#[$doc])*
            #[test]
            fn $name() {
                $body($version, Ipam::$kind);
            }
        )*
    };
}
pub(crate) use matrix_cells;
