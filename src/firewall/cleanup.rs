//! DEL and GC, which every feature has and which differ only in the table and
//! sets they look in: both go by the attachments' records (`index.rs`) and
//! delete by exact key, so each feature's `Op` holds these as its `Del` and
//! `Gc` and runs them on its own skeleton.

use super::index::{self, Keys};
use super::schema::Skeleton;
use super::socket::Sockets;
use super::store::{not_valid, release_keys, transact, Nft, Tx};
use super::tag::{self, Attachment};
use super::Result;
use serde::{Deserialize, Serialize};

/// DEL: this attachment's entries, found by its record (works with the
/// netns gone and without prevResult).
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
    pub(super) fn run(&self, sockets: &Sockets, s: &Skeleton) -> Result<()> {
        release_recorded(sockets, s, &self.att.tag(), Vec::new())
    }
}

impl Gc {
    pub(super) fn run(&self, sockets: &Sockets, s: &Skeleton) -> Result<()> {
        let mut gone = Vec::new();
        transact(sockets, |nft, tx| {
            gone = self.plan(nft, tx, s)?;
            Ok(())
        })?;
        forget_all(s, &gone)
    }

    /// Adds to `tx` the removal of every recorded attachment of the network
    /// that is not valid; returns their owners, whose records go once `tx`
    /// is committed (`forget_all`).
    pub(super) fn plan(&self, nft: &mut Nft, tx: &mut Tx, s: &Skeleton) -> Result<Vec<String>> {
        let doomed = not_valid(&self.network, &self.valid);
        index::ensure_indexed(nft, s)?;
        let mut gone = Vec::new();
        for (owner, keys) in index::owners(s, &tag::network_prefix(&self.network))? {
            if doomed(&owner) {
                release_keys(nft, tx, s.table, &keys, &owner)?;
                gone.push(owner);
            }
        }
        Ok(gone)
    }
}

/// Drops the records of `owners` in feature `s` (their elements went).
pub(super) fn forget_all(s: &Skeleton, owners: &[String]) -> Result<()> {
    owners.iter().try_for_each(|owner| index::forget(s, owner))
}

/// DEL of `owner`'s entries in feature `s`: the `keys` the caller knows
/// (from prevResult) and those its record names, each removed only when
/// `owner` holds it; then the record goes.
pub(super) fn release_recorded(
    sockets: &Sockets,
    s: &Skeleton,
    owner: &str,
    keys: Keys,
) -> Result<()> {
    transact(sockets, |nft, tx| release_owner(nft, tx, s, owner, &keys))?;
    index::forget(s, owner)
}

/// Adds to `tx` the removal of `owner`'s entries in feature `s`: `keys` and
/// those its record names (the record goes once `tx` is committed).
pub(super) fn release_owner(
    nft: &mut Nft,
    tx: &mut Tx,
    s: &Skeleton,
    owner: &str,
    keys: &Keys,
) -> Result<()> {
    index::ensure_indexed(nft, s)?;
    let mut all = keys.clone();
    all.extend(index::recorded(s, owner)?);
    release_keys(nft, tx, s.table, &all, owner)
}
