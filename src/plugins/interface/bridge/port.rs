//! The host end of a pod's veth as a bridge port: enslaved with its owner
//! named (for GC), port flags, VLANs; and GC of the ports of forgotten pods.

use super::Conf;
use crate::cni::{Attachment, Error, Request};
use crate::netlink::{BridgePort, Netlink};
use crate::plugins::link_owner;

/// The plugin's name in the aliases of the veths it owns (see link_owner).
const PLUGIN: &str = "bridge";

/// The alias a pod's host end carries: its attachment, for GC and DEL.
pub(super) fn port_owner(att: &Attachment) -> String {
    link_owner::alias(PLUGIN, att)
}

/// GC: the host ends (so the pairs) of this network's veths whose attachment
/// is not in the valid list.
pub(super) fn gc_links(req: &Request) -> Result<(), Error> {
    link_owner::remove_stale(req, "veth", PLUGIN)
}

/// Bring up the host end `index` (created enslaved to the bridge) with its
/// port flags, naming `att` its owner and keeping IPv6 off it (a port needs
/// no address of its own, and its link-local address's multicast would reach
/// its pod): all in one request; then its VLANs. Its pod end is still down,
/// so the port forwards nothing until all of that is in place.
pub(super) fn attach_port(
    host: &mut Netlink,
    conf: &Conf,
    trunk: &[u16],
    att: &Attachment,
    index: u32,
) -> Result<(), Error> {
    let flags = BridgePort {
        hairpin: conf.hairpin_mode,
        isolated: conf.port_isolation,
    };
    host.bridge_port_up(index, &port_owner(att), flags)?;
    port_vlans(host, index, conf.vlan, trunk, conf.preserve_default_vlan)
}

/// A port's VLANs as the reference (v1.8.0 on) sets them: VLAN 1 goes unless
/// `preserve` (first, so a `vlan` of 1 stays); `vlan` is the untagged PVID,
/// the trunk's VLANs are tagged, and a trunk with no `vlan` keeps VLAN 1 as
/// its untagged native VLAN. A port without VLANs keeps the bridge's default.
pub(super) fn port_vlans(
    host: &mut Netlink,
    index: u32,
    vlan: Option<u16>,
    trunk: &[u16],
    preserve: bool,
) -> Result<(), Error> {
    if vlan.is_none() && trunk.is_empty() {
        return Ok(());
    }
    if !preserve {
        host.bridge_vlan_del(index, DEFAULT_VLAN)?;
    }
    if let Some(vid) = vlan {
        host.bridge_vlan_add(index, vid, true, true, false)?;
    }
    for &vid in trunk {
        host.bridge_vlan_add(index, vid, false, false, false)?;
    }
    if vlan.is_none() {
        host.bridge_vlan_add(index, DEFAULT_VLAN, true, true, false)?;
    }
    Ok(())
}

/// The VLAN a bridge gives new ports (its `default_pvid`, 1 unless changed).
const DEFAULT_VLAN: u16 = 1;
