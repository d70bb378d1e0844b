//! The snapshot's index (`index` beside it): lets one in-process ADD, DEL or CHECK look up
//! the few leases it needs instead of reading and parsing the whole snapshot, so a plugin
//! call costs the same with 10 leases in the store as with 10,000 (docs/design.md).
//!
//! It is derived from the snapshot's bytes alone and trusted only as far as it can be
//! checked, so it never has to be durable or current: a missing, stale or damaged index is
//! ignored, and the caller reads the whole snapshot instead and writes a new index.
//! - The header names the snapshot it indexes by the checksum and length of its JSON, as the
//!   snapshot's own header line gives them, and its generation; its own checksum covers it.
//! - Two sorted tables of fixed-size entries, each with its own checksum, are searched by
//!   bisection with one positioned read per probe: attachments by a hash of their key, each
//!   pointing at the holder's JSON inside the snapshot (offset, length, checksum of those
//!   bytes), and addresses, each naming its holder's entry.
//!
//! Layout (little-endian): header `IPAMDX1\n`, generation u64, JSON length u64, JSON crc32
//! u32, key count u32, address count u32, `last` length u32, reserved u32, crc32 u32 (of the
//! 44 bytes before it and the `last` JSON); the `last` JSON (round-robin positions); key
//! entries (hash u64, offset u64, length u32, crc32 of the holder's bytes u32, reserved u32,
//! crc32 of the entry's first 28 bytes u32); address entries (family u32, reserved u32,
//! address u128, key hash u64, key entry index u32, crc32 of the entry's first 36 bytes).

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::net::IpAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::addr::to_u128;
use crate::journal::{Holder, MAX_FRAME};
use crate::log::Level;
use crate::{log_at, snapshot};

/// The index's file name in a network's directory.
pub(crate) const FILE: &str = "index";
const MAGIC: &[u8; 8] = b"IPAMDX1\n";
const HEAD_LEN: usize = 48;
const KEY_ENTRY: usize = 32;
const ADDR_ENTRY: usize = 40;
/// One position per range set: far less than this.
const MAX_LAST: u32 = 64 << 10;

/// FNV-1a of the key: stable across processes and releases, unlike std's hasher.
pub(crate) fn key_hash(cid: &str, ifname: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    // 0xff never occurs in UTF-8, so ("ab", "c") and ("a", "bc") differ.
    for b in cid.bytes().chain([0xff]).chain(ifname.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn family(ip: IpAddr) -> u32 {
    if ip.is_ipv4() {
        4
    } else {
        6
    }
}

/// The index of the snapshot `snap` (its whole file), or None when it cannot be indexed: a
/// version 1 snapshot (no header naming its checksum), or one that holds a key or an
/// address twice (only hand-edited files do; replaying them resolves it, so the caller
/// compacts instead).
pub(crate) fn build(snap: &[u8]) -> Option<Vec<u8>> {
    #[derive(Deserialize)]
    struct Raw<'a> {
        generation: u64,
        #[serde(borrow)]
        holders: Vec<&'a RawValue>,
        last: BTreeMap<u32, IpAddr>,
    }
    let head = snapshot::head(snap)?;
    let json = snap.get(usize::try_from(head.json_at).ok()?..)?;
    if json.len() as u64 != head.len || crc32fast::hash(json) != head.crc {
        return None;
    }
    let raw: Raw<'_> = serde_json::from_slice(json).ok()?;
    let mut keys = Vec::with_capacity(raw.holders.len());
    let mut addrs = Vec::new();
    let mut seen_keys = HashSet::new();
    let mut seen_addrs = HashSet::new();
    for r in &raw.holders {
        let bytes = r.get().as_bytes();
        let h: Holder = serde_json::from_slice(bytes).ok()?;
        if !seen_keys.insert((h.cid.clone(), h.ifname.clone())) {
            return None;
        }
        let offset = head.json_at + (bytes.as_ptr() as usize - json.as_ptr() as usize) as u64;
        let hash = key_hash(&h.cid, &h.ifname);
        for l in &h.leases {
            let a = l.addr.addr();
            if !seen_addrs.insert(a) {
                return None;
            }
            addrs.push((family(a), to_u128(a), hash, keys.len()));
        }
        let len = u32::try_from(bytes.len()).ok()?;
        keys.push((hash, offset, len, crc32fast::hash(bytes)));
    }
    // Key entries sorted by hash; address entries name their holder's sorted position.
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| (keys[i].0, keys[i].1));
    let mut position = vec![0u32; keys.len()];
    for (pos, &i) in order.iter().enumerate() {
        position[i] = u32::try_from(pos).ok()?;
    }
    addrs.sort_by_key(|a| (a.0, a.1));
    let last = serde_json::to_vec(&raw.last).ok()?;

    let mut out = Vec::with_capacity(HEAD_LEN + last.len() + keys.len() * KEY_ENTRY);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&raw.generation.to_le_bytes());
    out.extend_from_slice(&head.len.to_le_bytes());
    out.extend_from_slice(&head.crc.to_le_bytes());
    out.extend_from_slice(&u32::try_from(keys.len()).ok()?.to_le_bytes());
    out.extend_from_slice(&u32::try_from(addrs.len()).ok()?.to_le_bytes());
    out.extend_from_slice(&u32::try_from(last.len()).ok()?.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&out);
    h.update(&last);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(&last);
    for &i in &order {
        let (hash, offset, len, crc) = keys[i];
        let mut e = Vec::with_capacity(KEY_ENTRY);
        e.extend_from_slice(&hash.to_le_bytes());
        e.extend_from_slice(&offset.to_le_bytes());
        e.extend_from_slice(&len.to_le_bytes());
        e.extend_from_slice(&crc.to_le_bytes());
        e.extend_from_slice(&0u32.to_le_bytes());
        seal(&mut out, &e);
    }
    for (fam, addr, hash, holder) in addrs {
        let mut e = Vec::with_capacity(ADDR_ENTRY);
        e.extend_from_slice(&fam.to_le_bytes());
        e.extend_from_slice(&0u32.to_le_bytes());
        e.extend_from_slice(&addr.to_le_bytes());
        e.extend_from_slice(&hash.to_le_bytes());
        e.extend_from_slice(&position[holder].to_le_bytes());
        seal(&mut out, &e);
    }
    Some(out)
}

/// Write the index of `snap`, the snapshot just written in `dir`; false when it cannot be
/// indexed (see [`build`]). A failure to write is only logged: the index is a cache, and
/// the next in-process call that misses it reads the whole snapshot and writes it again.
pub(crate) fn write(dir: &Path, snap: &[u8], network: &str) -> bool {
    let Some(index) = build(snap) else {
        return false;
    };
    if let Err(e) = crate::journal::write_atomic(dir, FILE, &index) {
        log_at!(Level::Warn, "network {network}: index not written: {e}");
    }
    true
}

/// Append `entry` and its checksum.
fn seal(out: &mut Vec<u8>, entry: &[u8]) {
    out.extend_from_slice(entry);
    out.extend_from_slice(&crc32fast::hash(entry).to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// An entry whose checksum holds (`len` bytes, the last four the checksum of the rest).
fn checked(b: &[u8]) -> Option<&[u8]> {
    let body = &b[..b.len() - 4];
    (crc32fast::hash(body) == u32_at(b, b.len() - 4)).then_some(body)
}

/// An index that matched its snapshot when opened. Lookups fail (with the reason, for the
/// log) on anything that does not check out; the caller then reads the whole snapshot.
pub(crate) struct Index {
    file: File,
    snapshot: File,
    /// Generation of the snapshot it indexes.
    pub generation: u64,
    keys: u32,
    addrs: u32,
    keys_at: u64,
    addrs_at: u64,
    /// Round-robin positions as of the snapshot.
    pub last: BTreeMap<u32, IpAddr>,
}

/// Where an address's holder is: its key's hash, and its entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AddrHolder {
    pub hash: u64,
    entry: u32,
}

impl Index {
    /// The index of the snapshot in `dir`, if there is one that matches it. Err says why
    /// it cannot be used (missing, stale, damaged, or a snapshot without a version 2 header).
    pub(crate) fn open(dir: &Path) -> Result<Index, String> {
        let snap_path = dir.join("snapshot");
        let snapshot = crate::files::open_nofollow(OpenOptions::new().read(true), &snap_path)
            .map_err(|e| e.to_string())?;
        let mut first = vec![0u8; 256];
        let n = read_up_to(&snapshot, &mut first, 0)?;
        let head = snapshot::head(&first[..n]).ok_or("the snapshot has no version 2 header")?;
        let snap_len = snapshot.metadata().map_err(|e| e.to_string())?.len();
        if snap_len != head.json_at.saturating_add(head.len) {
            return Err("the snapshot's length is not what its header says".into());
        }
        let path = dir.join(FILE);
        let file = crate::files::open_nofollow(OpenOptions::new().read(true), &path)
            .map_err(|e| e.to_string())?;
        let mut h = [0u8; HEAD_LEN];
        file.read_exact_at(&mut h, 0)
            .map_err(|e| format!("reading its header: {e}"))?;
        if &h[..8] != MAGIC {
            return Err("bad magic".into());
        }
        let (generation, json_len, json_crc) = (u64_at(&h, 8), u64_at(&h, 16), u32_at(&h, 24));
        let (keys, addrs, last_len) = (u32_at(&h, 28), u32_at(&h, 32), u32_at(&h, 36));
        if last_len > MAX_LAST {
            return Err("bad header".into());
        }
        let keys_at = HEAD_LEN as u64 + u64::from(last_len);
        let addrs_at = keys_at + u64::from(keys) * KEY_ENTRY as u64;
        let size = addrs_at + u64::from(addrs) * ADDR_ENTRY as u64;
        if file.metadata().map_err(|e| e.to_string())?.len() != size {
            return Err("its length does not match its header".into());
        }
        let mut last = vec![0u8; last_len as usize];
        file.read_exact_at(&mut last, HEAD_LEN as u64)
            .map_err(|e| format!("reading it: {e}"))?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h[..44]);
        crc.update(&last);
        if crc.finalize() != u32_at(&h, 44) {
            return Err("its header's checksum does not match".into());
        }
        if (json_len, json_crc) != (head.len, head.crc) {
            return Err("it indexes another snapshot (stale)".into());
        }
        let last = serde_json::from_slice(&last).map_err(|e| format!("its positions: {e}"))?;
        Ok(Index {
            file,
            snapshot,
            generation,
            keys,
            addrs,
            keys_at,
            addrs_at,
            last,
        })
    }

    /// How many addresses the snapshot holds.
    pub(crate) fn addr_count(&self) -> usize {
        self.addrs as usize
    }

    fn entry<const N: usize>(&self, at: u64) -> Result<[u8; N], String> {
        let mut b = [0u8; N];
        self.file
            .read_exact_at(&mut b, at)
            .map_err(|e| format!("reading offset {at}: {e}"))?;
        checked(&b).ok_or_else(|| format!("the entry at offset {at} is damaged"))?;
        Ok(b)
    }

    /// Key entry `i`: (hash, offset, length, checksum of the holder's bytes).
    fn key_entry(&self, i: u32) -> Result<(u64, u64, u32, u32), String> {
        let b = self.entry::<KEY_ENTRY>(self.keys_at + u64::from(i) * KEY_ENTRY as u64)?;
        Ok((u64_at(&b, 0), u64_at(&b, 8), u32_at(&b, 16), u32_at(&b, 20)))
    }

    /// Address entry `i`: ((family, address), its holder).
    fn addr_entry(&self, i: u32) -> Result<((u32, u128), AddrHolder), String> {
        let b = self.entry::<ADDR_ENTRY>(self.addrs_at + u64::from(i) * ADDR_ENTRY as u64)?;
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[8..24]);
        let holder = AddrHolder {
            hash: u64_at(&b, 24),
            entry: u32_at(&b, 32),
        };
        Ok(((u32_at(&b, 0), u128::from_le_bytes(a)), holder))
    }

    /// The first of `count` sorted entries whose sort key is not below `target`.
    fn lower_bound<K: Ord>(
        count: u32,
        target: &K,
        key_of: impl Fn(u32) -> Result<K, String>,
    ) -> Result<u32, String> {
        let (mut lo, mut hi) = (0u32, count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if key_of(mid)? < *target {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// The holder of key entry `i`, read from the snapshot and checked against the entry.
    pub(crate) fn holder_at(&self, holder: AddrHolder) -> Result<Holder, String> {
        self.read_holder(holder.entry)
    }

    fn read_holder(&self, i: u32) -> Result<Holder, String> {
        let (_, offset, len, crc) = self.key_entry(i)?;
        if len > MAX_FRAME {
            return Err(format!("entry {i} claims a holder of {len} bytes"));
        }
        let mut b = vec![0u8; len as usize];
        self.snapshot
            .read_exact_at(&mut b, offset)
            .map_err(|e| format!("reading the snapshot at offset {offset}: {e}"))?;
        if crc32fast::hash(&b) != crc {
            return Err(format!(
                "the snapshot's bytes at offset {offset} do not match"
            ));
        }
        serde_json::from_slice(&b).map_err(|e| format!("the holder at offset {offset}: {e}"))
    }

    /// The snapshot's holder of `key`, if it has one.
    pub(crate) fn holder(&self, cid: &str, ifname: &str) -> Result<Option<Holder>, String> {
        let hash = key_hash(cid, ifname);
        let mut i = Self::lower_bound(self.keys, &hash, |i| Ok(self.key_entry(i)?.0))?;
        while i < self.keys && self.key_entry(i)?.0 == hash {
            let h = self.read_holder(i)?;
            if h.cid == cid && h.ifname == ifname {
                return Ok(Some(h));
            }
            i += 1;
        }
        Ok(None)
    }

    /// Who holds `ip` in the snapshot, if anyone.
    pub(crate) fn addr(&self, ip: IpAddr) -> Result<Option<AddrHolder>, String> {
        let target = (family(ip), to_u128(ip));
        let i = Self::lower_bound(self.addrs, &target, |i| Ok(self.addr_entry(i)?.0))?;
        if i == self.addrs {
            return Ok(None);
        }
        let (found, holder) = self.addr_entry(i)?;
        Ok((found == target).then_some(holder))
    }
}

/// Read into `buf` from `at` until it is full or the file ends; the count read.
fn read_up_to(f: &File, buf: &mut [u8], at: u64) -> Result<usize, String> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading the snapshot: {e}")),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::StoredLease;
    use crate::snapshot::Snapshot;

    fn snapshot(n: usize) -> Vec<u8> {
        let holders = (0..n)
            .map(|i| Holder {
                cid: format!("c{i}"),
                ifname: "eth0".into(),
                boot: "b".into(),
                ts: 1,
                leases: vec![StoredLease {
                    addr: format!("10.9.{}.{}/16", i / 250, i % 250 + 2)
                        .parse()
                        .unwrap(),
                    gw: None,
                    rs: 0,
                }],
            })
            .collect();
        snapshot::encode(&Snapshot {
            version: snapshot::VERSION,
            generation: 4,
            holders,
            last: [(0, "10.9.0.9".parse().unwrap())].into(),
        })
        .unwrap()
    }

    #[test]
    fn every_key_and_address_is_found_and_nothing_else() {
        let d = crate::testutil::temp_dir("index");
        let snap = snapshot(600);
        std::fs::write(d.path().join("snapshot"), &snap).unwrap();
        std::fs::write(d.path().join(FILE), build(&snap).unwrap()).unwrap();
        let index = Index::open(d.path()).unwrap();
        assert_eq!((index.generation, index.addr_count()), (4, 600));
        for i in (0..600).step_by(7) {
            let h = index.holder(&format!("c{i}"), "eth0").unwrap().unwrap();
            let a = h.leases[0].addr.addr();
            let at = index.addr(a).unwrap().unwrap();
            assert_eq!(index.holder_at(at).unwrap(), h);
            assert!(index.holder(&format!("c{i}"), "eth1").unwrap().is_none());
        }
        assert!(index.addr("10.9.3.1".parse().unwrap()).unwrap().is_none());
        assert!(index
            .addr("::ffff:10.9.0.2".parse().unwrap())
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_cut_index_is_refused_at_every_length() {
        let d = crate::testutil::temp_dir("index-cut");
        let snap = snapshot(20);
        std::fs::write(d.path().join("snapshot"), &snap).unwrap();
        let whole = build(&snap).unwrap();
        for cut in 0..whole.len() {
            std::fs::write(d.path().join(FILE), &whole[..cut]).unwrap();
            assert!(Index::open(d.path()).is_err(), "cut at {cut}");
        }
        // Nor is a whole one for another snapshot.
        std::fs::write(d.path().join(FILE), build(&snapshot(21)).unwrap()).unwrap();
        assert!(Index::open(d.path()).is_err());
        // A version 1 snapshot cannot be indexed.
        let v1 = serde_json::to_vec(&snapshot::decode(&snap).unwrap()).unwrap();
        assert!(build(&v1).is_none());
    }
}
