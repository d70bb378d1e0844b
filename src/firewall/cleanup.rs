//! DEL and GC, which every feature has and which differ only in the table and
//! sets they look in: both delete by tag, so each feature's `Op` holds these
//! as its `Del` and `Gc` and runs them on its own sets.

use super::nft::Table;
use super::schema::SetDef;
use super::socket::Sockets;
use super::store::{not_valid, release, transact};
use super::tag::{self, Attachment};
use super::Result;
use serde::{Deserialize, Serialize};

/// DEL: this attachment's entries, found by tag (works with the netns gone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Del {
    #[serde(with = "tag::snake")]
    pub att: Attachment,
}

/// GC: entries of `network` whose attachment is not in `valid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gc {
    pub network: String,
    #[serde(with = "tag::snake_list")]
    pub valid: Vec<Attachment>,
}

/// What DEL and GC share: one transaction that removes the entries of a feature's sets
/// whose owner tag the operation picks; only the pick differs.
pub(super) trait Cleanup {
    /// Whether the entries of owner tag `o` go.
    fn doomed(&self) -> Box<dyn Fn(&str) -> bool + '_>;

    fn run(&self, sockets: &Sockets, table: Table, sets: &[&'static SetDef]) -> Result<()> {
        let doomed = self.doomed();
        transact(sockets, |nft, tx| release(nft, tx, table, sets, &doomed))
    }
}

impl Cleanup for Del {
    /// This attachment's own tag only.
    fn doomed(&self) -> Box<dyn Fn(&str) -> bool + '_> {
        let owner = self.att.tag();
        Box::new(move |o| o == owner)
    }
}

impl Cleanup for Gc {
    /// The network's tags that belong to no valid attachment.
    fn doomed(&self) -> Box<dyn Fn(&str) -> bool + '_> {
        Box::new(not_valid(&self.network, &self.valid))
    }
}
