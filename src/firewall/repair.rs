//! Putting back what the attachments' records say they hold, when someone
//! else removed it: `nft flush ruleset` (what Debian's `nftables.service`
//! does on every restart or reload), `nft delete table inet cnikit`, an
//! `iptables -F FORWARD`. The daemon does it when the kernel reports such a
//! change (`watch.rs`) and when it starts; `cnikit firewall restore` does it
//! once, for a node without the daemon.
//!
//! How. Every version 2 record names the ADD operation that made it
//! (`index.rs`); a repair replays each one's plan, as an ADD makes it on a
//! node where nothing is there, into one batch: ADDs are idempotent, so an
//! attachment whose state is whole adds nothing, and a repair with nothing
//! to do sends nothing (and so cannot wake itself up again). Before that it
//! checks the feature skeletons and the networks' structures whole (sets,
//! chains, their rule counts, the base-chain rules), which an ADD does not
//! do on every call.
//!
//! What it never does: touch another table or chain than those cnikit makes
//! (the ADDs' plans only name ours, and the firewall plugin's rules in
//! iptables' filter tables); bring back what a DEL or GC removed (it reads
//! the records in its turn, and a DEL removes its record in the turn of its
//! batch, so a record it sees is one whose attachment is still there); take
//! a key from a later attachment (of two records holding one key, the later
//! one's ADD is replayed, and the earlier record is left to its DEL or GC).

use super::index::{self, Stored};
use super::request::Request;
use super::schema::{self, Skeleton};
use super::store::{transact, Nft, Tx};
use super::{turn, Error, ErrorKind, Result, Sockets};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What a repair found and did.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Repaired {
    /// Attachments with records that could be replayed.
    pub attachments: usize,
    /// Those that lacked something and got it back (their tags).
    pub restored: Vec<String>,
    /// Changes in the batch (0: everything was in place).
    pub changes: usize,
    /// Records holding keys only (made before records could rebuild, or
    /// found by the upgrade's one-time scan): their pods must be re-created
    /// to get back what they lost.
    pub keys_only: Vec<String>,
    /// Records not replayed, and why (a later attachment holds their keys,
    /// or their plan failed).
    pub skipped: Vec<(String, String)>,
}

/// Puts back what the records of this network namespace say, in one batch.
pub fn restore(sockets: &Sockets) -> Result<Repaired> {
    // No record, nothing to put back: and no lock to take (on a node with no
    // pod yet there may be no /run/cnikit to make it in, as for the
    // package's hardened unit, whose /run is read-only).
    if !index::any_record()? {
        return Ok(Repaired::default());
    }
    // Never without the turn: a DEL going ahead without it (after waiting
    // its bounded time) could remove its record after this read it.
    let _turn = turn::lock_held().map_err(|why| {
        Error::new(
            ErrorKind::Other,
            format!(
                "not repairing without the firewall lock ({why}): a repair could bring back \
                 what a DEL removes meanwhile; run it as root, or again once the holder is done"
            ),
        )
    })?;
    let plan = Plan::of(index::every_record()?);
    let mut done = Repaired::default();
    transact(sockets, |nft, tx| {
        nft.read_rules_once();
        done = plan.apply(nft, tx)?;
        Ok(())
    })?;
    Ok(done)
}

/// The records a repair replays.
struct Plan {
    /// (feature, owner, the ADD), oldest first.
    replays: Vec<(String, String, Request)>,
    keys_only: Vec<String>,
    skipped: Vec<(String, String)>,
}

impl Plan {
    fn of(mut records: Vec<Stored>) -> Plan {
        records.sort_by(|a, b| (a.written_ms, &a.owner).cmp(&(b.written_ms, &b.owner)));
        let latest = latest_holders(&records);
        let mut plan = Plan {
            replays: Vec::new(),
            keys_only: Vec::new(),
            skipped: Vec::new(),
        };
        for r in records {
            let who = format!("{} ({})", r.owner, r.feature);
            if let Some(later) = r
                .keys
                .iter()
                .find_map(|k| latest.get(k).filter(|o| **o != r.owner))
            {
                let why = format!("a later attachment, {later}, holds its keys");
                plan.skipped.push((who, why));
                continue;
            }
            let Some(made_by) = r.made_by else {
                plan.keys_only.push(who);
                continue;
            };
            match serde_json::from_value::<Request>(made_by) {
                Ok(req) if req.feature() == Some(r.feature.as_str()) => {
                    plan.replays.push((r.feature, r.owner, req));
                }
                Ok(_) => plan
                    .skipped
                    .push((who, "it names another feature's ADD".into())),
                Err(e) => plan.skipped.push((who, format!("unreadable ADD: {e}"))),
            }
        }
        plan
    }

    /// Into `tx`: the skeletons and networks' structures whole, then every
    /// replay whose plan could be made whole (a failed one is reported and
    /// leaves nothing in `tx`).
    fn apply(&self, nft: &mut Nft, tx: &mut Tx) -> Result<Repaired> {
        let features: BTreeSet<&str> = self.replays.iter().map(|(f, _, _)| f.as_str()).collect();
        for s in SKELETONS.iter().filter(|s| features.contains(s.name)) {
            schema::ensure_whole(nft, tx, s)?;
        }
        let mut networks = BTreeMap::new();
        for (_, _, req) in &self.replays {
            for d in req.dispatches() {
                networks.entry(d.set.name.to_string()).or_insert(d);
            }
        }
        for d in networks.values() {
            super::dispatch::ensure_whole(nft, tx, d)?;
        }
        let owners: BTreeSet<&str> = self.replays.iter().map(|(_, o, _)| o.as_str()).collect();
        let mut done = Repaired {
            attachments: owners.len(),
            keys_only: self.keys_only.clone(),
            skipped: self.skipped.clone(),
            ..Repaired::default()
        };
        for (feature, owner, req) in &self.replays {
            let before = tx.mark();
            let planned = tx.len();
            match req.replay(nft, tx) {
                Some(Ok(())) if tx.len() > planned => done.restored.push(owner.clone()),
                Some(Err(e)) => {
                    tx.rewind(before);
                    done.skipped
                        .push((format!("{owner} ({feature})"), e.message));
                }
                _ => {}
            }
        }
        done.restored.sort();
        done.restored.dedup();
        done.changes = tx.len();
        Ok(done)
    }
}

/// The skeletons a repair checks whole. The firewall plugin's is left to its
/// ADDs' own check: it is only used where iptables has no FORWARD chain.
static SKELETONS: [&Skeleton; 3] = [&schema::PORTMAP, &schema::MASQ, &schema::MACSPOOF];

/// Of every recorded key, the owner of the latest record holding it
/// (`records` oldest first).
fn latest_holders(records: &[Stored]) -> BTreeMap<(String, String), String> {
    let mut latest = BTreeMap::new();
    for r in records {
        for k in &r.keys {
            latest.insert(k.clone(), r.owner.clone());
        }
    }
    latest
}

#[cfg(test)]
#[path = "repair_tests.rs"]
mod tests;
