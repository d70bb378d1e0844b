//! The snapshot: the whole state of a network as of a journal generation.
//!
//! Version 2 (written now) is one header line `ipamd-snapshot v2 crc32=XXXXXXXX len=N\n`
//! followed by N bytes of JSON whose CRC-32 is XXXXXXXX, so a flipped bit or a cut file is
//! recognized instead of being read as other leases. Version 1 (plain JSON, no header) is
//! still read, as stores written before version 2 have it.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Read;
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::journal::Holder;
use crate::log::Level;
use crate::{log_at, Error, ErrorKind};

pub(crate) const VERSION: u32 = 2;
pub(crate) const PREFIX: &[u8] = b"ipamd-snapshot ";
/// The header line is far shorter; a longer one is not a header.
const MAX_HEADER: usize = 128;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub version: u32,
    pub generation: u64,
    pub holders: Vec<Holder>,
    /// Last allocated address per range-set index (host-local's `last_reserved_ip.N`).
    pub last: BTreeMap<u32, IpAddr>,
}

/// Why a snapshot cannot be used.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The bytes are not what was written (checksum, length or syntax). `json` is what the
    /// JSON part still parses to, if anything: fsck's best guess, never used by the store.
    Damaged {
        reason: String,
        json: Option<Box<Snapshot>>,
    },
    /// Written by a newer version of ipamd.
    Unsupported(String),
}

pub(crate) fn encode(snap: &Snapshot) -> Result<Vec<u8>, Error> {
    let json = serde_json::to_vec(snap)
        .map_err(|e| Error::internal(format!("cannot encode snapshot: {e}")))?;
    Ok(with_header(&json))
}

/// `json` under the header of this version, with its checksum and length.
pub(crate) fn with_header(json: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "ipamd-snapshot v{VERSION} crc32={:08x} len={}\n",
        crc32fast::hash(json),
        json.len()
    )
    .into_bytes();
    out.extend_from_slice(json);
    out
}

/// What a version 2 header line says: the JSON's checksum and length, and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub crc: u32,
    pub len: u64,
    pub json_at: u64,
}

/// The version 2 header line at the start of `bytes` (only its first [`MAX_HEADER`] bytes
/// are looked at), or None when there is none. Read as strictly as [`decode`] reads it.
pub(crate) fn head(bytes: &[u8]) -> Option<Head> {
    let nl = bytes
        .strip_prefix(PREFIX)?
        .iter()
        .take(MAX_HEADER)
        .position(|b| *b == b'\n')?
        + PREFIX.len();
    let header = std::str::from_utf8(&bytes[PREFIX.len()..nl]).ok()?;
    let mut fields = header.split(' ');
    if fields.next() != Some("v2") {
        return None;
    }
    let crc = fields
        .next()?
        .strip_prefix("crc32=")
        .filter(|c| c.len() == 8 && c.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .and_then(|c| u32::from_str_radix(c, 16).ok())?;
    let len = fields
        .next()?
        .strip_prefix("len=")
        .filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|l| l.parse::<u64>().ok())?;
    if fields.next().is_some() {
        return None;
    }
    Some(Head {
        crc,
        len,
        json_at: nl as u64 + 1,
    })
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Snapshot, Fault> {
    let damaged = |reason: String, json: &[u8]| Fault::Damaged {
        reason,
        json: serde_json::from_slice(json).ok().map(Box::new),
    };
    if !bytes.starts_with(PREFIX) {
        let snap: Snapshot = serde_json::from_slice(bytes)
            .map_err(|e| damaged(format!("neither a version 2 header nor JSON: {e}"), &[]))?;
        return match snap.version {
            1 => Ok(snap),
            2 => Err(damaged(
                "a version 2 snapshot without its checksum header".into(),
                bytes,
            )),
            v => Err(Fault::Unsupported(format!("unsupported version {v}"))),
        };
    }
    let Some(nl) = bytes.iter().take(MAX_HEADER).position(|b| *b == b'\n') else {
        return Err(damaged("the header line is cut or garbled".into(), &[]));
    };
    let header = String::from_utf8_lossy(&bytes[PREFIX.len()..nl]);
    let json = &bytes[nl + 1..];
    let mut fields = header.split(' ');
    match fields.next() {
        Some("v2") => {}
        Some(v) if v.strip_prefix('v').and_then(|n| n.parse::<u32>().ok()) > Some(VERSION) => {
            return Err(Fault::Unsupported(format!("unsupported version {v}")));
        }
        _ => return Err(damaged(format!("bad header {header:?}"), json)),
    }
    // Exactly as written (8 lower-case hex digits, plain decimal): a flipped bit that
    // turns `a` into `A` must not read as the same number.
    let crc = fields
        .next()
        .and_then(|f| f.strip_prefix("crc32="))
        .filter(|c| c.len() == 8 && c.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .and_then(|c| u32::from_str_radix(c, 16).ok());
    let len = fields
        .next()
        .and_then(|f| f.strip_prefix("len="))
        .filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|l| l.parse::<usize>().ok());
    let (Some(crc), Some(len), None) = (crc, len, fields.next()) else {
        return Err(damaged(format!("bad header {header:?}"), json));
    };
    if json.len() != len {
        return Err(damaged(
            format!(
                "the header says {len} bytes of JSON but {} follow",
                json.len()
            ),
            json,
        ));
    }
    let actual = crc32fast::hash(json);
    if actual != crc {
        return Err(damaged(
            format!("checksum mismatch (header {crc:08x}, contents {actual:08x})"),
            json,
        ));
    }
    let snap: Snapshot = serde_json::from_slice(json)
        .map_err(|e| damaged(format!("checksum ok but unreadable: {e}"), &[]))?;
    if snap.version != VERSION {
        return Err(damaged(
            format!("version {} inside a version 2 header", snap.version),
            &[],
        ));
    }
    Ok(snap)
}

/// The raw bytes of the snapshot at `path`; None when there is none.
pub(crate) fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    if std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    crate::files::open_nofollow(OpenOptions::new().read(true), path)?
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
    Ok(Some(bytes))
}

/// The snapshot, if any, and its size in bytes. A damaged one is refused (ErrorKind::Io, so
/// CNI code 5) and left as it is for `cnikit ipamd fsck`: guessing would hand out addresses
/// that are in use.
pub(crate) fn read(path: &Path) -> Result<(Option<Snapshot>, u64), Error> {
    let Some(bytes) = read_bytes(path)? else {
        return Ok((None, 0));
    };
    match decode(&bytes) {
        Ok(snap) => Ok((Some(snap), bytes.len() as u64)),
        Err(Fault::Unsupported(why)) => Err(Error::internal(format!(
            "snapshot {} has an {why}",
            path.display()
        ))),
        Err(Fault::Damaged { reason, .. }) => {
            let msg = format!(
                "snapshot {} is damaged ({reason}); refusing to guess the leases of this network. The file is left as it is: {}",
                path.display(),
                crate::repair_hint::fsck_hint(path.parent().unwrap_or(Path::new(".")))
            );
            log_at!(Level::Error, "{msg}");
            Err(Error::new(ErrorKind::Io, msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(version: u32) -> Snapshot {
        Snapshot {
            version,
            generation: 3,
            holders: Vec::new(),
            last: [(0, "10.0.0.7".parse().unwrap())].into(),
        }
    }

    #[test]
    fn round_trip_and_every_flipped_bit_is_caught() {
        let s = snap(VERSION);
        let bytes = encode(&s).unwrap();
        assert!(bytes.starts_with(b"ipamd-snapshot v2 crc32="));
        assert_eq!(decode(&bytes).unwrap(), s);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                // A flip in the version digit may read as a newer version: refused too.
                assert!(decode(&b).is_err(), "byte {i} bit {bit}");
            }
        }
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn version_1_plain_json_still_loads() {
        let s = snap(1);
        let bytes = serde_json::to_vec(&s).unwrap();
        assert_eq!(decode(&bytes).unwrap(), s);
        // But a version 2 body without its header is not taken on trust.
        let bare = serde_json::to_vec(&snap(2)).unwrap();
        assert!(matches!(decode(&bare), Err(Fault::Damaged { .. })));
        let newer = b"ipamd-snapshot v3 whatever\n{}";
        assert!(matches!(decode(newer), Err(Fault::Unsupported(_))));
    }
}
