//! The ifbs' names.

use super::*;
use crate::cni::Attachment;

/// The reference's name for network "net1", container "abc":
/// "bwp" + sha512("net1abc")[..12 hex].
#[test]
fn host_ifb_name_is_the_reference_one() {
    assert_eq!(
        host_ifb_name(&Attachment::new("net1", "abc", "eth0")),
        "bwp30f8de359c7f"
    );
    let long = Attachment::new("n", &"c".repeat(500), "eth0");
    assert_eq!(host_ifb_name(&long).len(), 15);
}

/// The ifb in the pod is one per attachment: another interface of the same
/// container on the same network gets another one.
#[test]
fn pod_ifb_names_differ_per_interface() {
    let eth0 = pod_ifb_name(&Attachment::new("net1", "abc", "eth0"));
    let net1 = pod_ifb_name(&Attachment::new("net1", "abc", "net1"));
    assert_ne!(eth0, net1);
    assert!(eth0.starts_with("bwi") && eth0.len() == 15, "{eth0}");
}
