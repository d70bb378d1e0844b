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

use super::dispatch;
use super::schema::{SetDef, Skeleton};
use super::store::{owner_of, Nft};
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

#[derive(Serialize, Deserialize)]
struct Record {
    owner: String,
    keys: Vec<RecordKey>,
}

#[derive(Serialize, Deserialize, PartialEq, Eq)]
struct RecordKey {
    set: String,
    /// The key's bytes, hex.
    key: String,
}

/// Adds `keys` to `owner`'s record of feature `s` (what it had stays: an
/// ADD again with other keys must not hide the earlier ones from DEL), then
/// runs `add`, the ADD's batch, with the keys recorded before. When that
/// fails, a record the call created goes again: a failed ADD leaves nothing
/// behind.
pub(crate) fn recording(
    s: &Skeleton,
    owner: &str,
    keys: &Keys,
    add: impl FnOnce(&Keys) -> Result<()>,
) -> Result<()> {
    let earlier = remember(s, owner, keys)?;
    let added = add(&earlier);
    if added.is_err() && earlier.is_empty() {
        // The batch's own error is the one to report.
        let _ = forget(s, owner);
    }
    added
}

/// Adds `keys` to `owner`'s record; the keys it had before (none: no record).
pub(crate) fn remember(s: &Skeleton, owner: &str, keys: &Keys) -> Result<Keys> {
    let dir = network_dir(owner, true)?.ok_or_else(|| failed("create", owner, "no directory"))?;
    let name = file_name(s, owner);
    let mut rec = read_record(&dir, &name, owner)?.unwrap_or(Record {
        owner: owner.to_string(),
        keys: Vec::new(),
    });
    let before = rec.keys.len();
    let earlier = keys_of(s, &rec);
    for (set, key) in keys {
        let k = RecordKey {
            set: set.name.to_string(),
            key: hex(key),
        };
        if !rec.keys.contains(&k) {
            rec.keys.push(k);
        }
    }
    if rec.keys.len() == before && before > 0 {
        return Ok(earlier);
    }
    let bytes = serde_json::to_vec(&rec).map_err(|e| failed("encode", owner, &e.to_string()))?;
    write_at(&dir, &name, &bytes).map_err(|e| failed("write", owner, &e.to_string()))?;
    Ok(earlier)
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
