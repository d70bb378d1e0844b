//! The result cache: one JSON file per attachment holding the ADD result and
//! what CHECK/DEL/GC need later, in libcni's `cniCacheV1` layout, so entries
//! written by libcni runtimes (cnitool, containerd) and by us are readable by
//! both.

use crate::cni::Attachment;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

const KIND: &str = "cniCacheV1";

/// One cached attachment (`cachedInfo` in libcni).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub kind: String,
    pub container_id: String,
    /// The network configuration list, base64 (a Go `[]byte`).
    #[serde(with = "base64_bytes")]
    pub config: Vec<u8>,
    pub if_name: String,
    pub network_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cni_args: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub capability_args: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

impl Entry {
    pub fn new(key: &Attachment) -> Entry {
        Entry {
            kind: KIND.into(),
            container_id: key.container_id.clone(),
            config: Vec::new(),
            if_name: key.ifname.clone(),
            network_name: key.network.clone(),
            netns: String::new(),
            cni_args: Vec::new(),
            capability_args: Map::new(),
            result: None,
        }
    }

    /// The attachment this entry is of.
    pub fn key(&self) -> Attachment {
        Attachment::new(&self.network_name, &self.container_id, &self.if_name)
    }
}

/// The cache directory (libcni's `<cacheDir>/results`).
#[derive(Debug, Clone)]
pub struct Cache {
    pub dir: PathBuf,
}

impl Cache {
    /// libcni's file name: `<network>-<containerID>-<ifname>`.
    pub fn path(&self, key: &Attachment) -> PathBuf {
        let Attachment {
            network,
            container_id,
            ifname,
        } = key;
        self.dir.join(format!("{network}-{container_id}-{ifname}"))
    }

    /// Write atomically (temp file + rename): a crash must not leave a torn
    /// entry that makes the later DEL lose its prevResult.
    pub fn save(&self, entry: &Entry) -> Result<(), String> {
        let path = self.path(&entry.key());
        let text = serde_json::to_vec(entry).map_err(|e| e.to_string())?;
        create_private_dir(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        write_private(&tmp, &text)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                format!("cannot write {}: {e}", path.display())
            })
    }

    /// The entry of one attachment; `Ok(None)` when there is none.
    pub fn load(&self, key: &Attachment) -> Result<Option<Entry>, String> {
        let path = self.path(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        parse(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Removing an entry that is not there is success (DEL is idempotent).
    pub fn remove(&self, key: &Attachment) -> Result<(), String> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("cannot remove {}: {e}", path.display()))
            }
            _ => Ok(()),
        }
    }

    /// Every readable entry of `network`. File names are ambiguous (names may
    /// contain '-'), so the entries' own fields decide; unreadable files are
    /// skipped like libcni does.
    pub fn list(&self, network: &str) -> Result<Vec<Entry>, String> {
        let dir = match std::fs::read_dir(&self.dir) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("cannot read {}: {e}", self.dir.display())),
        };
        let prefix = format!("{network}-");
        let mut out: Vec<Entry> = dir
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| parse(&b).ok())
            .filter(|e| e.network_name == network)
            .collect();
        out.sort_by(|a, b| (&a.container_id, &a.if_name).cmp(&(&b.container_id, &b.if_name)));
        Ok(out)
    }
}

fn parse(bytes: &[u8]) -> Result<Entry, String> {
    let entry: Entry =
        serde_json::from_slice(bytes).map_err(|e| format!("invalid cache entry: {e}"))?;
    if entry.kind != KIND {
        return Err(format!("cache entry of unknown kind {:?}", entry.kind));
    }
    Ok(entry)
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Results hold addresses and the config may hold secrets: owner only.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// Go encodes `[]byte` as standard base64 with padding.
mod base64_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = Option::<String>::deserialize(d)?.unwrap_or_default();
        decode(&text).ok_or_else(|| serde::de::Error::custom("config is not valid base64"))
    }

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(text: &str) -> Option<Vec<u8>> {
        let body = text.trim_end_matches('=');
        let mut out = Vec::with_capacity(body.len() * 3 / 4);
        let (mut acc, mut bits) = (0u32, 0u32);
        for c in body.bytes() {
            let v = ALPHABET.iter().position(|a| *a == c)? as u32;
            // Only the bits not yet emitted matter (fewer than 14).
            acc = ((acc << 6) | v) & 0x3fff;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push(((acc >> bits) & 0xff) as u8);
            }
        }
        Some(out)
    }
}

#[cfg(test)]
pub(super) use base64_bytes::{decode as base64_decode, encode as base64_encode};
