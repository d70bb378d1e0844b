//! Traffic control (RTM_*QDISC, RTM_*TFILTER) and ifb links: what the
//! bandwidth plugin shapes with. Messages are the route crate's `TcMessage`;
//! the token bucket filter's parameters (`struct tc_tbf_qopt`), which the
//! crate has no type for, are encoded here. Replies are read attribute by
//! attribute, like links, so an attribute this crate cannot parse (a newer
//! kernel's statistics) never fails a read.

use super::linkops::{create_error, decode_link, link_message};
use super::{Error, ErrorKind, Link, Netlink, Result};
use netlink_packet_core::{DefaultNla, NlasIterator, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute,
    TcFilterU32Option, TcHandle, TcHeader, TcMessage, TcMirror, TcMirrorActionType, TcOption,
    TcU32Key, TcU32Selector, TcU32SelectorFlags,
};
use netlink_packet_route::RouteNetlinkMessage;

const RTM_NEWLINK: u16 = 16;
const RTM_NEWQDISC: u16 = 36;
const RTM_NEWTFILTER: u16 = 44;
/// sizeof(struct tcmsg)
const TC_HEADER_LEN: usize = 20;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
/// sizeof(struct tc_tbf_qopt): two tc_ratespec (12 bytes), limit, buffer, mtu.
const TBF_QOPT_LEN: usize = 36;
const TCA_U32_ACT: u16 = 7;
const TCA_ACT_KIND: u16 = 1;
const TCA_ACT_OPTIONS: u16 = 2;
const TCA_MIRRED_PARMS: u16 = 2;
/// Offset of `ifindex` in `struct tc_mirred` (after tc_gen's five words and eaction).
const MIRRED_IFINDEX_AT: usize = 24;
/// ETH_P_ALL in network byte order, as tcm_info's low half wants it.
const ETH_P_ALL_BE: u32 = 0x0003u16.to_be() as u32;

/// `ffff:`, the handle of the ingress qdisc (TC_H_INGRESS's major).
pub const INGRESS_HANDLE: u32 = 0xffff_0000;
/// TC_H_INGRESS: where the ingress qdisc hangs.
const INGRESS_PARENT: u32 = 0xffff_fff1;
/// TC_H_ROOT.
const ROOT_PARENT: u32 = 0xffff_ffff;

/// A token bucket filter as the kernel takes it: rate in bytes per second,
/// limit (queue) in bytes, buffer (bucket) in scheduler ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    pub rate: u64,
    pub limit: u32,
    pub buffer: u32,
}

/// A qdisc as read back: kind, handle, parent, and its TBF parameters when
/// it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    pub kind: String,
    pub handle: u32,
    pub parent: u32,
    pub tbf: Option<Tbf>,
}

impl Qdisc {
    pub fn is_root(&self) -> bool {
        self.parent == ROOT_PARENT
    }

    pub fn is_ingress(&self) -> bool {
        self.parent == INGRESS_PARENT && self.kind == "ingress"
    }
}

/// An ifb link as read back, with its alias (`ip link set alias`).
#[derive(Debug, Clone)]
pub struct Ifb {
    pub link: Link,
    pub alias: Option<String>,
}

impl Netlink {
    /// The qdiscs of link `index` (a dump filtered here: the kernel's dump
    /// has no per-link filter).
    pub fn qdiscs(&mut self, index: u32) -> Result<Vec<Qdisc>> {
        let replies = self
            .request(
                RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()),
                NLM_F_DUMP,
            )
            .map_err(|f| f.context("list qdiscs"))?;
        Ok(replies
            .iter()
            .filter(|r| r.kind == RTM_NEWQDISC)
            .filter_map(|r| decode_qdisc(&r.payload, index))
            .collect())
    }

    /// `tc qdisc add dev INDEX root handle MAJOR: tbf …`.
    pub fn add_root_tbf(&mut self, index: u32, major: u16, tbf: Tbf) -> Result<()> {
        let mut options = vec![TcOption::Other(DefaultNla::new(
            TCA_TBF_PARMS,
            tbf_qopt(tbf),
        ))];
        if tbf.rate > u64::from(u32::MAX) {
            options.push(TcOption::Other(DefaultNla::new(
                TCA_TBF_RATE64,
                tbf.rate.to_ne_bytes().to_vec(),
            )));
        }
        let msg = tc_message(
            index,
            u32::from(major) << 16,
            ROOT_PARENT,
            0,
            kind_with_options("tbf", options),
        );
        self.new_tc(
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            index,
            "add tbf qdisc",
        )
    }

    /// `tc qdisc add dev INDEX ingress` (handle `ffff:`).
    pub fn add_ingress_qdisc(&mut self, index: u32) -> Result<()> {
        let msg = tc_message(
            index,
            INGRESS_HANDLE,
            INGRESS_PARENT,
            0,
            vec![TcAttribute::Kind("ingress".into())],
        );
        self.new_tc(
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            index,
            "add ingress qdisc",
        )
    }

    /// Deletes qdisc `q` of link `index` (with its filters and children).
    pub fn delete_qdisc(&mut self, index: u32, q: &Qdisc) -> Result<()> {
        let msg = tc_message(index, q.handle, q.parent, 0, vec![]);
        self.request(RouteNetlinkMessage::DelQueueDiscipline(msg), 0)
            .map(drop)
            .map_err(|f| {
                let link = self.describe(index);
                f.context(&format!("delete {} qdisc of {link}", q.kind))
            })
    }

    /// `tc filter add dev INDEX parent PARENT protocol all prio 1 u32 match
    /// u32 0 0 flowid 1:1 action mirred egress redirect dev TO`: every frame
    /// under `parent` goes to link `to` instead (the action is `stolen`).
    pub fn add_redirect_filter(&mut self, index: u32, parent: u32, to: u32) -> Result<()> {
        let mut sel = TcU32Selector::default();
        sel.flags = TcU32SelectorFlags::Terminal;
        sel.nkeys = 1;
        sel.keys = vec![TcU32Key::default()];
        let mut mirred = TcMirror::default();
        mirred.generic.action = TcActionType::Stolen;
        mirred.eaction = TcMirrorActionType::EgressRedir;
        mirred.ifindex = to;
        let mut action = TcAction::default();
        action.attributes = vec![
            TcActionAttribute::Kind("mirred".into()),
            TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
                mirred,
            ))]),
        ];
        let options = vec![
            TcOption::U32(TcFilterU32Option::Selector(sel)),
            TcOption::U32(TcFilterU32Option::ClassId(TcHandle { major: 1, minor: 1 })),
            TcOption::U32(TcFilterU32Option::Action(vec![action])),
        ];
        let msg = tc_message(
            index,
            0,
            parent,
            (1 << 16) | ETH_P_ALL_BE,
            kind_with_options("u32", options),
        );
        self.new_tc(
            RouteNetlinkMessage::NewTrafficFilter(msg),
            index,
            "add u32 filter",
        )
    }

    /// The links that u32 filters under `parent` of link `index` redirect
    /// or mirror to (mirred actions' ifindex).
    pub fn redirect_targets(&mut self, index: u32, parent: u32) -> Result<Vec<u32>> {
        let msg = tc_message(index, 0, parent, 0, vec![]);
        let replies = match self.request(RouteNetlinkMessage::GetTrafficFilter(msg), NLM_F_DUMP) {
            Ok(r) => r,
            // No such qdisc: no filters.
            Err(f) if matches!(f.errno(), Some(libc::EINVAL) | Some(libc::ENOENT)) => {
                return Ok(Vec::new())
            }
            Err(f) => {
                let link = self.describe(index);
                return Err(f.context(&format!("list filters of {link}")));
            }
        };
        Ok(replies
            .iter()
            .filter(|r| r.kind == RTM_NEWTFILTER)
            .flat_map(|r| mirred_targets(&r.payload))
            .collect())
    }

    /// Creates ifb link `name` (up, `mtu`, no transmit queue, as the
    /// reference makes it) with `alias` naming its owner.
    pub fn create_ifb(&mut self, name: &str, mtu: u32, alias: &str) -> Result<Link> {
        let mut msg = link_message(
            0,
            vec![
                LinkAttribute::IfName(name.to_string()),
                LinkAttribute::Mtu(mtu),
                LinkAttribute::TxQueueLen(0),
                LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]),
            ],
        );
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        let what = format!("create ifb {name}");
        self.new_link(msg)
            .map_err(|f| create_error(f, "ifb", &what))?;
        let made = self.link_by_name(name).and_then(|link| {
            let link = link.ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("{what}: created but it vanished"),
                )
            })?;
            // The kernel ignores IFLA_IFALIAS in a create; it takes it in a set.
            let set_alias = link_message(link.index, vec![LinkAttribute::IfAlias(alias.into())]);
            self.send_setlink(link.index, set_alias, "alias")?;
            Ok(link)
        });
        made.map_err(|mut e| {
            // By name: the index may be what could not be read.
            let by_name = link_message(0, vec![LinkAttribute::IfName(name.to_string())]);
            match self.request(RouteNetlinkMessage::DelLink(by_name), 0) {
                Err(f) if !matches!(f.errno(), Some(libc::ENODEV)) => {
                    let undo = f.context("removing it again");
                    e.message = format!("{}; {}", e.message, undo.message);
                }
                _ => {}
            }
            e
        })
    }

    /// Every ifb link of this socket's netns, with its alias.
    pub fn ifbs(&mut self) -> Result<Vec<Ifb>> {
        let msg = RouteNetlinkMessage::GetLink(LinkMessage::default());
        let replies = self
            .request(msg, NLM_F_DUMP)
            .map_err(|f| f.context("list links"))?;
        let mut out = Vec::new();
        for (header, attrs) in replies
            .iter()
            .filter(|r| r.kind == RTM_NEWLINK)
            .filter_map(|r| decode_link(&r.payload))
        {
            let link = Link::from_message(&header, &attrs);
            if !link.is_kind("ifb") {
                continue;
            }
            let alias = attrs.iter().find_map(|a| match a {
                LinkAttribute::IfAlias(s) => Some(s.clone()),
                _ => None,
            });
            out.push(Ifb { link, alias });
        }
        Ok(out)
    }

    /// RTM_NEWQDISC / RTM_NEWTFILTER with CREATE|EXCL; errors name the link.
    fn new_tc(&mut self, msg: RouteNetlinkMessage, index: u32, what: &str) -> Result<()> {
        self.request(msg, NLM_F_CREATE | NLM_F_EXCL)
            .map(drop)
            .map_err(|f| {
                let link = self.describe(index);
                let e = f.context(&format!("{what} on {link}"));
                // An existing qdisc is no interface conflict (which is what
                // AlreadyExists tells a plugin): it is the kernel refusing.
                Error {
                    kind: match e.kind {
                        ErrorKind::AlreadyExists => ErrorKind::Other,
                        k => k,
                    },
                    ..e
                }
            })
    }
}

fn tc_message(
    index: u32,
    handle: u32,
    parent: u32,
    info: u32,
    attrs: Vec<TcAttribute>,
) -> TcMessage {
    let header = TcHeader {
        index: index as i32,
        handle: handle.into(),
        parent: parent.into(),
        info,
        ..TcHeader::default()
    };
    TcMessage::from_parts(header, attrs)
}

/// The attributes of a qdisc or filter of kind `kind` (`tc … tbf`, `tc … u32`)
/// with its kind-specific `options`.
fn kind_with_options(kind: &str, options: Vec<TcOption>) -> Vec<TcAttribute> {
    vec![
        TcAttribute::Kind(kind.into()),
        TcAttribute::Options(options),
    ]
}

/// `struct tc_tbf_qopt`: the rate (its 32-bit field; RATE64 carries larger
/// ones), no peak rate, limit, buffer, mtu 0. Link layer "unaware" as the
/// reference sends it (the kernel then needs no rate table).
fn tbf_qopt(tbf: Tbf) -> Vec<u8> {
    let mut b = vec![0u8; TBF_QOPT_LEN];
    let rate32 = u32::try_from(tbf.rate).unwrap_or(u32::MAX);
    b[8..12].copy_from_slice(&rate32.to_ne_bytes());
    b[24..28].copy_from_slice(&tbf.limit.to_ne_bytes());
    b[28..32].copy_from_slice(&tbf.buffer.to_ne_bytes());
    b
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A qdisc of link `index` from an RTM_NEWQDISC payload.
fn decode_qdisc(payload: &[u8], index: u32) -> Option<Qdisc> {
    if read_u32(payload, 4)? != index {
        return None;
    }
    let handle = read_u32(payload, 8)?;
    let parent = read_u32(payload, 12)?;
    let mut kind = String::new();
    let mut options = None;
    for nla in NlasIterator::new(payload.get(TC_HEADER_LEN..)?).flatten() {
        match nla.kind() {
            TCA_KIND => kind = c_string(nla.value()),
            TCA_OPTIONS => options = Some(nla.value().to_vec()),
            _ => {}
        }
    }
    let tbf = match (kind.as_str(), options) {
        ("tbf", Some(opts)) => decode_tbf(&opts),
        _ => None,
    };
    Some(Qdisc {
        kind,
        handle,
        parent,
        tbf,
    })
}

fn decode_tbf(options: &[u8]) -> Option<Tbf> {
    let mut tbf = None;
    let mut rate64 = None;
    for nla in NlasIterator::new(options).flatten() {
        let v = nla.value();
        match nla.kind() {
            TCA_TBF_PARMS if v.len() >= TBF_QOPT_LEN => {
                tbf = Some(Tbf {
                    rate: u64::from(read_u32(v, 8)?),
                    limit: read_u32(v, 24)?,
                    buffer: read_u32(v, 28)?,
                });
            }
            TCA_TBF_RATE64 => rate64 = v.get(..8).and_then(|b| b.try_into().ok()),
            _ => {}
        }
    }
    let mut tbf = tbf?;
    if let Some(bytes) = rate64 {
        tbf.rate = u64::from_ne_bytes(bytes);
    }
    Some(tbf)
}

/// The ifindex of every mirred action of a u32 filter (RTM_NEWTFILTER payload).
fn mirred_targets(payload: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    let attrs = payload.get(TC_HEADER_LEN..).unwrap_or_default();
    for opts in NlasIterator::new(attrs)
        .flatten()
        .filter(|n| n.kind() == TCA_OPTIONS)
    {
        for acts in NlasIterator::new(opts.value())
            .flatten()
            .filter(|n| n.kind() == TCA_U32_ACT)
        {
            for act in NlasIterator::new(acts.value()).flatten() {
                out.extend(mirred_ifindex(act.value()));
            }
        }
    }
    out
}

/// The target of one action (TCA_ACT_* attributes), if it is a mirred one.
fn mirred_ifindex(action: &[u8]) -> Option<u32> {
    let mut is_mirred = false;
    let mut target = None;
    for nla in NlasIterator::new(action).flatten() {
        match nla.kind() {
            TCA_ACT_KIND => is_mirred = c_string(nla.value()) == "mirred",
            TCA_ACT_OPTIONS => {
                target = NlasIterator::new(nla.value())
                    .flatten()
                    .find(|o| o.kind() == TCA_MIRRED_PARMS)
                    .and_then(|o| read_u32(o.value(), MIRRED_IFINDEX_AT));
            }
            _ => {}
        }
    }
    target.filter(|_| is_mirred)
}

fn c_string(v: &[u8]) -> String {
    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::nla;
    use netlink_packet_core::Emitable;

    #[test]
    fn tbf_parameters_round_trip() {
        let tbf = Tbf {
            rate: 1_000_000,
            limit: 125_000,
            buffer: 1_562_500,
        };
        let opts = nla(TCA_TBF_PARMS, &tbf_qopt(tbf));
        assert_eq!(decode_tbf(&opts), Some(tbf));
        let big = Tbf {
            rate: 5 << 32,
            ..tbf
        };
        let mut opts = nla(TCA_TBF_PARMS, &tbf_qopt(big));
        opts.extend(nla(TCA_TBF_RATE64, &big.rate.to_ne_bytes()));
        assert_eq!(decode_tbf(&opts), Some(big));
    }

    #[test]
    fn a_redirect_filter_reads_back_its_target() {
        let mut mirred = TcMirror::default();
        mirred.ifindex = 42;
        let mut action = TcAction::default();
        action.attributes = vec![
            TcActionAttribute::Kind("mirred".into()),
            TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
                mirred,
            ))]),
        ];
        let msg = tc_message(
            3,
            0,
            INGRESS_HANDLE,
            0,
            vec![
                TcAttribute::Kind("u32".into()),
                TcAttribute::Options(vec![TcOption::U32(TcFilterU32Option::Action(vec![action]))]),
            ],
        );
        let mut bytes = vec![0; msg.buffer_len()];
        msg.emit(&mut bytes);
        assert_eq!(mirred_targets(&bytes), vec![42]);
    }
}
