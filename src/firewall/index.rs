//! Which keys each attachment holds, per feature: a record per attachment in
//! `/run/cnikit/firewall/<netns id>/<network id>/<owner id>.<feature>` (the
//! netns the table is in: each has a ruleset of its own), written before
//! the ADD's batch is committed. DEL without `prevResult` (0.3.x, a lost
//! result cache) and GC look their keys up there and delete by exact key, so
//! they never read a set whole, whatever the number of pods on the node.
//!
//! A record may name more than the kernel holds (an ADD that failed after
//! writing it, an element another attachment took over since): DEL removes
//! an element only when its owner tag is the attachment's own, so a record
//! can only ever make DEL do less than it may, never more. Records live
//! under `/run` like the ruleset they describe, and go with it at reboot.
//! Entries that have no record (made by a version before the records, or
//! with the directory wiped) are found once: the first DEL or GC of a
//! feature without its `.indexed` marker reads the feature's sets and
//! records every tagged element.
//!
//! Versions. A version 2 record also holds the operation that made it (the
//! ADD's request, `made_by`): what a repair replays to put the attachment's
//! state back after someone else removed it (`repair.rs`). Version 1 records
//! (cnikit 0.2 and the keys found by `ensure_indexed`) hold keys only: DEL
//! and GC go by them as before, a repair cannot rebuild from them. Older
//! builds read version 2 records too (they ignore the fields they do not
//! know), so a downgrade still deletes by record.
//!
//! Turns. A record is written and removed in the same turn (`turn.rs`) as the
//! batch that goes with it: a repair, which reads records in its own turn,
//! sees either the record and its elements' fate decided, or neither.

use super::dispatch;
use super::schema::{SetDef, Skeleton};
use super::store::{owner_of, Nft};
use super::turn;
use super::{Error, ErrorKind, Result};
use crate::hex::{hex, unhex};
use crate::safe_dir::{any_name_at, names_at, open_dir, read_at, unlink_at, write_at};
use ipamd::attachment::fnv1a;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::Path;

const BASE: &str = "/run";
const DIR: [&str; 2] = ["cnikit", "firewall"];
/// This thread's network namespace (a thread may have entered another one
/// than the process's).
const NETNS: &str = "/proc/thread-self/ns/net";
/// A record is a few keys; one this large was not written by us.
const MAX_RECORD: u64 = 64 * 1024;
/// Records in one network's directory a GC reads, at most.
const MAX_RECORDS: usize = 1 << 20;

/// The keys of one attachment in one feature's sets.
pub(crate) type Keys = Vec<(SetDef, Vec<u8>)>;

/// The version this build writes (see the module docs).
const VERSION: u32 = 2;

#[derive(Clone, Serialize, Deserialize)]
struct Record {
    /// Absent in version 1 records.
    #[serde(default = "version_1")]
    v: u32,
    owner: String,
    keys: Vec<RecordKey>,
    /// The feature's ADD operation that made the keys, as its request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    made_by: Option<serde_json::Value>,
    /// When it was last written (ms since the epoch): of two records holding
    /// one key, the later ADD is the one the key belongs to.
    #[serde(default)]
    written_ms: u64,
}

fn version_1() -> u32 {
    1
}

#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
struct RecordKey {
    set: String,
    /// The key's bytes, hex.
    key: String,
}

/// Adds `keys` to `owner`'s record of feature `s` (what it had stays: an
/// ADD again with other keys must not hide the earlier ones from DEL), with
/// `made_by`, the ADD's operation; then runs `add`, the ADD's batch, with
/// the keys recorded before. When that fails, a record the call created goes
/// again: a failed ADD leaves nothing behind. All in one turn.
pub(crate) fn recording(
    s: &Skeleton,
    owner: &str,
    (keys, made_by): (&Keys, &impl Serialize),
    add: impl FnOnce(&Keys) -> Result<()>,
) -> Result<()> {
    let _turn = turn::lock();
    let made_by =
        serde_json::to_value(made_by).map_err(|e| failed("encode", owner, &e.to_string()))?;
    let (earlier, before) = record(s, owner, keys, Some(made_by))?;
    let added = add(&earlier);
    let wanted: Vec<RecordKey> = keys.iter().map(record_key).collect();
    let stale = earlier.iter().any(|k| !wanted.contains(&record_key(k)));
    if added.is_ok() && stale {
        // The batch released what the earlier ADD had and this one has not:
        // the record names this ADD's keys only, or a repair would take them
        // to be this attachment's still (the record stays valid if this
        // fails: it names too much, never too little).
        let _ = keep_only(s, owner, &wanted);
    } else if added.is_err() {
        // The record goes back to what it was (none: it goes): a failed ADD
        // leaves nothing behind, and a repair replays the ADD that was
        // applied. The batch's own error is the one to report.
        let _ = match before {
            Some(rec) => put_back(s, owner, &rec),
            None => forget(s, owner),
        };
    }
    added
}

/// Adds `keys` to `owner`'s record (keeping what made it); the keys it had
/// before (none: no record).
pub(crate) fn remember(s: &Skeleton, owner: &str, keys: &Keys) -> Result<Keys> {
    Ok(record(s, owner, keys, None)?.0)
}

/// Adds `keys` to `owner`'s record, and replaces what made it when
/// `made_by` is given; the keys it had before, and the record as it was.
fn record(
    s: &Skeleton,
    owner: &str,
    keys: &Keys,
    made_by: Option<serde_json::Value>,
) -> Result<(Keys, Option<Record>)> {
    let dir = network_dir(owner, true)?.ok_or_else(|| failed("create", owner, "no directory"))?;
    let name = file_name(s, owner);
    let found = read_record(&dir, &name, owner)?;
    let mut rec = found.clone().unwrap_or(Record {
        v: VERSION,
        owner: owner.to_string(),
        keys: Vec::new(),
        made_by: None,
        written_ms: 0,
    });
    let before = rec.keys.len();
    let earlier = keys_of(s, &rec);
    for k in keys.iter().map(record_key) {
        if !rec.keys.contains(&k) {
            rec.keys.push(k);
        }
    }
    let same_maker = made_by.is_none() || made_by == rec.made_by;
    if rec.keys.len() == before && before > 0 && same_maker {
        return Ok((earlier, found));
    }
    if made_by.is_some() {
        rec.made_by = made_by;
        rec.v = VERSION;
    }
    rec.written_ms = now_ms();
    write(&dir, &name, &rec)?;
    Ok((earlier, found))
}

/// Drops from `owner`'s record of feature `s` the keys not in `keys`.
fn keep_only(s: &Skeleton, owner: &str, wanted: &[RecordKey]) -> Result<()> {
    let dir = network_dir(owner, true)?.ok_or_else(|| failed("create", owner, "no directory"))?;
    let name = file_name(s, owner);
    let Some(mut rec) = read_record(&dir, &name, owner)? else {
        return Ok(());
    };
    rec.keys.retain(|k| wanted.contains(k));
    write(&dir, &name, &rec)
}

/// Writes `rec` back as `owner`'s record of feature `s`.
fn put_back(s: &Skeleton, owner: &str, rec: &Record) -> Result<()> {
    let dir = network_dir(owner, true)?.ok_or_else(|| failed("create", owner, "no directory"))?;
    write(&dir, &file_name(s, owner), rec)
}

fn write(dir: &OwnedFd, name: &str, rec: &Record) -> Result<()> {
    let owner = &rec.owner;
    let bytes = serde_json::to_vec(rec).map_err(|e| failed("encode", owner, &e.to_string()))?;
    write_at(dir, name, &bytes).map_err(|e| failed("write", owner, &e.to_string()))
}

fn record_key((set, key): &(SetDef, Vec<u8>)) -> RecordKey {
    RecordKey {
        set: set.name.to_string(),
        key: hex(key),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The keys `owner` holds in feature `s`, as recorded (none without a record).
pub(crate) fn recorded(s: &Skeleton, owner: &str) -> Result<Keys> {
    let Some(dir) = network_dir(owner, false)? else {
        return Ok(Vec::new());
    };
    let rec = read_record(&dir, &file_name(s, owner), owner)?;
    Ok(rec.map(|r| keys_of(s, &r)).unwrap_or_default())
}

/// Drops `owner`'s record of feature `s` (after its elements went).
pub(crate) fn forget(s: &Skeleton, owner: &str) -> Result<()> {
    match network_dir(owner, false)? {
        Some(dir) => unlink_at(&dir, &file_name(s, owner))
            .map_err(|e| failed("remove", owner, &e.to_string())),
        None => Ok(()),
    }
}

/// Whether the network of `owner` (an owner's tag or a network's tag
/// prefix) has any record of feature `s` left. Stops at the first one, so
/// it costs next to nothing while the network has pods.
pub(crate) fn network_has_records(s: &Skeleton, owner: &str) -> Result<bool> {
    let Some(dir) = network_dir(owner, false)? else {
        return Ok(false);
    };
    let suffix = format!(".{}", s.name);
    any_name_at(&dir, |name| name.ends_with(&suffix))
        .map_err(|e| failed("list", owner, &e.to_string()))
}

/// Every record of feature `s` in network `prefix` (a tag prefix): owner and keys.
pub(crate) fn owners(s: &Skeleton, prefix: &str) -> Result<Vec<(String, Keys)>> {
    let Some(dir) = open(&network_id(prefix), false)? else {
        return Ok(Vec::new());
    };
    let suffix = format!(".{}", s.name);
    let names = names_at(&dir, MAX_RECORDS).map_err(|e| failed("list", prefix, &e.to_string()))?;
    let mut out = Vec::new();
    for name in names.iter().filter(|n| n.ends_with(&suffix)) {
        let bytes =
            read_at(&dir, name, MAX_RECORD).map_err(|e| failed("read", prefix, &e.to_string()))?;
        // A record of another network (a hash collision) or unreadable: not ours to act on.
        let rec = bytes.and_then(|b| serde_json::from_slice::<Record>(&b).ok());
        if let Some(rec) = rec.filter(|r| r.owner.starts_with(prefix)) {
            out.push((rec.owner.clone(), keys_of(s, &rec)));
        }
    }
    Ok(out)
}

/// One record as a repair reads it: of any feature, in any network.
pub(crate) struct Stored {
    /// The feature's skeleton name (the record file's suffix).
    pub feature: String,
    pub owner: String,
    /// (set name, key in hex), as written.
    pub keys: Vec<(String, String)>,
    pub made_by: Option<serde_json::Value>,
    pub written_ms: u64,
}

/// Every record of this network namespace (none: no directory yet).
pub(crate) fn every_record() -> Result<Vec<Stored>> {
    let mut out = Vec::new();
    for network in networks()? {
        let Some(dir) = open(&network, false)? else {
            continue;
        };
        let names =
            names_at(&dir, MAX_RECORDS).map_err(|e| failed("list", &network, &e.to_string()))?;
        for name in names {
            if let Some(stored) = stored_at(&dir, &name)? {
                out.push(stored);
            }
        }
    }
    Ok(out)
}

/// Whether this network namespace has any record: reads up to the first.
pub(crate) fn any_record() -> Result<bool> {
    for network in networks()? {
        let Some(dir) = open(&network, false)? else {
            continue;
        };
        // Temporary files start with a dot; records never do.
        let found = any_name_at(&dir, |name| !name.starts_with('.'))
            .map_err(|e| failed("list", &network, &e.to_string()))?;
        if found {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The names of this network namespace's network directories (none yet:
/// none), opened one at a time by the caller.
fn networks() -> Result<Vec<String>> {
    let netns = netns_id()?;
    let sub = [DIR[0], DIR[1], netns.as_str()];
    let base = "/run/cnikit/firewall";
    let Some(dir) =
        open_dir(Path::new(BASE), &sub, false).map_err(|e| failed("open", base, &e.to_string()))?
    else {
        return Ok(Vec::new());
    };
    let names = names_at(&dir, MAX_RECORDS).map_err(|e| failed("list", base, &e.to_string()))?;
    // Network directories are named by a hash; anything else here (the
    // `.indexed` markers) is not one.
    Ok(names.into_iter().filter(|n| !n.contains('.')).collect())
}

/// The record in file `name` of a network's directory; None for a file that
/// is not one of ours (a temporary file, a hash collision, unreadable).
fn stored_at(dir: &OwnedFd, name: &str) -> Result<Option<Stored>> {
    let Some((hash, feature)) = name.split_once('.') else {
        return Ok(None);
    };
    let bytes = read_at(dir, name, MAX_RECORD).map_err(|e| failed("read", name, &e.to_string()))?;
    let rec = bytes.and_then(|b| serde_json::from_slice::<Record>(&b).ok());
    let Some(rec) = rec.filter(|r| format!("{:016x}", fnv1a(r.owner.as_bytes())) == hash) else {
        return Ok(None);
    };
    Ok(Some(Stored {
        feature: feature.to_string(),
        owner: rec.owner,
        keys: rec.keys.into_iter().map(|k| (k.set, k.key)).collect(),
        made_by: rec.made_by,
        written_ms: rec.written_ms,
    }))
}

/// Records every tagged element of feature `s` once (see the module docs),
/// then marks the feature as recorded.
pub(crate) fn ensure_indexed(nft: &mut Nft, s: &Skeleton) -> Result<()> {
    let marker = format!("{}.indexed", s.name);
    let base = open_base()?;
    if read_at(&base, &marker, 0).is_ok_and(|m| m.is_some()) {
        return Ok(());
    }
    let mut by_owner: BTreeMap<String, Keys> = BTreeMap::new();
    for set in s.sets {
        for e in nft.dump(s.table, set)? {
            // Only attachments have records; an element another owner
            // holds (a bridge's isolation: "bridge br0") stays out.
            if let Some(owner) = owner_of(&e).filter(|o| o.contains('/')) {
                by_owner
                    .entry(owner)
                    .or_default()
                    .push(((*set).clone(), e.key));
            }
        }
    }
    for (owner, keys) in by_owner {
        remember(s, &owner, &keys)?;
    }
    write_at(&base, &marker, b"").map_err(|e| failed("write", &marker, &e.to_string()))
}

/// Where this thread's netns keeps feature `s`'s "recorded once" marker
/// (tests remove it to stand for a node upgraded from before the records).
#[cfg(test)]
pub(crate) fn marker_path(s: &Skeleton) -> String {
    let netns = netns_id().expect("netns");
    format!("{BASE}/{}/{}/{netns}/{}.indexed", DIR[0], DIR[1], s.name)
}

fn keys_of(s: &Skeleton, rec: &Record) -> Keys {
    rec.keys
        .iter()
        .filter_map(|k| {
            let set = match s.sets.iter().find(|set| set.name == k.set) {
                Some(set) => (*set).clone(),
                None => dispatch::set_named(&k.set)?,
            };
            Some((set, unhex(&k.key)?))
        })
        .collect()
}

fn read_record(dir: &OwnedFd, name: &str, owner: &str) -> Result<Option<Record>> {
    let bytes =
        read_at(dir, name, MAX_RECORD).map_err(|e| failed("read", owner, &e.to_string()))?;
    // Another owner under the same name (a hash collision) counts as none.
    Ok(bytes
        .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
        .filter(|r| r.owner == owner))
}

/// The tag's network part: everything up to and with the first `/`.
fn prefix_of(owner: &str) -> &str {
    owner.find('/').map_or(owner, |i| &owner[..=i])
}

fn network_id(prefix: &str) -> String {
    format!("{:016x}", fnv1a(prefix.as_bytes()))
}

fn file_name(s: &Skeleton, owner: &str) -> String {
    format!("{:016x}.{}", fnv1a(owner.as_bytes()), s.name)
}

fn network_dir(owner: &str, create: bool) -> Result<Option<OwnedFd>> {
    open(&network_id(prefix_of(owner)), create)
}

/// The directory of this network namespace's records.
fn open_base() -> Result<OwnedFd> {
    let netns = netns_id()?;
    let sub = [DIR[0], DIR[1], netns.as_str()];
    open_dir(Path::new(BASE), &sub, true)
        .map_err(|e| failed("open", "/run/cnikit/firewall", &e.to_string()))?
        .ok_or_else(|| failed("open", "/run/cnikit/firewall", "no directory"))
}

fn open(network: &str, create: bool) -> Result<Option<OwnedFd>> {
    let netns = netns_id()?;
    let sub = [DIR[0], DIR[1], netns.as_str(), network];
    open_dir(Path::new(BASE), &sub, create).map_err(|e| failed("open", network, &e.to_string()))
}

/// The inode of this thread's network namespace: unique among the live ones.
fn netns_id() -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(NETNS).map_err(|e| failed("find", NETNS, &e.to_string()))?;
    Ok(format!("netns-{}", meta.ino()))
}

fn failed(what: &str, whose: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::Other,
        format!("cannot {what} the firewall record of {whose} under /run/cnikit/firewall: {why}"),
    )
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
