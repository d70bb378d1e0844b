//! DEL and GC, which every feature has and which differ only in the table and
//! sets they look in: both go by the attachments' records (`index.rs`) and
//! delete by exact key, so each feature's `Op` holds these as its `Del` and
//! `Gc` and runs them on its own skeleton.

use super::dispatch;
use super::index::{self, Keys};
use super::nft::Table;
use super::schema::Skeleton;
use super::socket::Sockets;
use super::store::{not_valid, release_keys, transact, Nft, Tx};
use super::tag::{self, Attachment};
use super::turn;
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
        // The records go in the batch's turn: see `index.rs`.
        let turn = turn::lock();
        transact(sockets, |nft, tx| {
            gone = self.plan_keys(nft, tx, s)?;
            Ok(())
        })?;
        let owners: Vec<String> = gone.iter().map(|(owner, _)| owner.clone()).collect();
        forget_all(s, &owners)?;
        drop(turn);
        let released: Keys = gone.into_iter().flat_map(|(_, keys)| keys).collect();
        retire_unused(sockets, s, &tag::network_prefix(&self.network), &released);
        Ok(())
    }

    /// Adds to `tx` the removal of every recorded attachment of the network
    /// that is not valid; returns their owners, whose records go once `tx`
    /// is committed (`forget_all`).
    pub(super) fn plan(&self, nft: &mut Nft, tx: &mut Tx, s: &Skeleton) -> Result<Vec<String>> {
        let gone = self.plan_keys(nft, tx, s)?;
        Ok(gone.into_iter().map(|(owner, _)| owner).collect())
    }

    /// [`Gc::plan`], with the keys of each owner it removes.
    fn plan_keys(&self, nft: &mut Nft, tx: &mut Tx, s: &Skeleton) -> Result<Vec<(String, Keys)>> {
        let doomed = not_valid(&self.network, &self.valid);
        index::ensure_indexed(nft, s)?;
        let mut gone = Vec::new();
        for (owner, keys) in index::owners(s, &tag::network_prefix(&self.network))? {
            if doomed(&owner) {
                release_keys(nft, tx, s.table, &keys, &owner)?;
                gone.push((owner, keys));
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
    let mut released = Vec::new();
    // The record goes in the batch's turn: see `index.rs`.
    let turn = turn::lock();
    transact(sockets, |nft, tx| {
        released = release_owner(nft, tx, s, owner, &keys)?;
        Ok(())
    })?;
    index::forget(s, owner)?;
    drop(turn);
    retire_unused(sockets, s, owner, &released);
    Ok(())
}

/// Adds to `tx` the removal of `owner`'s entries in feature `s`: `keys` and
/// those its record names (the record goes once `tx` is committed). Returns
/// them all.
pub(super) fn release_owner(
    nft: &mut Nft,
    tx: &mut Tx,
    s: &Skeleton,
    owner: &str,
    keys: &Keys,
) -> Result<Keys> {
    index::ensure_indexed(nft, s)?;
    let mut all = keys.clone();
    all.extend(index::recorded(s, owner)?);
    release_keys(nft, tx, s.table, &all, owner)?;
    Ok(all)
}

/// Adds to `tx` the removal of what an earlier ADD of `owner` made
/// (`earlier`, from its record) and this one does not (`wanted`): a repeated
/// ADD with other ports, addresses or masquerade leaves nothing of the first.
pub(super) fn release_stale(
    nft: &mut Nft,
    tx: &mut Tx,
    t: Table,
    (earlier, wanted): (&Keys, &Keys),
    owner: &str,
) -> Result<()> {
    let stale: Keys = earlier
        .iter()
        .filter(|(set, k)| !wanted.iter().any(|(s, w)| s.name == set.name && w == k))
        .cloned()
        .collect();
    release_keys(nft, tx, t, &stale, owner)
}

/// After `released` went: the sets among them that belong to one network
/// (`dispatch.rs`) go with their chains and rules when they are now empty.
/// Only read for when the network (of `owner`, a tag or a network's tag
/// prefix) has no record of feature `s` left, so not once per pod. Tidying
/// only: the DEL or GC is done whatever happens here, so a failure is
/// reported on stderr and not returned.
fn retire_unused(sockets: &Sockets, s: &Skeleton, owner: &str, released: &Keys) {
    let mut sets: Vec<_> = released
        .iter()
        .map(|(set, _)| set)
        .filter(|set| dispatch::is_one_networks(&set.name))
        .collect();
    sets.sort_by(|a, b| a.name.cmp(&b.name));
    sets.dedup_by(|a, b| a.name == b.name);
    if sets.is_empty() {
        return;
    }
    let tidied = index::network_has_records(s, owner).and_then(|left| {
        if left {
            return Ok(());
        }
        transact(sockets, |nft, tx| {
            sets.iter()
                .try_for_each(|set| dispatch::retire_if_unused(nft, tx, set))
        })
    });
    if let Err(e) = tidied {
        eprintln!("firewall: leaving the empty sets of {owner} in place: {e}");
    }
}
