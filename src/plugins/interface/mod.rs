//! Interface plugins: each makes the pod's interface and addresses it from IPAM.

pub mod bridge;
pub mod dummy;
pub mod host_device;
pub mod ipvlan;
pub mod loopback;
pub mod macvlan;
pub mod ptp;
pub mod tap;
pub mod vlan;

mod child;
#[cfg(test)]
mod child_tests;
