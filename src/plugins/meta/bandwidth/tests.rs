//! The ifb's name.

use super::*;

/// The reference's name for network "net1", container "abc":
/// "bwp" + sha512("net1abc")[..12 hex].
#[test]
fn ifb_name_is_the_reference_one() {
    assert_eq!(ifb_name("net1", "abc"), "bwp30f8de359c7f");
    assert_eq!(ifb_name("n", &"c".repeat(500)).len(), 15);
}
