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

impl Del {
    pub(super) fn run(
        &self,
        sockets: &Sockets,
        table: Table,
        sets: &[&'static SetDef],
    ) -> Result<()> {
        let owner = self.att.tag();
        release_where(sockets, table, sets, &|o| o == owner)
    }
}

impl Gc {
    pub(super) fn run(
        &self,
        sockets: &Sockets,
        table: Table,
        sets: &[&'static SetDef],
    ) -> Result<()> {
        release_where(sockets, table, sets, &not_valid(&self.network, &self.valid))
    }
}

/// Removes, in one transaction, the entries of `sets` whose owner tag `doomed` picks.
fn release_where(
    sockets: &Sockets,
    table: Table,
    sets: &[&'static SetDef],
    doomed: &dyn Fn(&str) -> bool,
) -> Result<()> {
    transact(sockets, |nft, tx| release(nft, tx, table, sets, doomed))
}
