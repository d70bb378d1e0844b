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

/// The cells of every interface plugin's version matrix: each spec version from 0.2.0
/// with host-local, from 0.3.1 with ipamd too, and 1.1.0 with ipamd's daemon.
macro_rules! common_matrix_cells {
    ($body:ident) => {
        $crate::support::matrix::matrix_cells! {
            $body;
            /// Proves: matrix cell 0.2.0 × host-local (legacy ip4/ip6 layout).
            matrix_0_2_0_host_local: "0.2.0", HostLocal;
            /// Proves: matrix cell 0.3.1 × host-local (ips[].version layout, no CHECK).
            matrix_0_3_1_host_local: "0.3.1", HostLocal;
            /// Proves: matrix cell 0.3.1 × ipamd.
            matrix_0_3_1_ipamd: "0.3.1", Ipamd;
            /// Proves: matrix cell 0.4.0 × host-local (with CHECK).
            matrix_0_4_0_host_local: "0.4.0", HostLocal;
            /// Proves: matrix cell 0.4.0 × ipamd.
            matrix_0_4_0_ipamd: "0.4.0", Ipamd;
            /// Proves: matrix cell 1.0.0 × host-local.
            matrix_1_0_0_host_local: "1.0.0", HostLocal;
            /// Proves: matrix cell 1.0.0 × ipamd.
            matrix_1_0_0_ipamd: "1.0.0", Ipamd;
            /// Proves: matrix cell 1.1.0 × host-local (cnikit's; the reference refuses
            /// 1.1.0: `host_local::behind_bridge`).
            matrix_1_1_0_host_local: "1.1.0", HostLocal;
            /// Proves: matrix cell 1.1.0 × ipamd.
            matrix_1_1_0_ipamd: "1.1.0", Ipamd;
            /// Proves: matrix cell 1.1.0 × ipamd served by its daemon.
            matrix_1_1_0_ipamd_daemon: "1.1.0", IpamdDaemon;
        }
    };
}
pub(crate) use common_matrix_cells;
