//! Bridges: race-safe creation, a port's flags (IFLA_INFO_PORT_DATA) and
//! VLAN membership (AF_BRIDGE IFLA_AF_SPEC).
use super::ipv6::{lacks_ipv6, no_link_local_spec};
use super::link::{bridge_vlan_filtering, random_local_mac};
use super::linkops::{create_error, link_message, says_unknown_kind, unsupported};
use super::Failure;
use super::{BridgePort, BridgeSpec, Error, ErrorKind, Link, Netlink, Result};
use netlink_packet_route::link::{
    AfSpecBridge, BridgeFlag, BridgeVlanInfo, BridgeVlanInfoFlags, InfoBridge, InfoBridgePort,
    InfoData, InfoKind, InfoPortData, InfoPortKind, LinkAttribute, LinkFlags, LinkInfo,
    LinkMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

const VLAN_FEATURE: (&str, &str) = ("bridge VLAN filtering", "CONFIG_BRIDGE_VLAN_FILTERING");

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// "a veth", "an ipvlan", "a physical device" for the not-a-bridge error.
fn kind_phrase(kind: Option<&str>) -> String {
    match kind {
        Some(k) if k.starts_with(['a', 'e', 'i', 'o', 'u']) => format!("an {k}"),
        Some(k) => format!("a {k}"),
        None => "a physical device".to_string(),
    }
}

fn bridge_message(index: u32, attrs: Vec<LinkAttribute>) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.interface_family = AddressFamily::Bridge;
    msg.header.index = index;
    msg.attributes = attrs;
    msg
}

impl Netlink {
    /// Adopts the bridge of that name, or creates it when there is none. Every
    /// ADD after the first finds it, so it is looked up first. Concurrent first
    /// ADDs race on the create: the loser gets EEXIST and simply re-reads the
    /// winner's bridge. An existing non-bridge link of that name is an
    /// `AlreadyExists` error. The bridge is set up (and promisc if asked);
    /// an existing bridge's MTU and VLAN filtering are left as they are. A
    /// bridge made here has multicast snooping off (see `create_bridge`).
    pub fn ensure_bridge(&mut self, spec: BridgeSpec) -> Result<Link> {
        let gone = || {
            Error::new(
                ErrorKind::NotFound,
                format!("bridge {} disappeared while being set up", spec.name),
            )
        };
        let link = match self.link_by_name(&spec.name)? {
            Some(link) => link,
            None => {
                match self.create_bridge(&spec) {
                    Err(e) if e.kind != ErrorKind::AlreadyExists => return Err(e),
                    _ => {}
                }
                self.link_by_name(&spec.name)?.ok_or_else(gone)?
            }
        };
        if !link.is_kind("bridge") {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "interface {} exists but is {}, not a bridge",
                    spec.name,
                    kind_phrase(link.kind.as_deref())
                ),
            ));
        }
        let mut changed = false;
        if spec.vlan_filtering && !self.bridge_vlan_filtering(link.index)? {
            // A bridge made by an earlier non-VLAN config: port VLANs would be
            // ignored and VLANs not isolated without filtering.
            self.enable_vlan_filtering(link.index, &spec.name)?;
            changed = true;
        }
        if spec.promisc && !link.promisc {
            self.set_promisc(link.index, true)?;
            changed = true;
        }
        if !link.up {
            self.set_up(link.index)?;
            changed = true;
        }
        // The common case (an existing, ready bridge) costs one read, not two.
        if !changed {
            return Ok(link);
        }
        self.link_by_index(link.index)?.ok_or_else(gone)
    }

    fn create_bridge(&mut self, spec: &BridgeSpec) -> Result<()> {
        let what = format!("create bridge {}", spec.name);
        // A fixed MAC: without one the kernel lends the bridge its lowest
        // port's MAC, so the gateway's MAC would change under running pods
        // as ports come and go (the reference bridge pins it too).
        let mut attrs = vec![
            LinkAttribute::IfName(spec.name.clone()),
            LinkAttribute::Address(random_local_mac().to_vec()),
        ];
        if let Some(mtu) = spec.mtu {
            attrs.push(LinkAttribute::Mtu(mtu));
        }
        // Multicast snooping off: with it on, every port that comes or goes
        // makes the kernel re-arm two query timers on every other port (under
        // the RTNL), so each attach would cost in proportion to the pods on
        // the bridge. Without a multicast querier on the bridge, which a pod
        // network does not have, snooping floods multicast to every port
        // anyway. An existing bridge's setting is left as it is.
        let mut data = vec![InfoBridge::MulticastSnooping(false)];
        if spec.vlan_filtering {
            data.push(InfoBridge::VlanFiltering(true));
        }
        let info = vec![
            LinkInfo::Kind(InfoKind::Bridge),
            LinkInfo::Data(InfoData::Bridge(data)),
        ];
        attrs.push(LinkAttribute::LinkInfo(info));
        let mut msg = LinkMessage::default();
        msg.attributes = attrs;
        self.new_link(msg).map_err(|f| {
            // A missing bridge kind says "Unknown device type"; a bare
            // EOPNOTSUPP comes from the VLAN filtering toggle, which kernels
            // without CONFIG_BRIDGE_VLAN_FILTERING refuse after registering the
            // bridge (and then delete it again).
            if spec.vlan_filtering && f.errno() == Some(libc::EOPNOTSUPP) && !says_unknown_kind(&f)
            {
                return unsupported_feature(&what, VLAN_FEATURE, f.errno());
            }
            create_error(f, "bridge", &what)
        })
    }

    /// Brings up port `index` (a fresh veth's host end, made enslaved and down,
    /// its peer still down) with its port flags, its owner named in its alias
    /// and no IPv6 link-local address (a port needs none, and a bridge's
    /// settings are not its ports'), in one request: every further request per
    /// pod is another wait for the RTNL. An RTM_NEWLINK for an existing link
    /// takes a bridge port's flags in IFLA_INFO_PORT_DATA (RTM_SETLINK does
    /// not) and applies them before the up; the kernel ignores an alias in a
    /// create request and refuses the address generation mode there, and
    /// applies that mode after the up: with its peer down the port has no
    /// carrier, so it neither forwards nor makes a link-local address before
    /// the request is done (the caller sets VLANs before the peer comes up).
    /// A port without IPv6 (MTU below 1280) comes up without the mode.
    pub fn bridge_port_up(&mut self, index: u32, alias: &str, port: BridgePort) -> Result<()> {
        let msg = |no_ll: bool| {
            let flags = vec![
                InfoBridgePort::HairpinMode(port.hairpin),
                InfoBridgePort::Isolated(port.isolated),
            ];
            let mut attrs = vec![
                LinkAttribute::IfAlias(alias.to_string()),
                LinkAttribute::LinkInfo(vec![
                    LinkInfo::PortKind(InfoPortKind::Bridge),
                    LinkInfo::PortData(InfoPortData::BridgePort(flags)),
                ]),
            ];
            if no_ll {
                attrs.push(LinkAttribute::AfSpecUnspec(vec![no_link_local_spec()]));
            }
            let mut msg = link_message(index, attrs);
            msg.header.change_mask = LinkFlags::Up;
            msg.header.flags = LinkFlags::Up;
            RouteNetlinkMessage::NewLink(msg)
        };
        let what = |link: &str| {
            format!(
                "bring up bridge port {link} (hairpin {}, isolated {})",
                on_off(port.hairpin),
                on_off(port.isolated)
            )
        };
        match self.bridge_request(index, msg(true), &what, false, None) {
            Err(e) if lacks_ipv6(&e) => self.bridge_request(index, msg(false), &what, false, None),
            other => other,
        }
    }

    /// Adds VLAN `vid` to a bridge port, or to the bridge device itself when
    /// `on_bridge_self` (BRIDGE_FLAGS_SELF). Needs CONFIG_BRIDGE_VLAN_FILTERING;
    /// without it the error is `ErrorKind::Unsupported`.
    pub fn bridge_vlan_add(
        &mut self,
        index: u32,
        vid: u16,
        pvid: bool,
        untagged: bool,
        on_bridge_self: bool,
    ) -> Result<()> {
        let mut flags = BridgeVlanInfoFlags::empty();
        if pvid {
            flags |= BridgeVlanInfoFlags::Pvid;
        }
        if untagged {
            flags |= BridgeVlanInfoFlags::Untagged;
        }
        let mut spec = Vec::new();
        if on_bridge_self {
            spec.push(AfSpecBridge::Flags(BridgeFlag::LowerDev));
        }
        spec.push(AfSpecBridge::VlanInfo(BridgeVlanInfo { flags, vid }));
        let msg = bridge_message(index, vec![LinkAttribute::AfSpecBridge(spec)]);
        let what = |link: &str| {
            format!(
                "add bridge vlan {vid} (pvid {}, untagged {}) to {link}",
                on_off(pvid),
                on_off(untagged)
            )
        };
        let msg = RouteNetlinkMessage::SetLink(msg);
        self.bridge_request(index, msg, &what, on_bridge_self, Some(VLAN_FEATURE))
    }

    /// Removes VLAN `vid` from a bridge port (e.g. the default VLAN 1 when
    /// `preserveDefaultVlan` is false). A VLAN the port does not have is Ok.
    pub fn bridge_vlan_del(&mut self, index: u32, vid: u16) -> Result<()> {
        let info = BridgeVlanInfo {
            flags: BridgeVlanInfoFlags::empty(),
            vid,
        };
        let spec = vec![AfSpecBridge::VlanInfo(info)];
        let msg = RouteNetlinkMessage::DelLink(bridge_message(
            index,
            vec![LinkAttribute::AfSpecBridge(spec)],
        ));
        let what = |link: &str| format!("delete bridge vlan {vid} from {link}");
        match self.bridge_request(index, msg, &what, false, Some(VLAN_FEATURE)) {
            Err(e) if e.errno == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    /// Turns VLAN filtering on for an existing bridge: RTM_NEWLINK without
    /// NLM_F_CREATE changes its link-info data (RTM_SETLINK cannot).
    fn enable_vlan_filtering(&mut self, index: u32, name: &str) -> Result<()> {
        let what = format!("enable VLAN filtering on bridge {name}");
        let info = vec![
            LinkInfo::Kind(InfoKind::Bridge),
            LinkInfo::Data(InfoData::Bridge(vec![InfoBridge::VlanFiltering(true)])),
        ];
        let msg = link_message(index, vec![LinkAttribute::LinkInfo(info)]);
        match self.request(RouteNetlinkMessage::NewLink(msg), 0) {
            Ok(_) => Ok(()),
            Err(f) if f.errno() == Some(libc::EOPNOTSUPP) => {
                Err(unsupported_feature(&what, VLAN_FEATURE, f.errno()))
            }
            Err(f) => Err(f.context(&what)),
        }
    }

    /// Whether the bridge has VLAN filtering on (false on kernels without it).
    pub fn bridge_vlan_filtering(&mut self, index: u32) -> Result<bool> {
        let what = format!("read bridge index {index}");
        let raw = self
            .get_link(link_message(index, vec![]))
            .map_err(|f| f.context(&what))?;
        let (header, attrs) = raw.ok_or_else(|| Error::from_errno(libc::ENODEV, &what))?;
        let link = Link::from_message(&header, &attrs);
        if !link.is_kind("bridge") {
            return Err(Error::new(
                ErrorKind::Other,
                format!("{what}: {} is not a bridge", link.name),
            ));
        }
        Ok(bridge_vlan_filtering(&attrs))
    }

    /// RTM_SETLINK or RTM_DELLINK with AF_BRIDGE. Without SELF the kernel
    /// hands the request to the port's master and answers EOPNOTSUPP when
    /// there is none, so that case gets a "not enslaved" message instead of a
    /// misleading feature error.
    fn bridge_request(
        &mut self,
        index: u32,
        msg: RouteNetlinkMessage,
        what: &dyn Fn(&str) -> String,
        on_self: bool,
        feature: Option<(&str, &str)>,
    ) -> Result<()> {
        let failure = match self.request(msg, 0) {
            Ok(_) => return Ok(()),
            Err(f) => f,
        };
        let label = self.describe(index);
        let what = what(&label);
        if failure.errno() != Some(libc::EOPNOTSUPP) {
            return Err(failure.context(&what));
        }
        self.port_unsupported(index, failure, &what, on_self, feature)
    }

    fn port_unsupported(
        &mut self,
        index: u32,
        failure: Failure,
        what: &str,
        on_self: bool,
        feature: Option<(&str, &str)>,
    ) -> Result<()> {
        let enslaved = matches!(self.link_by_index(index), Ok(Some(l)) if l.master.is_some());
        if !on_self && !enslaved {
            // Not a missing kernel feature: the caller forgot set_master.
            let mut e = failure.context(what);
            e.kind = ErrorKind::Other;
            e.message = format!("{what}: the link is not enslaved to a bridge");
            return Err(e);
        }
        match feature {
            Some(feature) => Err(unsupported_feature(what, feature, failure.errno())),
            None => Err(failure.context(what)),
        }
    }
}

fn unsupported_feature(what: &str, (feature, config): (&str, &str), errno: Option<i32>) -> Error {
    unsupported(what, feature, config, errno)
}
