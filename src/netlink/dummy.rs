//! dummy links (the dummy plugin's): created in the socket's own netns under their final
//! name, and a probe for the kind that creates nothing.
use super::link::random_bytes;
use super::linkops::{create_error, is_unknown_kind, link_message};
use super::{Error, ErrorKind, Link, Netlink, Result};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo};
use netlink_packet_route::RouteNetlinkMessage;

impl Netlink {
    /// Creates dummy link `name` in this socket's netns (down, with the kernel's random
    /// MAC) and reads it back. Opened in the pod's netns, the socket makes the link there
    /// under its final name: the name is checked in the socket's netns, not the host's.
    /// A kernel without dummy support is `ErrorKind::Unsupported` naming CONFIG_DUMMY.
    pub fn create_dummy(&mut self, name: &str) -> Result<Link> {
        let what = format!("create dummy {name}");
        let attrs = vec![
            LinkAttribute::IfName(name.to_string()),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Dummy)]),
        ];
        self.new_link(link_message(0, attrs))
            .map_err(|f| create_error(f, "dummy", &what))?;
        let made = self.link_by_name(name).and_then(|link| {
            link.ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("{what}: created but it vanished"),
                )
            })
        });
        // Not read back: the caller has no index to remove it by, so it goes here.
        made.map_err(|mut e| {
            if let Err(undo) = self.delete_by_name(name) {
                e.message = format!("{}; {}", e.message, undo.message);
            }
            e
        })
    }

    /// Whether the kernel has (or can load) dummy links, creating none: a create whose
    /// IFLA_ADDRESS is one byte long is refused by the dummy driver's own validation
    /// (EINVAL) once the kind is known, and as an unknown kind otherwise. Like any create
    /// of the kind, it may load the module (which makes the host's `dummy0`).
    pub fn dummy_supported(&mut self) -> Result<bool> {
        let probe = format!("cnkp{:08x}", u32::from_be_bytes(random_bytes()));
        let attrs = vec![
            LinkAttribute::IfName(probe.clone()),
            LinkAttribute::Address(vec![0x02]),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Dummy)]),
        ];
        match self.new_link(link_message(0, attrs)) {
            Err(f) if is_unknown_kind(&f) => Ok(false),
            Err(f) if f.errno() == Some(libc::EINVAL) => Ok(true),
            Err(f) => Err(f.context("probe for dummy support")),
            // A kernel that took the address after all: the kind exists; remove the link.
            Ok(()) => self.delete_by_name(&probe).map(|()| true),
        }
    }

    /// RTM_DELLINK by name; a link that is not there is no error.
    fn delete_by_name(&mut self, name: &str) -> Result<()> {
        let msg = link_message(0, vec![LinkAttribute::IfName(name.to_string())]);
        match self.request(RouteNetlinkMessage::DelLink(msg), 0) {
            Err(f) if !matches!(f.errno(), Some(libc::ENODEV)) => {
                Err(f.context(&format!("remove {name} again")))
            }
            _ => Ok(()),
        }
    }
}
