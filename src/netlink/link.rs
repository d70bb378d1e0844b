//! Links: read-back (for CHECK) and creation of bridge, veth, macvlan, ipvlan.
use super::{Error, ErrorKind, NetNs, Result};
use netlink_packet_route::link::{
    InfoBridge, InfoData, InfoIpVlan, InfoMacVlan, IpVlanMode, LinkAttribute, LinkFlags,
    LinkHeader, LinkInfo, MacVlanMode, State,
};

/// A link as read back from the kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `IFLA_INFO_KIND` ("bridge", "veth", "macvlan", "ipvlan", ...), None for physical/loopback.
    pub kind: Option<String>,
    /// Lower-case colon separated MAC ("0a:58:0a:16:00:05"), None when the link has none.
    pub mac: Option<String>,
    pub mtu: u32,
    /// Index of the master (bridge) if enslaved.
    pub master: Option<u32>,
    /// IFF_UP administratively set.
    pub up: bool,
    pub promisc: bool,
    /// IFF_ALLMULTI as set by the user (like `promisc`, the header's flag).
    pub allmulti: bool,
    /// IFLA_TXQLEN (0 when the kernel does not report it).
    pub txqlen: u32,
    /// For veth: the peer's ifindex (IFLA_LINK), valid in the peer's netns.
    pub link: Option<u32>,
    /// macvlan mode when kind == macvlan.
    pub macvlan_mode: Option<MacvlanMode>,
    /// ipvlan mode when kind == ipvlan.
    pub ipvlan_mode: Option<IpvlanMode>,
    /// IFLA_IFALIAS (`ip link set alias`): cnikit writes a link's owner there.
    pub alias: Option<String>,
    /// For a bridge: the VLAN it gives each new port (`vlan_default_pvid`,
    /// 0 for none); None when the kernel does not say (no VLAN filtering).
    pub bridge_default_pvid: Option<u16>,
}

#[derive(Debug, Clone, Default)]
pub struct BridgeSpec {
    pub name: String,
    pub mtu: Option<u32>,
    pub vlan_filtering: bool,
    pub promisc: bool,
}

#[derive(Debug)]
pub struct VethSpec<'a> {
    /// Name of the host-side end (in the socket's netns).
    pub host_name: String,
    /// Name of the container-side end, created directly in `peer_netns`.
    pub peer_name: String,
    pub peer_netns: &'a NetNs,
    pub mtu: Option<u32>,
    /// MAC for the container end, "aa:bb:cc:dd:ee:ff"; None: a random one.
    pub peer_mac: Option<String>,
    /// A bridge (index in the socket's netns) the host end joins in the create
    /// request itself: the kernel enslaves a link it has just made before it
    /// answers, so a pod's port costs one request fewer under the RTNL. The
    /// end is still down then; see [`Netlink::bridge_port_up`].
    pub master: Option<u32>,
}

impl VethSpec<'_> {
    /// The peer's attributes in the create request: its name, netns, MAC `hw`, MTU, and an
    /// operstate of dormant. That is so the peer can come up second, its host end already
    /// up, with the kernel's IPv6 link-local address turned off in its up request (see
    /// `ipv6.rs`): IPv6 counts a link as ready once its operstate is up or unknown, and a
    /// fresh link's is unknown until the kernel's link-watch work first looks at it, which
    /// for the events of a link that is down can take up to a second. A dormant end is not
    /// ready when it comes up; the link-watch work then sets its operstate from its carrier
    /// (up), after the request, since it waits for the RTNL the request holds.
    pub(super) fn peer_attributes(&self, hw: [u8; 6]) -> Vec<LinkAttribute> {
        let mut peer = vec![
            LinkAttribute::IfName(self.peer_name.clone()),
            LinkAttribute::NetNsFd(self.peer_netns.as_raw_fd()),
            LinkAttribute::Address(hw.to_vec()),
            LinkAttribute::OperState(State::Dormant),
        ];
        if let Some(mtu) = self.mtu {
            peer.push(LinkAttribute::Mtu(mtu));
        }
        peer
    }
}

/// Indexes of a freshly created veth pair (host index in the socket's netns,
/// peer index in the peer netns), and what the read-back of the host end said.
#[derive(Debug, Clone, Copy)]
pub struct VethPair {
    pub host_index: u32,
    pub peer_index: u32,
    /// The host end's hardware address, as read back.
    pub host_hw: Option<[u8; 6]>,
    /// The peer's hardware address: the spec's, or a random one the create request gave
    /// it (as the kernel would: unicast, locally administered), so that no read-back is
    /// needed for it.
    pub peer_hw: [u8; 6],
    /// The host end would take IPv6 router advertisements (its `accept_ra` is 2, or 1
    /// while it does not forward).
    pub host_takes_router_adverts: bool,
}

impl VethPair {
    /// The pair as the kernel reported the fresh host end: its IFLA_LINK is the
    /// peer's index, and its IFLA_AF_SPEC tells whether it takes router adverts.
    pub(crate) fn from_host_end(
        header: &LinkHeader,
        attrs: &[LinkAttribute],
        peer_hw: [u8; 6],
        what: &str,
    ) -> Result<VethPair> {
        let host = Link::from_message(header, attrs);
        let peer_index = host.link.ok_or_else(|| {
            Error::new(
                ErrorKind::Other,
                format!("{what}: kernel did not report the peer index"),
            )
        })?;
        let host_hw = host
            .mac
            .as_deref()
            .and_then(|m| parse_mac(m).ok())
            .and_then(|m| m.try_into().ok());
        Ok(VethPair {
            host_index: host.index,
            peer_index,
            host_hw,
            peer_hw,
            host_takes_router_adverts: takes_router_adverts(attrs),
        })
    }

    /// The host end's MAC, "aa:bb:cc:dd:ee:ff" ("" when the kernel reported none).
    pub fn host_mac(&self) -> String {
        self.host_hw.map(|m| format_mac(&m)).unwrap_or_default()
    }

    /// The peer's MAC, "aa:bb:cc:dd:ee:ff".
    pub fn peer_mac(&self) -> String {
        format_mac(&self.peer_hw)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacvlanMode {
    Private,
    Vepa,
    Bridge,
    Passthru,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpvlanMode {
    L2,
    L3,
    L3s,
}

/// What every child link (macvlan, ipvlan, vlan) is created with.
#[derive(Debug)]
pub struct ChildLink<'a> {
    /// The final name (in `netns`, where the create puts it).
    pub name: String,
    /// Index of the master in the socket's netns.
    pub master_index: u32,
    pub mtu: Option<u32>,
    /// Move into this netns as part of the create (IFLA_NET_NS_FD); None = stay.
    pub netns: Option<&'a NetNs>,
    /// Turn its `arp_notify` on, so that it announces its IPv4 addresses when it goes
    /// up: in the request that renames it in `netns` (see `create_child`), or in one
    /// of its own when it stays.
    pub arp_notify: bool,
}

#[derive(Debug)]
pub struct MacvlanSpec<'a> {
    pub link: ChildLink<'a>,
    pub mode: MacvlanMode,
    pub mac: Option<String>,
    pub bc_queue_len: Option<u32>,
}

#[derive(Debug)]
pub struct IpvlanSpec<'a> {
    pub link: ChildLink<'a>,
    pub mode: IpvlanMode,
}

/// A bridge port's flags, written with its up (IFLA_INFO_PORT_DATA).
#[derive(Debug, Clone, Copy, Default)]
pub struct BridgePort {
    pub hairpin: bool,
    pub isolated: bool,
}

impl Link {
    /// True when `IFLA_INFO_KIND` equals `kind` ("bridge", "veth", ...).
    pub fn is_kind(&self, kind: &str) -> bool {
        self.kind.as_deref() == Some(kind)
    }

    /// Builds a `Link` from a parsed RTM_NEWLINK reply.
    pub(crate) fn from_message(header: &LinkHeader, attrs: &[LinkAttribute]) -> Link {
        let mut link = Link {
            index: header.index,
            name: String::new(),
            kind: None,
            mac: None,
            mtu: 0,
            master: None,
            // The header flags carry the user-set IFF_PROMISC (dev->gflags), not
            // the promiscuity a bridge imposes on its ports.
            up: header.flags.contains(LinkFlags::Up),
            promisc: header.flags.contains(LinkFlags::Promisc),
            allmulti: header.flags.contains(LinkFlags::Allmulti),
            txqlen: 0,
            link: None,
            macvlan_mode: None,
            ipvlan_mode: None,
            alias: None,
            bridge_default_pvid: None,
        };
        for attr in attrs {
            link.apply(attr);
        }
        // The kernel omits IFLA_LINK when it equals the link's own index, which
        // happens for a veth whose peer got the same index in its netns.
        if link.link.is_none() && link.is_kind("veth") {
            link.link = Some(link.index);
        }
        link
    }

    fn apply(&mut self, attr: &LinkAttribute) {
        match attr {
            LinkAttribute::IfName(name) => self.name = name.clone(),
            LinkAttribute::Address(bytes) if bytes.len() == 6 => self.mac = Some(format_mac(bytes)),
            LinkAttribute::Mtu(mtu) => self.mtu = *mtu,
            LinkAttribute::TxQueueLen(qlen) => self.txqlen = *qlen,
            LinkAttribute::Controller(master) if *master != 0 => self.master = Some(*master),
            LinkAttribute::Link(peer) if *peer != 0 => self.link = Some(*peer),
            LinkAttribute::IfAlias(alias) => self.alias = Some(alias.clone()),
            LinkAttribute::LinkInfo(infos) => infos.iter().for_each(|info| self.apply_info(info)),
            _ => {}
        }
    }

    fn apply_info(&mut self, info: &LinkInfo) {
        match info {
            LinkInfo::Kind(kind) => self.kind = Some(kind.to_string()),
            LinkInfo::Data(InfoData::MacVlan(data)) => {
                self.macvlan_mode = data.iter().find_map(|d| match d {
                    InfoMacVlan::Mode(mode) => MacvlanMode::from_kernel(*mode),
                    _ => None,
                });
            }
            LinkInfo::Data(InfoData::IpVlan(data)) => {
                self.ipvlan_mode = data.iter().find_map(|d| match d {
                    InfoIpVlan::Mode(mode) => IpvlanMode::from_kernel(*mode),
                    _ => None,
                });
            }
            LinkInfo::Data(InfoData::Bridge(data)) => {
                self.bridge_default_pvid = data.iter().find_map(|d| match d {
                    InfoBridge::VlanDefaultPvid(vid) => Some(*vid),
                    _ => None,
                });
            }
            _ => {}
        }
    }
}

/// `IFLA_BR_VLAN_FILTERING` from a bridge's link info; absent (kernels without
/// CONFIG_BRIDGE_VLAN_FILTERING never send it) means off.
pub(crate) fn bridge_vlan_filtering(attrs: &[LinkAttribute]) -> bool {
    attrs
        .iter()
        .filter_map(|a| match a {
            LinkAttribute::LinkInfo(infos) => Some(infos),
            _ => None,
        })
        .flatten()
        .filter_map(|info| match info {
            LinkInfo::Data(InfoData::Bridge(data)) => Some(data),
            _ => None,
        })
        .flatten()
        .any(|d| matches!(d, InfoBridge::VlanFiltering(true)))
}

impl MacvlanMode {
    pub(crate) fn to_kernel(self) -> MacVlanMode {
        match self {
            MacvlanMode::Private => MacVlanMode::Private,
            MacvlanMode::Vepa => MacVlanMode::Vepa,
            MacvlanMode::Bridge => MacVlanMode::Bridge,
            MacvlanMode::Passthru => MacVlanMode::Passthrough,
        }
    }

    fn from_kernel(mode: MacVlanMode) -> Option<Self> {
        match mode {
            MacVlanMode::Private => Some(MacvlanMode::Private),
            MacVlanMode::Vepa => Some(MacvlanMode::Vepa),
            MacVlanMode::Bridge => Some(MacvlanMode::Bridge),
            MacVlanMode::Passthrough => Some(MacvlanMode::Passthru),
            _ => None,
        }
    }
}

impl IpvlanMode {
    pub(crate) fn to_kernel(self) -> IpVlanMode {
        match self {
            IpvlanMode::L2 => IpVlanMode::L2,
            IpvlanMode::L3 => IpVlanMode::L3,
            IpvlanMode::L3s => IpVlanMode::L3S,
        }
    }

    fn from_kernel(mode: IpVlanMode) -> Option<Self> {
        match mode {
            IpVlanMode::L2 => Some(IpvlanMode::L2),
            IpVlanMode::L3 => Some(IpvlanMode::L3),
            IpVlanMode::L3S => Some(IpvlanMode::L3s),
            _ => None,
        }
    }
}

/// "0a:58:0a:16:00:05" style, as `ip` and the CNI result use.
pub(crate) fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses "aa:bb:cc:dd:ee:ff" (also '-' separated) into 6 bytes.
pub(crate) fn parse_mac(text: &str) -> Result<Vec<u8>> {
    let invalid = || {
        Error::new(
            ErrorKind::Other,
            format!("invalid MAC address {text:?} (want aa:bb:cc:dd:ee:ff)"),
        )
    };
    let bytes = text
        .split([':', '-'])
        .map(|part| match part.len() {
            1 | 2 => u8::from_str_radix(part, 16).map_err(|_| invalid()),
            _ => Err(invalid()),
        })
        .collect::<Result<Vec<u8>>>()?;
    if bytes.len() != 6 {
        return Err(invalid());
    }
    Ok(bytes)
}

/// A random unicast, locally administered MAC (02:xx:xx:xx:xx:xx style).
pub(crate) fn random_local_mac() -> [u8; 6] {
    let mut mac: [u8; 6] = random_bytes();
    mac[0] = (mac[0] & 0xfe) | 0x02;
    mac
}

/// `N` (at most 16) random bytes for names and addresses. Should getrandom
/// fail, the clock and the pid stand in: unique enough per process and call.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // SAFETY: getrandom writes at most `len` bytes into the buffer we own.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            ^ (u128::from(std::process::id()) << 16);
        bytes.copy_from_slice(&seed.to_le_bytes()[..N]);
    }
    bytes
}

/// What a link's IFLA_INET6_CONF (in an RTM_NEWLINK reply) says of router
/// advertisements: whether the link would take them (`accept_ra` 2, or 1 while not
/// forwarding, as the kernel's `ipv6_accept_ra`); false for a link without IPv6.
pub(crate) fn takes_router_adverts(attrs: &[LinkAttribute]) -> bool {
    attrs
        .iter()
        .filter_map(|a| match a {
            LinkAttribute::AfSpecUnspec(specs) => Some(specs),
            _ => None,
        })
        .flatten()
        .filter_map(|s| match s {
            netlink_packet_route::link::AfSpecUnspec::Inet6(entries) => Some(entries),
            _ => None,
        })
        .flatten()
        .any(|e| match e {
            netlink_packet_route::link::AfSpecInet6::DevConf(c) => {
                c.accept_ra == 2 || (c.accept_ra == 1 && c.forwarding == 0)
            }
            _ => false,
        })
}

/// The name of link `index` in the calling thread's netns, `None` if there is
/// none. An ioctl (SIOCGIFNAME), not RTM_GETLINK: the kernel answers it under
/// RCU, where a netlink read of a link waits for the RTNL, which on a busy
/// node is held for tens of milliseconds at a time by other pods' veth
/// creations and deletions.
pub fn link_name(index: u32) -> Result<Option<String>> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer holds IF_NAMESIZE bytes, as if_indextoname requires.
    let name = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if name.is_null() {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(Error::io(
            &format!("read the name of link index {index}"),
            &e,
        ));
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(Some(name.to_string_lossy().into_owned()))
}
