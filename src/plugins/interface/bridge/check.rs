//! CHECK's reads of the kernel: what a link is, and where its veth peer is.

use crate::cni::Error;
use crate::netlink::{Link, Netlink};
pub(super) use crate::plugins::pod_interface::expect_kind;

/// The container veth's peer (IFLA_LINK, a host ifindex) must be a port of the bridge.
pub(super) fn check_peer_on_bridge(
    host: &mut Netlink,
    cont_link: &Link,
    bridge: &Link,
) -> Result<(), Error> {
    let peer = match cont_link.link {
        Some(i) => host.link_by_index(i)?,
        None => None,
    };
    match peer {
        Some(p) if p.master == Some(bridge.index) => Ok(()),
        Some(p) => Err(Error::check_failed(format_args!(
            "host end {} is not a port of bridge {}",
            p.name, bridge.name
        ))),
        None => Err(Error::check_failed(format_args!(
            "the host end of {} is missing",
            cont_link.name
        ))),
    }
}
