//! CHECK's reads of the kernel: what a link is, and where its veth peer is.

use crate::cni::Error;
use crate::netlink::{Link, Netlink};

pub(super) fn expect_kind(link: &Link, kind: &str) -> Result<(), Error> {
    if link.kind.as_deref() != Some(kind) {
        return Err(Error::check_failed(format_args!(
            "{} is a {}, expected a {kind}",
            link.name,
            link.kind.as_deref().unwrap_or("device without kind")
        )));
    }
    Ok(())
}

pub(super) fn expect_mac(link: &Link, want: &str) -> Result<(), Error> {
    if !want.is_empty() && link.mac.as_deref() != Some(&want.to_ascii_lowercase()) {
        return Err(Error::check_failed(format_args!(
            "{} has MAC {}, prevResult says {want}",
            link.name,
            link.mac.as_deref().unwrap_or("none")
        )));
    }
    Ok(())
}

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
