//! On-disk format of one network's lease state: a snapshot plus a journal of changes.
//!
//! Journal = 16-byte header (`IPAMDJ1\n` + generation, u64 LE) followed by frames
//! `[len u32 LE][crc32(len ‖ payload) u32 LE][payload: JSON record]`. A frame is the commit
//! point of a change: it is appended and fsync'd before the answer goes back, so a frame cut
//! short by a crash (bad length or checksum) was never acknowledged and is dropped at load.
//!
//! Snapshot = JSON of the whole state with the generation it covers. Compaction writes a
//! snapshot of generation G+1 (temp, fsync, rename, fsync dir), then replaces the journal by
//! an empty one of generation G+1 the same way. A journal whose generation is older than the
//! snapshot's was folded into it already (crash between the two renames) and is skipped,
//! which is what makes replaying after any crash give the same state.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::Error;

pub(crate) const MAGIC: &[u8; 8] = b"IPAMDJ1\n";
pub(crate) const HEADER_LEN: u64 = 16;
/// Frames are small (one attachment); anything claiming more is garbage from a torn write.
const MAX_FRAME: u32 = 1 << 20;

/// Number of fsync/fdatasync calls made by this process on store files (for /metrics).
pub(crate) static FSYNCS: AtomicU64 = AtomicU64::new(0);

/// The leases of one attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub cid: String,
    pub ifname: String,
    /// Boot ID of the machine when the lease was made (reclaim after reboot).
    pub boot: String,
    pub ts: u64,
    pub leases: Vec<StoredLease>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredLease {
    pub addr: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Index of the range set it came from (round-robin position is kept per index).
    pub rs: u32,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Record {
    Alloc(Holder),
    Release { keys: Vec<(String, String)> },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub version: u32,
    pub generation: u64,
    pub holders: Vec<Holder>,
    /// Last allocated address per range-set index (host-local's `last_reserved_ip.N`).
    pub last: BTreeMap<u32, IpAddr>,
}

pub(crate) fn encode(rec: &Record) -> Result<Vec<u8>, Error> {
    let payload = serde_json::to_vec(rec)
        .map_err(|e| Error::internal(format!("cannot encode journal record: {e}")))?;
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_FRAME)
        .ok_or_else(|| Error::internal("journal record too large"))?;
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(&payload);
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// What reading the journal from some offset found.
#[derive(Debug)]
pub(crate) struct ReadOutcome {
    pub records: Vec<Record>,
    /// Offset just past the last complete record.
    pub end: u64,
    /// Bytes after `end` that do not form a complete record (a torn tail).
    pub torn_bytes: u64,
}

/// Decode frames from `buf`, which starts at file offset `base`.
pub(crate) fn decode(buf: &[u8], base: u64) -> Result<ReadOutcome, Error> {
    let mut records = Vec::new();
    let mut pos = 0usize;
    while buf.len() - pos >= 8 {
        let len = u32::from_le_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]]);
        let crc = u32::from_le_bytes([buf[pos + 4], buf[pos + 5], buf[pos + 6], buf[pos + 7]]);
        if len > MAX_FRAME || buf.len() - pos - 8 < len as usize {
            break;
        }
        let payload = &buf[pos + 8..pos + 8 + len as usize];
        let mut h = crc32fast::Hasher::new();
        h.update(&len.to_le_bytes());
        h.update(payload);
        if h.finalize() != crc {
            break;
        }
        // A frame with a valid checksum that does not parse is not a torn write: refuse to
        // guess (e.g. a journal written by a newer version) rather than drop acknowledged data.
        let rec: Record = serde_json::from_slice(payload).map_err(|e| {
            Error::internal(format!(
                "journal record at offset {} is unreadable: {e}",
                base + pos as u64
            ))
        })?;
        records.push(rec);
        pos += 8 + len as usize;
    }
    Ok(ReadOutcome {
        records,
        end: base + pos as u64,
        torn_bytes: (buf.len() - pos) as u64,
    })
}

/// Read the header's generation; the journal is only ever created whole (temp + rename), so a
/// bad header is corruption, not a torn write.
pub(crate) fn read_header(mut f: &File, path: &Path) -> Result<u64, Error> {
    let mut h = [0u8; HEADER_LEN as usize];
    f.seek(SeekFrom::Start(0))
        .and_then(|_| f.read_exact(&mut h))
        .map_err(|e| Error::io(format!("reading journal header of {}", path.display()), &e))?;
    if &h[..8] != MAGIC {
        return Err(Error::internal(format!(
            "{} is not an ipamd journal (bad header)",
            path.display()
        )));
    }
    let mut g = [0u8; 8];
    g.copy_from_slice(&h[8..]);
    Ok(u64::from_le_bytes(g))
}

/// Read and decode everything from `offset` to the end of the file.
pub(crate) fn read_from(mut f: &File, path: &Path, offset: u64) -> Result<ReadOutcome, Error> {
    let mut buf = Vec::new();
    f.seek(SeekFrom::Start(offset))
        .and_then(|_| f.read_to_end(&mut buf))
        .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
    decode(&buf, offset)
}

pub(crate) fn fsync_file(f: &File, path: &Path) -> Result<(), Error> {
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    f.sync_data()
        .map_err(|e| Error::io(format!("fsync {}", path.display()), &e))
}

/// fsync a directory so a rename or a new entry in it survives a crash.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), Error> {
    let d = crate::files::open_dir(dir)?;
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    d.sync_all()
        .map_err(|e| Error::io(format!("fsync {}", dir.display()), &e))
}

/// Write `bytes` to `dir/name` atomically and durably: temp file, fsync, rename, fsync dir.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), Error> {
    let tmp = dir.join(format!("{name}.tmp"));
    let dst = dir.join(name);
    // A temp file left by a crash, or anything planted in its place, goes first: the new
    // one is created exclusively, so it can never be a link to somewhere else.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("removing {}", tmp.display()), &e)),
    }
    let mut f = crate::files::create_new(&tmp)?;
    f.write_all(bytes)
        .map_err(|e| Error::io(format!("writing {}", tmp.display()), &e))?;
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    f.sync_all()
        .map_err(|e| Error::io(format!("fsync {}", tmp.display()), &e))?;
    std::fs::rename(&tmp, &dst).map_err(|e| {
        Error::io(
            format!("renaming {} to {}", tmp.display(), dst.display()),
            &e,
        )
    })?;
    fsync_dir(dir)
}

pub(crate) fn header(generation: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN as usize);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&generation.to_le_bytes());
    h
}

/// The snapshot, if any, and its size in bytes.
pub(crate) fn read_snapshot(path: &Path) -> Result<(Option<Snapshot>, u64), Error> {
    if std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok((None, 0));
    }
    let mut bytes = Vec::new();
    crate::files::open_nofollow(OpenOptions::new().read(true), path)?
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
    let snap: Snapshot = serde_json::from_slice(&bytes)
        .map_err(|e| Error::internal(format!("snapshot {} is unreadable: {e}", path.display())))?;
    if snap.version != 1 {
        return Err(Error::internal(format!(
            "snapshot {} has unsupported version {}",
            path.display(),
            snap.version
        )));
    }
    Ok((Some(snap), bytes.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(cid: &str, addr: &str) -> Record {
        Record::Alloc(Holder {
            cid: cid.into(),
            ifname: "eth0".into(),
            boot: "b".into(),
            ts: 1,
            leases: vec![StoredLease {
                addr: addr.parse().unwrap(),
                gw: None,
                rs: 0,
            }],
        })
    }

    #[test]
    fn round_trip_and_torn_tail_at_every_offset() {
        let recs = vec![
            alloc("a", "10.0.0.2/24"),
            Record::Release {
                keys: vec![("a".into(), "eth0".into())],
            },
            alloc("b", "10.0.0.3/24"),
        ];
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        for r in &recs {
            buf.extend(encode(r).unwrap());
            ends.push(buf.len());
        }
        let out = decode(&buf, 0).unwrap();
        assert_eq!(out.records, recs);
        assert_eq!(out.torn_bytes, 0);
        let last_start = ends[1];
        for cut in last_start..buf.len() {
            let out = decode(&buf[..cut], 0).unwrap();
            assert_eq!(out.records, recs[..2].to_vec(), "cut at {cut}");
            assert_eq!(out.end, last_start as u64);
            assert_eq!(out.torn_bytes, (cut - last_start) as u64);
        }
    }

    #[test]
    fn flipped_bit_is_detected() {
        let mut buf = encode(&alloc("a", "10.0.0.2/24")).unwrap();
        let n = buf.len();
        buf[n - 3] ^= 0x10;
        let out = decode(&buf, 0).unwrap();
        assert!(out.records.is_empty());
        assert_eq!(out.torn_bytes, n as u64);
    }
}
