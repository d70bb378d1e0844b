//! Link operations: read-back, veth / macvlan / ipvlan creation, and RTM_SETLINK
//! setters.
use super::frame::Reply;
use super::link::{parse_mac, random_local_mac};
use super::Failure;
use super::{
    ChildLink, Error, ErrorKind, IpvlanSpec, Link, LinkSetup, MacvlanSpec, NetNs, Netlink, Result,
    VethPair, VethSpec,
};
use netlink_packet_core::ParseableParametrized;
use netlink_packet_core::{NlasIterator, NLM_F_CREATE, NLM_F_DUMP, NLM_F_ECHO, NLM_F_EXCL};
use netlink_packet_route::link::{
    InfoData, InfoIpVlan, InfoKind, InfoMacVlan, InfoVeth, LinkAttribute, LinkFlags, LinkHeader,
    LinkInfo, LinkMessage,
};
use netlink_packet_route::RouteNetlinkMessage;

/// sizeof(struct ifinfomsg)
const LINK_HEADER_LEN: usize = 16;
const RTM_NEWLINK: u16 = 16;
/// IFNAMSIZ - 1: longer names cannot exist, the kernel rejects them with EINVAL.
const MAX_IFNAME: usize = 15;

/// A decoded RTM_NEWLINK: header plus every attribute this crate version could
/// parse (attributes it cannot parse, e.g. from a newer kernel, are skipped
/// rather than failing the whole read).
pub(crate) type RawLink = (LinkHeader, Vec<LinkAttribute>);

pub(crate) fn decode_link(payload: &[u8]) -> Option<RawLink> {
    let header = LinkHeader::parse(payload).ok()?;
    let attrs = payload.get(LINK_HEADER_LEN..)?;
    let attrs = NlasIterator::new(attrs)
        .filter_map(|nla| nla.ok())
        .filter_map(|nla| LinkAttribute::parse_with_param(&nla, header.interface_family).ok())
        .collect();
    Some((header, attrs))
}

fn decode_links(replies: Vec<Reply>) -> Vec<Link> {
    replies
        .iter()
        .filter(|r| r.kind == RTM_NEWLINK)
        .filter_map(|r| decode_link(&r.payload))
        .map(|(header, attrs)| Link::from_message(&header, &attrs))
        .collect()
}

pub(crate) fn link_message(index: u32, attributes: Vec<LinkAttribute>) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.attributes = attributes;
    msg
}

/// Unsupported error for a missing link kind or feature.
pub(crate) fn unsupported(what: &str, feature: &str, config: &str, errno: Option<i32>) -> Error {
    let mut e = Error::new(
        ErrorKind::Unsupported,
        format!("{what}: this kernel has no {feature} support ({config})"),
    );
    e.errno = errno;
    e
}

/// Creating an unknown kind fails with EOPNOTSUPP and the extack text
/// "Unknown device type" (kernels without module support never try a
/// modprobe); older kernels may say EINVAL with the same text.
pub(crate) fn is_unknown_kind(f: &Failure) -> bool {
    match f.extack() {
        Some(_) => says_unknown_kind(f),
        None => f.errno() == Some(libc::EOPNOTSUPP),
    }
}

/// The kernel's own words for a missing link kind (ext-ack text).
pub(crate) fn says_unknown_kind(f: &Failure) -> bool {
    f.extack()
        .is_some_and(|text| text.contains("Unknown device type"))
}

/// Error for a failed RTM_NEWLINK create of `kind`.
pub(crate) fn create_error(f: Failure, kind: &str, what: &str) -> Error {
    if is_unknown_kind(&f) {
        // The kernel options whose names are not CONFIG_ and the kind.
        let config = match kind {
            "vlan" => "CONFIG_VLAN_8021Q".to_string(),
            "vrf" => "CONFIG_NET_VRF".to_string(),
            _ => format!("CONFIG_{}", kind.to_uppercase()),
        };
        return unsupported(what, kind, &config, f.errno());
    }
    f.context(what)
}

impl Netlink {
    /// The link called `name` in this socket's netns, None when there is none.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>> {
        if name.is_empty() || name.len() > MAX_IFNAME {
            return Ok(None);
        }
        let msg = link_message(0, vec![LinkAttribute::IfName(name.to_string())]);
        let raw = self
            .get_link(msg)
            .map_err(|f| f.context(&format!("read link {name}")))?;
        Ok(raw.map(|(h, a)| Link::from_message(&h, &a)))
    }

    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>> {
        let raw = self
            .get_link(link_message(index, vec![]))
            .map_err(|f| f.context(&format!("read link index {index}")))?;
        Ok(raw.map(|(h, a)| Link::from_message(&h, &a)))
    }

    /// Every link of this socket's netns.
    pub fn links(&mut self) -> Result<Vec<Link>> {
        let msg = RouteNetlinkMessage::GetLink(LinkMessage::default());
        let replies = self
            .request(msg, NLM_F_DUMP)
            .map_err(|f| f.context("list links"))?;
        Ok(decode_links(replies))
    }

    /// RTM_GETLINK by index or IFLA_IFNAME; "no such device" is `None`.
    pub(crate) fn get_link(
        &mut self,
        msg: LinkMessage,
    ) -> std::result::Result<Option<RawLink>, Failure> {
        match self.request(RouteNetlinkMessage::GetLink(msg), 0) {
            Ok(replies) => Ok(replies
                .iter()
                .filter(|r| r.kind == RTM_NEWLINK)
                .find_map(|r| decode_link(&r.payload))),
            Err(f) if matches!(f.errno(), Some(libc::ENODEV) | Some(libc::ENOENT)) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// "eth0 (index 5)" for messages, or "index 5" when the name is unknown.
    /// Only called on error paths, so the extra lookup costs nothing normally.
    pub(crate) fn describe(&mut self, index: u32) -> String {
        match self.link_by_index(index) {
            Ok(Some(link)) => format!("{} (index {index})", link.name),
            _ => format!("index {index}"),
        }
    }

    /// RTM_NEWLINK with CREATE|EXCL.
    pub(crate) fn new_link(&mut self, msg: LinkMessage) -> std::result::Result<(), Failure> {
        self.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map(drop)
    }

    /// Whether the kernel has (or can load) the link kind of a child link,
    /// e.g. "ipvlan", without creating anything: a create with no master is
    /// refused with EOPNOTSUPP when the kind is unknown even after the kernel
    /// tried to load its module, and with EINVAL by the kind itself otherwise
    /// (child kinds need a master). Only for kinds that need one.
    pub fn child_kind_supported(&mut self, kind: &str) -> Result<bool> {
        let info = LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Other(kind.into()))]);
        match self.new_link(link_message(0, vec![info])) {
            Err(f) if f.errno() == Some(libc::EOPNOTSUPP) => Ok(false),
            Err(f) if f.errno() == Some(libc::EINVAL) => Ok(true),
            Err(f) => Err(f.context(&format!("probe for {kind} support"))),
            Ok(()) => Ok(true),
        }
    }

    /// Creates a veth pair in one request: the host end in this socket's netns,
    /// the peer directly inside `spec.peer_netns` (so it never appears on the
    /// host). The peer is left down: the kernel refuses IFF_UP for the peer
    /// inside the create request, so bring it up from inside its netns (and
    /// dormant, see [`VethSpec::peer_attributes`]).
    pub fn create_veth(&mut self, spec: VethSpec) -> Result<VethPair> {
        let what = format!(
            "create veth {} (peer {} in netns {})",
            spec.host_name,
            spec.peer_name,
            spec.peer_netns.path().display()
        );
        let peer_hw = match &spec.peer_mac {
            Some(mac) => parse_mac(mac)?
                .try_into()
                .map_err(|_| Error::new(ErrorKind::Other, format!("{what}: MAC {mac}")))?,
            None => random_local_mac(),
        };
        let peer = spec.peer_attributes(peer_hw);
        let mut host = vec![LinkAttribute::IfName(spec.host_name.clone())];
        if let Some(master) = spec.master {
            host.push(LinkAttribute::Controller(master));
        }
        if let Some(mtu) = spec.mtu {
            host.push(LinkAttribute::Mtu(mtu));
        }
        host.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(link_message(0, peer)))),
        ]));
        // NLM_F_ECHO: the kernel (6.3 on) answers with the new host end
        // itself, so no read-back (another wait for the RTNL) is needed.
        let echoed = self
            .request(
                RouteNetlinkMessage::NewLink(link_message(0, host)),
                NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO,
            )
            .map_err(|f| create_error(f, "veth", &what))?
            .iter()
            .filter(|r| r.kind == RTM_NEWLINK)
            .filter_map(|r| decode_link(&r.payload))
            // The echo is the host end only if it names it and its peer.
            .find(|(_, attrs)| {
                attrs.contains(&name_attr(&spec.host_name))
                    && attrs.iter().any(|a| matches!(a, LinkAttribute::Link(_)))
            });
        let pair = match echoed {
            Some(raw) => Ok(raw),
            None => self.read_back(&spec.host_name, &what),
        }
        .and_then(|(header, attrs)| VethPair::from_host_end(&header, &attrs, peer_hw, &what));
        // A pair the caller cannot address is not left behind.
        pair.map_err(|e| self.undo_child(e, link_message(0, vec![name_attr(&spec.host_name)])))
    }

    /// Reads a fresh link back (kernels before 6.3 do not echo a create).
    fn read_back(&mut self, name: &str, what: &str) -> Result<RawLink> {
        let msg = link_message(0, vec![name_attr(name)]);
        let raw = self
            .get_link(msg)
            .map_err(|f| f.context(&format!("read link {name}")))?;
        raw.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("{what}: created but {name} vanished"),
            )
        })
    }

    /// Creates a macvlan on `spec.master_index` (in this socket's netns), placed
    /// in `spec.netns` by the create itself (see `create_child`). Returns the
    /// link as seen from its final netns.
    pub fn create_macvlan(&mut self, spec: MacvlanSpec) -> Result<Link> {
        let mut attrs = Vec::new();
        if let Some(mac) = &spec.mac {
            attrs.push(LinkAttribute::Address(parse_mac(mac)?));
        }
        let mut data = vec![InfoMacVlan::Mode(spec.mode.to_kernel())];
        if let Some(qlen) = spec.bc_queue_len {
            data.push(InfoMacVlan::BcQueueLen(qlen));
        }
        attrs.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::MacVlan),
            LinkInfo::Data(InfoData::MacVlan(data)),
        ]));
        self.create_child(Child::of("macvlan", &spec.link), attrs)
    }

    /// Like `create_macvlan`, for ipvlan (no MAC: ipvlan slaves share the master's).
    pub fn create_ipvlan(&mut self, spec: IpvlanSpec) -> Result<Link> {
        let attrs = vec![LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::IpVlan),
            LinkInfo::Data(InfoData::IpVlan(vec![InfoIpVlan::Mode(
                spec.mode.to_kernel(),
            )])),
        ])];
        self.create_child(Child::of("ipvlan", &spec.link), attrs)
    }

    /// Creates the child with `kind_attrs` (MAC, IFLA_LINKINFO). Into another
    /// netns it is created under a temporary name and renamed there: kernels
    /// without the "look up in target netns" rtnetlink change (Debian 12's 6.1,
    /// for one) check a create's IFLA_IFNAME against the *sender's* netns even
    /// with IFLA_NET_NS_FD, so creating the pod's `eth0` from a host that has
    /// an `eth0` of its own fails with EEXIST. One RTM_SETLINK more, which also
    /// turns `arp_notify` on when asked (a create request cannot, see
    /// `link_setup.rs`); created in place, that takes a request of its own. A child
    /// that announces its addresses is one the plugin addresses: the same request
    /// turns the kernel's IPv6 link-local address off (the plugin adds one where the
    /// pod has IPv6, see `ipv6.rs`). A failure after the create removes the link again.
    pub(super) fn create_child(
        &mut self,
        c: Child,
        kind_attrs: Vec<LinkAttribute>,
    ) -> Result<Link> {
        let Some(ns) = c.netns else {
            self.new_child(&c, c.name, kind_attrs)?;
            let link = self
                .link_by_name(c.name)?
                .ok_or_else(|| vanished(&c, c.name))?;
            let setup = LinkSetup {
                arp_notify: c.arp_notify,
                no_link_local: c.arp_notify,
                ..LinkSetup::default()
            };
            if let Err(e) = self.setup_link(link.index, &setup) {
                return Err(self.undo_child(e, link_message(link.index, vec![])));
            }
            return Ok(link);
        };
        // Opened first: once the link exists, every failure must be able to remove it.
        let mut there = Netlink::open_in(ns)?;
        let tmp = temp_ifname();
        self.new_child(&c, &tmp, kind_attrs)?;
        let link = match there.link_by_name(&tmp) {
            Ok(Some(link)) => link,
            Ok(None) => return Err(vanished(&c, &tmp)),
            Err(e) => return Err(there.undo_child(e, link_message(0, vec![name_attr(&tmp)]))),
        };
        let setup = LinkSetup {
            name: Some(c.name),
            arp_notify: c.arp_notify,
            no_link_local: c.arp_notify,
            ..LinkSetup::default()
        };
        if let Err(e) = there.setup_link(link.index, &setup) {
            let what = self.child_what(&c);
            let e = Error {
                message: format!("{what}: {}", e.message),
                ..e
            };
            return Err(there.undo_child(e, link_message(link.index, vec![])));
        }
        Ok(Link {
            name: c.name.to_string(),
            ..link
        })
    }

    /// RTM_NEWLINK of the child under `name`.
    fn new_child(&mut self, c: &Child, name: &str, kind_attrs: Vec<LinkAttribute>) -> Result<()> {
        let mut attrs = vec![name_attr(name), LinkAttribute::Link(c.master)];
        if let Some(mtu) = c.mtu {
            attrs.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(ns) = c.netns {
            attrs.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
        }
        attrs.extend(kind_attrs);
        self.new_link(link_message(0, attrs)).map_err(|f| {
            let what = self.child_what(c);
            create_error(f, c.kind, &what)
        })
    }

    /// Deletes a half-made child or veth (by index, or by name when its index
    /// is unknown) and returns `e`, noting a failed removal in its message.
    fn undo_child(&mut self, mut e: Error, msg: LinkMessage) -> Error {
        if let Err(f) = self.request(RouteNetlinkMessage::DelLink(msg), 0) {
            let left = f.context("removing it again");
            e.message = format!("{}; {}", e.message, left.message);
        }
        e
    }

    fn child_what(&mut self, c: &Child) -> String {
        let master = self.describe(c.master);
        match c.netns {
            Some(ns) => format!(
                "create {} {} on {master} in netns {}",
                c.kind,
                c.name,
                ns.path().display()
            ),
            None => format!("create {} {} on {master}", c.kind, c.name),
        }
    }

    /// Renames a link; it must be down (a fresh one is).
    pub fn rename(&mut self, index: u32, name: &str) -> Result<()> {
        let msg = link_message(index, vec![name_attr(name)]);
        self.send_setlink(index, msg, &format!("name {name}"))
    }

    pub fn set_up(&mut self, index: u32) -> Result<()> {
        self.set_flag(index, LinkFlags::Up, true, "up")
    }

    pub fn set_down(&mut self, index: u32) -> Result<()> {
        self.set_flag(index, LinkFlags::Up, false, "down")
    }

    /// Sets or clears the user promiscuous flag (like `ip link set promisc on`).
    pub fn set_promisc(&mut self, index: u32, on: bool) -> Result<()> {
        let word = if on { "promisc on" } else { "promisc off" };
        self.set_flag(index, LinkFlags::Promisc, on, word)
    }

    /// Enslaves the link to `master_index` (a bridge).
    pub fn set_master(&mut self, index: u32, master_index: u32) -> Result<()> {
        let msg = link_message(index, vec![LinkAttribute::Controller(master_index)]);
        // Names are looked up only for the error message: no extra round trip per ADD.
        self.request(RouteNetlinkMessage::SetLink(msg), 0)
            .map(drop)
            .map_err(|f| {
                let (link, master) = (self.describe(index), self.describe(master_index));
                f.context(&format!("set link {link} master {master}"))
            })
    }

    /// Deletes the link (for a veth, both ends). ENODEV is `ErrorKind::NotFound`.
    pub fn delete_link(&mut self, index: u32) -> Result<()> {
        let msg = RouteNetlinkMessage::DelLink(link_message(index, vec![]));
        self.request(msg, 0).map(drop).map_err(|f| {
            let link = self.describe(index);
            f.context(&format!("delete link {link}"))
        })
    }

    /// Changes one IFF_* flag; `change_mask` limits the kernel to that flag.
    fn set_flag(&mut self, index: u32, flag: LinkFlags, on: bool, word: &str) -> Result<()> {
        let mut msg = link_message(index, vec![]);
        msg.header.change_mask = flag;
        if on {
            msg.header.flags = flag;
        }
        self.send_setlink(index, msg, word)
    }

    /// RTM_SETLINK; the error names the link: "set link eth0 (index 5) up: ...".
    pub(crate) fn send_setlink(&mut self, index: u32, msg: LinkMessage, word: &str) -> Result<()> {
        self.request(RouteNetlinkMessage::SetLink(msg), 0)
            .map(drop)
            .map_err(|f| {
                let link = self.describe(index);
                f.context(&format!("set link {link} {word}"))
            })
    }
}

/// What `create_child` needs of a macvlan/ipvlan/vlan spec.
pub(super) struct Child<'a> {
    pub kind: &'static str,
    /// The final name.
    pub name: &'a str,
    /// Index of the master in the creating socket's netns.
    pub master: u32,
    pub mtu: Option<u32>,
    pub netns: Option<&'a NetNs>,
    /// Turn the child's `arp_notify` on before it can go up.
    pub arp_notify: bool,
}

impl<'a> Child<'a> {
    pub(super) fn of(kind: &'static str, link: &'a ChildLink<'a>) -> Child<'a> {
        Child {
            kind,
            name: &link.name,
            master: link.master_index,
            mtu: link.mtu,
            netns: link.netns,
            arp_notify: link.arp_notify,
        }
    }
}

fn name_attr(name: &str) -> LinkAttribute {
    LinkAttribute::IfName(name.to_string())
}

fn vanished(c: &Child, name: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("create {} {name}: created but it vanished", c.kind),
    )
}

/// "cnikit" + 8 random hex digits (14 bytes, within IFNAMSIZ): random so that
/// it is free in the pod's netns and in the host's, which older kernels check.
fn temp_ifname() -> String {
    // Bytes 1..5 of a random MAC are plain random (byte 0 carries its flag bits).
    let r = super::link::random_local_mac();
    format!("cnikit{:02x}{:02x}{:02x}{:02x}", r[1], r[2], r[3], r[4])
}
