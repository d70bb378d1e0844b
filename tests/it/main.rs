//! The integration tests: one test binary (`cargo test --test it`), one
//! module per area, sharing the harness in [`support`]. They run the built
//! `cnikit` binary as a runtime does, on the kernel, and only inside the
//! throwaway namespace `tests/run` makes: `tests/run --test it bridge::`
//! runs one module's tests.

mod support;

/// Two tests of `$body(daemon: bool)`: `$plain` without the ipamd daemon,
/// `$via_daemon` with the daemon applying the firewall changes.
macro_rules! without_and_with_daemon {
    ($body:ident: $plain:ident, $via_daemon:ident) => {
        #[test]
        fn $plain() {
            $body(false);
        }

        #[test]
        fn $via_daemon() {
            $body(true);
        }
    };
}

mod bandwidth;
mod bridge;
mod cli;
mod cluster;
mod dhcp;
mod dhcp_client;
mod doctor;
mod dummy;
#[cfg(feature = "fault-injection")]
mod fault;
mod firewall;
mod firewall_churn;
mod firewall_lock;
mod firewall_plugin;
mod firewall_repair;
mod harness;
mod host_device;
mod host_local;
mod ipamd;
mod ipamd_activation;
mod ipvlan;
mod log_file;
mod loopback;
mod macvlan;
mod node_agent;
mod portmap;
mod protocol;
mod ptp;
mod runtime;
mod runtime_input;
mod sbr;
mod security;
mod static_ipam;
mod tap;
mod tuning;
mod vlan;
mod vrf;
