//! 802.1Q VLAN links (the vlan plugin's) and VRF devices (the vrf plugin's): created,
//! and the details of theirs that `Link` does not carry (VLAN id, VRF table) read back.
use super::linkops::{create_error, link_message, Child};
use super::{ChildLink, Error, ErrorKind, Link, Netlink, Result};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVlan, InfoVrf, LinkAttribute, LinkInfo};

/// An 802.1Q link to create on a master.
#[derive(Debug)]
pub struct VlanSpec<'a> {
    pub link: ChildLink<'a>,
    /// The VLAN id, 0–4094.
    pub id: u16,
}

impl Netlink {
    /// Creates a VLAN on `spec.link.master_index` as macvlan is created (see
    /// `create_macvlan`): into `spec.link.netns` under a temporary name, renamed there. A
    /// kernel without 802.1Q support is `ErrorKind::Unsupported` naming
    /// CONFIG_VLAN_8021Q.
    pub fn create_vlan(&mut self, spec: VlanSpec) -> Result<Link> {
        let attrs = vec![LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vlan),
            LinkInfo::Data(InfoData::Vlan(vec![InfoVlan::Id(spec.id)])),
        ])];
        self.create_child(Child::of("vlan", &spec.link), attrs)
    }

    /// The VLAN id of link `index`; None when it is gone or not a VLAN.
    pub fn vlan_id(&mut self, index: u32) -> Result<Option<u16>> {
        Ok(self.link_data(index)?.and_then(|data| match data {
            InfoData::Vlan(v) => v.iter().find_map(|i| match i {
                InfoVlan::Id(id) => Some(*id),
                _ => None,
            }),
            _ => None,
        }))
    }

    /// The routing table of VRF device `index`; None when it is gone or not a VRF.
    pub fn vrf_table(&mut self, index: u32) -> Result<Option<u32>> {
        Ok(self.link_data(index)?.and_then(|data| match data {
            InfoData::Vrf(v) => v.iter().find_map(|i| match i {
                InfoVrf::TableId(t) => Some(*t),
                _ => None,
            }),
            _ => None,
        }))
    }

    /// Creates VRF device `name` with routing table `table` in this socket's netns and
    /// reads it back (down). A kernel without VRF support is `ErrorKind::Unsupported`
    /// naming CONFIG_NET_VRF.
    pub fn create_vrf(&mut self, name: &str, table: u32) -> Result<Link> {
        let what = format!("create vrf {name} table {table}");
        let attrs = vec![
            LinkAttribute::IfName(name.to_string()),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Vrf),
                LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(table)])),
            ]),
        ];
        self.new_link(link_message(0, attrs))
            .map_err(|f| create_error(f, "vrf", &what))?;
        self.link_by_name(name)?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("{what}: created but it vanished"),
            )
        })
    }

    /// Takes link `index` out of its master (`ip link set nomaster`).
    pub fn set_nomaster(&mut self, index: u32) -> Result<()> {
        let msg = link_message(index, vec![LinkAttribute::Controller(0)]);
        self.send_setlink(index, msg, "nomaster")
    }

    /// IFLA_INFO_DATA of link `index`, when it has any this crate decodes.
    fn link_data(&mut self, index: u32) -> Result<Option<InfoData>> {
        let raw = self
            .get_link(link_message(index, vec![]))
            .map_err(|f| f.context(&format!("read link index {index}")))?;
        let Some((_, attrs)) = raw else {
            return Ok(None);
        };
        Ok(attrs.into_iter().find_map(|a| match a {
            LinkAttribute::LinkInfo(infos) => infos.into_iter().find_map(|i| match i {
                LinkInfo::Data(d) => Some(d),
                _ => None,
            }),
            _ => None,
        }))
    }
}
