//! Read-only questions about cnikit's nftables state, for `cnikit doctor`:
//! asked over netlink like everything else here (never by exec of `nft`),
//! changing nothing and taking no lock.

use super::nft::Table;
use super::schema::{BRIDGE, INET};
use super::socket::{Nfnl, Sockets};
use super::Result;
use netlink_packet_netfilter::nftables::{NfTablesMessage, TableAttribute, TableMessage};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage};

/// Which of cnikit's tables exist in the calling thread's network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tables {
    /// `table inet cnikit`: port mappings and masquerade.
    pub inet: bool,
    /// `table bridge cnikit`: the MAC spoof check.
    pub bridge: bool,
}

/// Names of the tables, as `nft list tables` prints them.
pub const INET_TABLE: &str = "inet cnikit";
pub const BRIDGE_TABLE: &str = "bridge cnikit";

/// Look both tables up (one netfilter socket, closed on return).
pub fn tables() -> Result<Tables> {
    Sockets::default().with(|nl| {
        Ok(Tables {
            inet: exists(nl, INET)?,
            bridge: exists(nl, BRIDGE)?,
        })
    })
}

fn exists(nl: &mut Nfnl, t: Table) -> Result<bool> {
    let msg = NetfilterMessage::new(
        NetfilterHeader::new(t.family, 0, 0),
        NfTablesMessage::GetTable(TableMessage {
            attributes: vec![TableAttribute::Name(t.name.into())],
        }),
    );
    match nl.request(msg, 0) {
        Ok(_) => Ok(true),
        Err(f) if f.errno() == Some(libc::ENOENT) => Ok(false),
        Err(f) => Err(f.context(&format!("read table {}", t.name)).into()),
    }
}
