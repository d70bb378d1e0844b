//! RTM_SETLINK setters for a link's own attributes (MAC, MTU, transmit queue length,
//! all-multicast), as the tuning plugin changes and restores them.
use super::link::parse_mac;
use super::linkops::link_message;
use super::{Netlink, Result};
use netlink_packet_route::link::{LinkAttribute, LinkFlags};

impl Netlink {
    /// Sets the hardware address ("aa:bb:cc:dd:ee:ff").
    pub fn set_mac(&mut self, index: u32, mac: &str) -> Result<()> {
        let msg = link_message(index, vec![LinkAttribute::Address(parse_mac(mac)?)]);
        self.send_setlink(index, msg, &format!("address {mac}"))
    }

    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<()> {
        let msg = link_message(index, vec![LinkAttribute::Mtu(mtu)]);
        self.send_setlink(index, msg, &format!("mtu {mtu}"))
    }

    /// Sets the transmit queue length (like `ip link set txqueuelen`).
    pub fn set_txqlen(&mut self, index: u32, qlen: u32) -> Result<()> {
        let msg = link_message(index, vec![LinkAttribute::TxQueueLen(qlen)]);
        self.send_setlink(index, msg, &format!("txqueuelen {qlen}"))
    }

    /// Sets or clears IFF_ALLMULTI (like `ip link set allmulticast on`).
    pub fn set_allmulti(&mut self, index: u32, on: bool) -> Result<()> {
        let mut msg = link_message(index, vec![]);
        // change_mask limits the kernel to this one flag.
        msg.header.change_mask = LinkFlags::Allmulti;
        if on {
            msg.header.flags = LinkFlags::Allmulti;
        }
        let word = if on {
            "allmulticast on"
        } else {
            "allmulticast off"
        };
        self.send_setlink(index, msg, word)
    }
}
