//! `cnikit ipamd fsck`: find damage in the store's files, and salvage what is valid.
//!
//! Checking reads each network's snapshot and journal under the network's lock and says
//! what is wrong, where. Repairing keeps the damaged files (`<name>.damaged-<unix time>`,
//! mode 0600, never deleted), then writes a fresh snapshot of the state replayed from the
//! snapshot and every valid record (before and after the damage) and an empty journal of
//! the next generation, the way compaction does. Records inside a damaged range cannot be
//! recovered: the report says so, since an allocation lost there could be handed out again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::journal::{self, Frame, Record, HEADER_LEN, MAGIC};
use crate::snapshot::{self, Fault};
use crate::store::{self, State, Store, StoreOptions};
use crate::{files, Error};

mod render;

#[derive(Debug, Clone)]
pub struct FsckOptions {
    pub data_dir: PathBuf,
    /// Only this network (default: every network with a store under `data_dir`).
    pub network: Option<String>,
    pub repair: bool,
}

/// What fsck found in one network, and what it did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub network: String,
    pub snapshot: SnapshotReport,
    pub journal: JournalReport,
    /// Addresses held after replaying the snapshot and every valid record.
    pub leases: usize,
    /// Why the store refuses (or would refuse) to load, one line each; empty when healthy.
    pub damage: Vec<String>,
    pub repaired: Option<Repaired>,
    /// fsck itself could not check this network.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SnapshotReport {
    /// "absent", "ok" or "bad".
    pub status: &'static str,
    pub generation: Option<u64>,
    pub version: Option<u32>,
    /// Leases in it (for a bad one: in what its JSON still parses to, if anything).
    pub leases: usize,
    pub problem: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct JournalReport {
    /// "absent", "ok", "damaged", or "stale" (older than the snapshot, which holds its
    /// records already).
    pub status: &'static str,
    pub generation: Option<u64>,
    pub bytes: u64,
    /// Valid records, before and after any damage.
    pub records_ok: usize,
    pub records_after_damage: usize,
    pub damaged: Vec<Range>,
    /// Bytes of a write cut short by a crash: never acknowledged, dropped at the next load.
    pub torn_tail: Option<Range>,
    /// Frames of a batch whose fsync failed: never acknowledged, left out.
    pub unacknowledged: Option<Range>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Range {
    pub offset: u64,
    pub length: u64,
    pub reason: String,
    /// What a damaged record still reads as, if anything: a hint for the operator about
    /// the lease that is lost, never trusted or kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub looks_like: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Repaired {
    /// The damaged files, kept.
    pub kept: Vec<PathBuf>,
    /// Generation of the snapshot and empty journal written.
    pub generation: u64,
}

impl Report {
    pub fn is_damaged(&self) -> bool {
        !self.damage.is_empty()
    }

    /// Damage found and not repaired, or not checked at all.
    pub fn needs_attention(&self) -> bool {
        self.error.is_some() || (self.is_damaged() && self.repaired.is_none())
    }

    fn failed(network: &str, e: &Error) -> Report {
        Report {
            network: network.to_string(),
            snapshot: SnapshotReport::default(),
            journal: JournalReport::default(),
            leases: 0,
            damage: Vec::new(),
            repaired: None,
            error: Some(e.to_string()),
        }
    }
}

/// Check (and with `repair`, salvage) the networks of `opts`.
pub fn run(opts: &FsckOptions) -> Result<Vec<Report>, Error> {
    let names = match &opts.network {
        Some(n) => {
            crate::attachment::check_network(n)?;
            vec![n.clone()]
        }
        None => store::list_networks(&opts.data_dir)?,
    };
    Ok(names
        .iter()
        .map(|n| one(&opts.data_dir, n, opts.repair).unwrap_or_else(|e| Report::failed(n, &e)))
        .collect())
}

fn one(data_dir: &Path, network: &str, repair: bool) -> Result<Report, Error> {
    let opts = StoreOptions {
        boot_id: String::new(),
        ..StoreOptions::default()
    };
    let Some(mut store) = Store::open_existing(data_dir, network, opts)? else {
        return Err(Error::new(
            crate::ErrorKind::NotFound,
            format!("no store for network {network} in {}", data_dir.display()),
        ));
    };
    store.exclusive(|dir| {
        let (mut report, state, files) = examine(dir, network)?;
        if repair && (report.is_damaged() || files.marker) {
            report.repaired = Some(salvage(dir, &state, &files)?);
        }
        Ok(report)
    })
}

/// What was read, for the repair.
struct Read {
    snapshot: Option<Vec<u8>>,
    journal: Option<Vec<u8>>,
    /// The highest generation either file claims.
    generation: u64,
    /// A rewrite after a failed fsync was pending.
    marker: bool,
}

fn examine(dir: &Path, network: &str) -> Result<(Report, State, Read), Error> {
    let mut damage = Vec::new();
    let snap_bytes = snapshot::read_bytes(&dir.join("snapshot"))?;
    let (snap, snap_report) = match snap_bytes.as_deref().map(snapshot::decode) {
        None => (
            None,
            SnapshotReport {
                status: "absent",
                ..Default::default()
            },
        ),
        Some(Ok(s)) => {
            let r = SnapshotReport {
                status: "ok",
                generation: Some(s.generation),
                version: Some(s.version),
                leases: s.holders.iter().map(|h| h.leases.len()).sum(),
                problem: None,
            };
            (Some(s), r)
        }
        Some(Err(Fault::Unsupported(why))) => {
            return Err(Error::internal(format!(
                "{}: {why}; check it with the ipamd version that wrote it",
                dir.join("snapshot").display()
            )))
        }
        Some(Err(Fault::Damaged { reason, json })) => {
            let leases = json
                .as_ref()
                .map_or(0, |s| s.holders.iter().map(|h| h.leases.len()).sum());
            damage.push(match &json {
                Some(_) => format!("snapshot: {reason}; its JSON still parses, so its {leases} lease(s) are kept, but they may not be what was written"),
                None => format!("snapshot: {reason}; the leases recorded only in it are lost"),
            });
            let r = SnapshotReport {
                status: "bad",
                generation: json.as_ref().map(|s| s.generation),
                version: json.as_ref().map(|s| s.version),
                leases,
                problem: Some(reason),
            };
            (json.map(|b| *b), r)
        }
    };
    let snap_gen = snap.as_ref().map_or(0, |s| s.generation);

    let jpath = dir.join("journal");
    let jbytes = match std::fs::symlink_metadata(&jpath) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        _ => {
            let f = files::open_nofollow(std::fs::OpenOptions::new().read(true), &jpath)?;
            Some(journal::read_range(&f, &jpath, 0, None)?)
        }
    };
    let marker = store::read_marker(dir)?;
    let mut jr = JournalReport {
        status: "absent",
        ..Default::default()
    };
    let mut records = Vec::new();
    if let Some(buf) = &jbytes {
        jr.bytes = buf.len() as u64;
        let generation = if buf.len() >= HEADER_LEN as usize && &buf[..8] == MAGIC {
            let mut g = [0u8; 8];
            g.copy_from_slice(&buf[8..16]);
            u64::from_le_bytes(g)
        } else {
            damage.push("journal: bad header (not an ipamd journal, or overwritten); its frames are read as continuing the snapshot".into());
            snap_gen
        };
        jr.generation = Some(generation);
        if generation < snap_gen {
            jr.status = "stale";
        } else {
            if generation > snap_gen {
                damage.push(format!("journal generation {generation} is newer than the snapshot ({}): the snapshot holding the leases from before this journal is missing or old, and those leases are lost", match (&snap, &snap_bytes) {
                    (Some(_), _) => format!("generation {snap_gen}"),
                    (None, Some(_)) => "unreadable".into(),
                    (None, None) => "absent".into(),
                }));
            }
            let skip = marker.as_ref().and_then(|m| m.span).filter(|s| {
                let id = file_id(&jpath);
                id.is_some_and(|(dev, ino)| s.is_in(dev, ino, generation))
            });
            records = scan(buf, skip.map(|s| (s.start, s.end)), &mut jr);
            if !jr.damaged.is_empty() {
                jr.status = "damaged";
                for r in &jr.damaged {
                    let mut line = format!(
                        "journal: {} byte(s) at offset {}: {}",
                        r.length, r.offset, r.reason
                    );
                    if let Some(x) = &r.looks_like {
                        line.push_str(&format!("; it still reads as {x}, which is not trusted and so not kept: check that container"));
                    }
                    damage.push(line);
                }
            } else {
                jr.status = "ok";
            }
        }
    }
    let mut state = snap.map(State::from_snapshot).unwrap_or_default();
    for rec in records {
        state.apply(rec);
    }
    let generation = snap_gen.max(jr.generation.unwrap_or(0));
    let report = Report {
        network: network.to_string(),
        snapshot: snap_report,
        journal: jr,
        leases: state.by_addr.len(),
        damage,
        repaired: None,
        error: None,
    };
    let read = Read {
        snapshot: snap_bytes,
        journal: jbytes,
        generation,
        marker: marker.is_some(),
    };
    Ok((report, state, read))
}

/// Every valid record of the journal `buf`, around damage; fills in `jr`.
fn scan(buf: &[u8], skip: Option<(u64, u64)>, jr: &mut JournalReport) -> Vec<Record> {
    let mut records = Vec::new();
    let mut pos = (HEADER_LEN as usize).min(buf.len());
    while pos < buf.len() {
        if let Some((start, end)) = skip.filter(|(s, e)| (*s..*e).contains(&(pos as u64))) {
            let end = end.min(buf.len() as u64);
            jr.unacknowledged = Some(Range {
                offset: start,
                length: end - start,
                reason: "a batch whose fsync failed (never acknowledged)".into(),
                looks_like: None,
            });
            pos = end as usize;
            continue;
        }
        match journal::frame_at(buf, pos) {
            Frame::Valid { rec, len } => {
                records.push(rec);
                jr.records_ok += 1;
                if !jr.damaged.is_empty() {
                    jr.records_after_damage += 1;
                }
                pos += len;
            }
            Frame::Unreadable { len, why } => {
                jr.damaged.push(Range {
                    offset: pos as u64,
                    length: len as u64,
                    reason: format!(
                        "checksum ok, but not a record this version understands ({why})"
                    ),
                    looks_like: None,
                });
                pos += len;
            }
            Frame::Invalid(reason) => match journal::next_valid(buf, pos + 1) {
                Some(q) => {
                    jr.damaged.push(Range {
                        offset: pos as u64,
                        length: (q - pos) as u64,
                        reason: reason.into(),
                        looks_like: guess(buf.get(pos + 8..q).unwrap_or_default()),
                    });
                    pos = q;
                }
                None => {
                    jr.torn_tail = Some(Range {
                        offset: pos as u64,
                        length: (buf.len() - pos) as u64,
                        reason: reason.into(),
                        looks_like: None,
                    });
                    break;
                }
            },
        }
    }
    records
}

/// What the payload of a damaged frame (`bytes`, up to the next valid frame) still parses
/// to, in words.
fn guess(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().rposition(|b| *b == b'}')?;
    match serde_json::from_slice::<Record>(&bytes[..=end]).ok()? {
        Record::Alloc(h) => {
            let addrs: Vec<String> = h.leases.iter().map(|l| l.addr.addr().to_string()).collect();
            Some(format!(
                "the allocation of {} to {}/{}",
                addrs.join(", "),
                h.cid,
                h.ifname
            ))
        }
        Record::Release { keys } => {
            let keys: Vec<String> = keys.iter().map(|(c, i)| format!("{c}/{i}")).collect();
            Some(format!("the release of {}", keys.join(", ")))
        }
    }
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Keep the damaged files, then write `state` as a fresh snapshot and an empty journal of
/// the next generation. The snapshot goes first: should this stop half-way, the old
/// journal is older than the new snapshot and is skipped at load, as after compaction.
fn salvage(dir: &Path, state: &State, read: &Read) -> Result<Repaired, Error> {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut kept = Vec::new();
    for (name, bytes) in [("journal", &read.journal), ("snapshot", &read.snapshot)] {
        if let Some(bytes) = bytes {
            kept.push(keep(dir, name, ts, bytes)?);
        }
    }
    journal::fsync_dir(dir)?;
    let generation = read.generation + 1;
    let snap = snapshot::encode(&state.to_snapshot(generation))?;
    journal::write_atomic(dir, "snapshot", &snap)?;
    journal::write_atomic(dir, "journal", &journal::header(generation))?;
    store::remove_marker(dir);
    Ok(Repaired { kept, generation })
}

/// Write `bytes` (what was read) to a new `<name>.damaged-<ts>` (with a suffix if taken).
fn keep(dir: &Path, name: &str, ts: u64, bytes: &[u8]) -> Result<PathBuf, Error> {
    for n in 0u32.. {
        let file = match n {
            0 => format!("{name}.damaged-{ts}"),
            n => format!("{name}.damaged-{ts}.{n}"),
        };
        let path = dir.join(file);
        if std::fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        let mut f = files::create_new(&path)?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io(format!("writing {}", path.display()), &e))?;
        return Ok(path);
    }
    unreachable!("u32 suffixes exhausted")
}
