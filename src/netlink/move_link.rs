//! Moving an existing link into another network namespace (host-device): one
//! RTM_SETLINK with IFLA_NET_NS_FD, the name it gets there and its alias.
//!
//! What the kernel does with such a request (`do_setlink`): the netns change
//! first, which brings the link down; if the link's current name is taken in the
//! target, IFLA_IFNAME is the name it takes instead (a `%d` pattern picks a free
//! one), and if that is taken too nothing moves (EEXIST). Then, in the target,
//! the link is renamed to IFLA_IFNAME and IFLA_IFALIAS is set. So a caller that
//! knows the name to be free in the target gets move, rename and alias at once;
//! a rename that fails after the move leaves the link in the target under its
//! old name, which the caller looks for and moves back.
use super::linkops::link_message;
use super::{NetNs, Netlink, Result};
use netlink_packet_route::link::LinkAttribute;

impl Netlink {
    /// Moves link `index` of this socket's netns into `target`, named `name` there
    /// (`name` may be a `%d` pattern), its alias set to `alias` (`""` clears it).
    pub fn move_link_to(
        &mut self,
        index: u32,
        target: &NetNs,
        name: &str,
        alias: &str,
    ) -> Result<()> {
        let attrs = vec![
            LinkAttribute::NetNsFd(target.as_raw_fd()),
            LinkAttribute::IfName(name.to_string()),
            LinkAttribute::IfAlias(alias.to_string()),
        ];
        let word = format!("netns {} name {name}", target.path().display());
        self.send_setlink(index, link_message(index, attrs), &word)
    }

    /// Sets link `index`'s alias (`ip link set alias`); `""` clears it.
    pub fn set_alias(&mut self, index: u32, alias: &str) -> Result<()> {
        let msg = link_message(index, vec![LinkAttribute::IfAlias(alias.to_string())]);
        self.send_setlink(index, msg, &format!("alias {alias:?}"))
    }

    /// The link whose MAC is `mac` (lower case, colon separated), if any.
    pub fn link_by_mac(&mut self, mac: &str) -> Result<Option<super::Link>> {
        let mac = mac.to_ascii_lowercase();
        Ok(self
            .links()?
            .into_iter()
            .find(|l| l.mac.as_deref() == Some(mac.as_str())))
    }
}
