//! The host end of a pod's veth as a bridge port: enslaved with its owner
//! named (for GC), port flags, VLANs; and GC of the ports of forgotten pods.

use super::Conf;
use crate::cni::{Attachment, Error};
use crate::netlink::{BridgePort, Link, Netlink};
use crate::plugins::link_owner;

/// The plugin's name in the aliases of the veths it owns (see link_owner).
pub(super) const PLUGIN: &str = "bridge";

/// The alias a pod's host end carries: its attachment, for GC and DEL.
pub(super) fn port_owner(att: &Attachment) -> String {
    link_owner::alias(PLUGIN, att)
}

/// Bring up the host end `index` (created enslaved to `bridge`) with its
/// port flags, naming `att` its owner and keeping IPv6 off it (a port needs
/// no address of its own, and its link-local address's multicast would reach
/// its pod): all in one request; then its VLANs. Its pod end is still down,
/// so the port forwards nothing until all of that is in place.
pub(super) fn attach_port(
    host: &mut Netlink,
    conf: &Conf,
    trunk: &[u16],
    att: &Attachment,
    (bridge, index): (&Link, u32),
) -> Result<(), Error> {
    let flags = BridgePort {
        hairpin: conf.hairpin_mode,
        isolated: conf.port_isolation,
    };
    host.bridge_port_up(index, &port_owner(att), flags)?;
    let vlans = PortVlans {
        vlan: conf.vlan,
        trunk,
        preserve_default: conf.preserve_default_vlan,
    };
    port_vlans(host, bridge, index, &vlans)
}

/// The VLANs a port is to have.
pub(super) struct PortVlans<'a> {
    pub vlan: Option<u16>,
    pub trunk: &'a [u16],
    /// `preserveDefaultVlan`: keep the VLAN the bridge gave the new port.
    pub preserve_default: bool,
}

/// A port's VLANs as the reference (v1.8.0 on) sets them: the VLAN the
/// bridge gave the new port (its `vlan_default_pvid`, 1 unless an operator
/// changed it) goes unless preserved (first, so a `vlan` equal to it stays);
/// `vlan` is the untagged PVID, the trunk's VLANs are tagged, and a trunk with
/// no `vlan` gets VLAN 1 as its untagged native VLAN. A port without VLANs
/// keeps the bridge's default.
pub(super) fn port_vlans(
    host: &mut Netlink,
    bridge: &Link,
    index: u32,
    want: &PortVlans,
) -> Result<(), Error> {
    if want.vlan.is_none() && want.trunk.is_empty() {
        return Ok(());
    }
    if !want.preserve_default {
        // The reference removes every VLAN the new port has: that is the one.
        match bridge.bridge_default_pvid.unwrap_or(DEFAULT_VLAN) {
            0 => {}
            vid => host.bridge_vlan_del(index, vid)?,
        }
    }
    if let Some(vid) = want.vlan {
        host.bridge_vlan_add(index, vid, true, true, false)?;
    }
    for &vid in want.trunk {
        host.bridge_vlan_add(index, vid, false, false, false)?;
    }
    if want.vlan.is_none() {
        host.bridge_vlan_add(index, DEFAULT_VLAN, true, true, false)?;
    }
    Ok(())
}

/// The kernel's `vlan_default_pvid`, and a trunk's native VLAN.
const DEFAULT_VLAN: u16 = 1;
