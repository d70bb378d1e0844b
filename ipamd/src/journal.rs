//! On-disk format of one network's lease state: a snapshot plus a journal of changes.
//!
//! Journal = 16-byte header (`IPAMDJ1\n` + generation, u64 LE) followed by frames
//! `[len u32 LE][crc32(len ‖ payload) u32 LE][payload: JSON record]`. A frame is the commit
//! point of a change: it is appended and fsync'd before the answer goes back, so a frame cut
//! short by a crash (bad length or checksum, nothing valid after it) was never acknowledged
//! and is dropped at load. A bad frame *followed by a valid one* is not a crash mid-write
//! (appends are sequential): it is damage to acknowledged records, and the store refuses to
//! load rather than drop everything after it (see [`ReadOutcome::damage`]).
//!
//! Snapshot = the whole state with the generation it covers (see [`crate::snapshot`]).
//! Compaction writes a snapshot of generation G+1 (temp, fsync, rename, fsync dir), then
//! replaces the journal by an empty one of generation G+1 the same way. A journal whose
//! generation is older than the snapshot's was folded into it already (crash between the
//! two renames) and is skipped, which is what makes replaying after any crash give the
//! same state.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::fault::{self, Call};
use crate::Error;

pub(crate) const MAGIC: &[u8; 8] = b"IPAMDJ1\n";
pub(crate) const HEADER_LEN: u64 = 16;
/// Frames are small (one attachment); anything claiming more is garbage.
pub(crate) const MAX_FRAME: u32 = 1 << 20;

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

pub(crate) fn encode(rec: &Record) -> Result<Vec<u8>, Error> {
    let payload = serde_json::to_vec(rec)
        .map_err(|e| Error::internal(format!("cannot encode journal record: {e}")))?;
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_FRAME)
        .ok_or_else(|| Error::internal("journal record too large"))?;
    Ok(frame(len, &payload))
}

/// One frame: `len` (the payload's length, which the caller bounds), the checksum of
/// length and payload, the payload.
pub(crate) fn frame(len: u32, payload: &[u8]) -> Vec<u8> {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(payload);
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// What reading the journal from some offset found.
#[derive(Debug)]
pub(crate) struct ReadOutcome {
    pub records: Vec<Record>,
    /// Offset just past the last complete record.
    pub end: u64,
    /// Bytes after `end` that do not form a complete record (a torn tail, or damage).
    pub torn_bytes: u64,
    /// Set when the bad bytes at `end` are followed by a valid frame: damage, not a torn
    /// tail. Nothing after `end` is in `records` then.
    pub damage: Option<Damage>,
}

/// A bad frame followed by a valid one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Damage {
    /// File offset of the bad frame.
    pub at: u64,
    /// File offset of the first valid frame after it.
    pub next_valid: u64,
}

/// What the bytes at one offset hold.
#[derive(Debug)]
pub(crate) enum Frame {
    /// A whole frame with a good checksum and a record we understand; `len` includes the
    /// 8-byte frame header.
    Valid { rec: Record, len: usize },
    /// A good checksum over something that is not a record of this version (e.g. written by
    /// a newer one).
    Unreadable { len: usize, why: String },
    /// No frame here: too short, a length out of bounds, or a checksum mismatch.
    Invalid(&'static str),
}

/// Classify the bytes at `buf[pos..]`.
pub(crate) fn frame_at(buf: &[u8], pos: usize) -> Frame {
    let rest = &buf[pos.min(buf.len())..];
    if rest.len() < 8 {
        return Frame::Invalid("incomplete frame header");
    }
    let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
    let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    if len > MAX_FRAME {
        return Frame::Invalid("length out of bounds");
    }
    if rest.len() - 8 < len as usize {
        return Frame::Invalid("length past the end of the file");
    }
    let payload = &rest[8..8 + len as usize];
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(payload);
    if h.finalize() != crc {
        return Frame::Invalid("checksum mismatch");
    }
    let len = 8 + len as usize;
    match serde_json::from_slice(payload) {
        Ok(rec) => Frame::Valid { rec, len },
        Err(e) => Frame::Unreadable {
            len,
            why: e.to_string(),
        },
    }
}

/// The offset of the first frame at or after `from` with a good checksum: proof that the
/// bytes before it are not the torn tail of the last write.
pub(crate) fn next_valid(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len().saturating_sub(8)).find(|&q| {
        let len = u32::from_le_bytes([buf[q], buf[q + 1], buf[q + 2], buf[q + 3]]) as usize;
        // Cheap test before the checksum: every payload written is a JSON object, with
        // nothing around it.
        let end = q + 8 + len;
        len >= 2
            && len <= MAX_FRAME as usize
            && end <= buf.len()
            && buf[q + 8] == b'{'
            && buf[end - 1] == b'}'
            && !matches!(frame_at(buf, q), Frame::Invalid(_))
    })
}

/// Decode frames from `buf`, which starts at file offset `base`.
pub(crate) fn decode(buf: &[u8], base: u64) -> Result<ReadOutcome, Error> {
    let mut records = Vec::new();
    let mut pos = 0usize;
    let mut damage = None;
    while pos < buf.len() {
        match frame_at(buf, pos) {
            Frame::Valid { rec, len } => {
                records.push(rec);
                pos += len;
            }
            // A frame with a valid checksum that does not parse is not a torn write: refuse
            // to guess (e.g. a journal written by a newer version) rather than drop
            // acknowledged data.
            Frame::Unreadable { why, .. } => {
                return Err(Error::internal(format!(
                    "journal record at offset {} is unreadable: {why}",
                    base + pos as u64
                )))
            }
            Frame::Invalid(_) => {
                damage = next_valid(buf, pos + 1).map(|q| Damage {
                    at: base + pos as u64,
                    next_valid: base + q as u64,
                });
                break;
            }
        }
    }
    Ok(ReadOutcome {
        records,
        end: base + pos as u64,
        torn_bytes: (buf.len() - pos) as u64,
        damage,
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
            "{} is not an ipamd journal (bad header); {}",
            path.display(),
            crate::repair_hint::fsck_hint(path.parent().unwrap_or(Path::new(".")))
        )));
    }
    let mut g = [0u8; 8];
    g.copy_from_slice(&h[8..]);
    Ok(u64::from_le_bytes(g))
}

/// Read and decode everything from `offset` to the end of the file.
pub(crate) fn read_from(f: &File, path: &Path, offset: u64) -> Result<ReadOutcome, Error> {
    decode(&read_range(f, path, offset, None)?, offset)
}

/// The bytes from `offset` to `end` (or to the end of the file).
pub(crate) fn read_range(
    mut f: &File,
    path: &Path,
    offset: u64,
    end: Option<u64>,
) -> Result<Vec<u8>, Error> {
    let mut buf = Vec::new();
    f.seek(SeekFrom::Start(offset))
        .and_then(|_| match end {
            Some(e) => f.take(e.saturating_sub(offset)).read_to_end(&mut buf),
            None => f.read_to_end(&mut buf),
        })
        .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
    Ok(buf)
}

/// Append `bytes` at the end of the journal (opened for appending).
pub(crate) fn append(mut f: &File, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    fault::check(path, Call::Write)?;
    f.write_all(bytes)
}

pub(crate) fn fsync_file(f: &File, path: &Path) -> Result<(), Error> {
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    fault::check(path, Call::Fsync)
        .and_then(|()| f.sync_data())
        .map_err(|e| Error::io(format!("fsync {}", path.display()), &e))
}

/// fsync a directory so a rename or a new entry in it survives a crash.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), Error> {
    let d = crate::files::open_dir(dir)?;
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    fault::check(dir, Call::Fsync)
        .and_then(|()| d.sync_all())
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
    fault::check(&tmp, Call::Write)
        .and_then(|()| f.write_all(bytes))
        .map_err(|e| Error::io(format!("writing {}", tmp.display()), &e))?;
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    fault::check(&tmp, Call::Fsync)
        .and_then(|()| f.sync_all())
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

    #[test]
    fn bad_frame_followed_by_a_valid_one_is_damage_not_a_torn_tail() {
        let recs: Vec<Record> = (0..3)
            .map(|i| alloc(&format!("c{i}"), &format!("10.0.0.{}/24", i + 2)))
            .collect();
        let mut buf = Vec::new();
        let mut starts = Vec::new();
        for r in &recs {
            starts.push(buf.len());
            buf.extend(encode(r).unwrap());
        }
        let base = HEADER_LEN;
        // Every single-bit flip anywhere in the middle frame.
        for i in starts[1]..starts[2] {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[i] ^= 1 << bit;
                let out = decode(&b, base).unwrap();
                assert_eq!(out.records, recs[..1].to_vec(), "byte {i} bit {bit}");
                let d = out.damage.expect("damage, not a torn tail");
                assert_eq!(d.at, base + starts[1] as u64);
                assert_eq!(d.next_valid, base + starts[2] as u64);
            }
        }
        // A huge length in the middle frame.
        let mut b = buf.clone();
        b[starts[1]..starts[1] + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let d = decode(&b, base).unwrap().damage.unwrap();
        assert_eq!(d.next_valid, base + starts[2] as u64);
        // The same damage in the last frame has nothing valid after it: a torn tail.
        let mut b = buf.clone();
        b[starts[2] + 10] ^= 0x01;
        let out = decode(&b, base).unwrap();
        assert!(out.damage.is_none());
        assert_eq!(out.torn_bytes, (buf.len() - starts[2]) as u64);
    }
}
