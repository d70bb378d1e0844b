//! Interface plugins: each makes the pod's interface and addresses it from IPAM.

pub mod bridge;
pub mod dummy;
pub mod ipvlan;
pub mod loopback;
pub mod macvlan;
pub mod ptp;

mod child;
#[cfg(test)]
mod child_tests;
