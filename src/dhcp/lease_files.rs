//! The daemon's record of every lease it holds: one file per attachment, written (and
//! synced) before the plugin hears of the lease, removed once it is released. A daemon
//! that restarts, or was killed, reads them back and resumes each lease where its timers
//! stand; without them a restart would leave every pod's lease to expire (the reference's
//! #767).
//!
//! Files are made the way ipamd's are (`ipamd::files`): explicit modes, never through a
//! link, in a directory only root can change. A file is replaced by writing a new one
//! and renaming it over, so a crash leaves the old record or the new, never half of one.

use super::exchange::Ack;
use super::options::ClientOptions;
use super::{Error, ErrorKind, Result};
use crate::hex::{hex, unhex};
use ipamd::attachment::Attachment;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The record format; a daemon refuses (and leaves alone) records of another.
const FORMAT: u32 = 1;
/// A record is a few hundred bytes; anything far larger is not ours.
const MAX_RECORD: u64 = 64 * 1024;

/// A kind of lease record: its file extension and format, and whose lease it is.
pub trait Stored: Serialize + DeserializeOwned {
    /// The extension of its files: a daemon reads each kind from its own files.
    const EXT: &'static str;
    /// The format this daemon writes and reads.
    const FORMAT: u32;
    fn attachment(&self) -> &Attachment;
    fn format(&self) -> u32;
}

impl Stored for Record {
    const EXT: &'static str = "json";
    const FORMAT: u32 = FORMAT;
    fn attachment(&self) -> &Attachment {
        &self.attachment
    }
    fn format(&self) -> u32 {
        self.format
    }
}

/// One held DHCPv4 lease, as kept on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub attachment: Attachment,
    /// The pod's netns as the runtime named it (before any `-hostprefix`).
    pub netns: PathBuf,
    pub options: ClientOptions,
    /// The DHCPACK as received, with its sender's MAC (hex of `Ack::to_bytes`).
    pub ack: String,
    /// Wall-clock milliseconds since the epoch when the ACK came: the lease's timers
    /// count from here, also across a restart.
    pub bound_at_ms: u64,
}

impl Record {
    pub fn new(
        attachment: Attachment,
        netns: PathBuf,
        options: ClientOptions,
        ack: &Ack,
        bound_at: SystemTime,
    ) -> Result<Record> {
        Ok(Record {
            format: FORMAT,
            attachment,
            netns,
            options,
            ack: hex(&ack.to_bytes()?),
            bound_at_ms: unix_millis(bound_at),
        })
    }

    /// The ACK this record holds.
    pub fn ack(&self) -> Result<Ack> {
        let bytes = unhex(&self.ack).ok_or_else(|| corrupt("the ACK is not hex"))?;
        Ack::from_bytes(&bytes)
    }

    pub fn bound_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.bound_at_ms)
    }
}

/// The directory of lease records, locked for one daemon.
#[derive(Debug, Clone)]
pub struct LeaseFiles {
    dir: PathBuf,
    /// Held while the daemon runs: two daemons resuming the same leases would both keep
    /// (and release) them.
    _lock: std::sync::Arc<std::fs::File>,
}

impl LeaseFiles {
    /// Creates `dir` (mode 0700) if needed, refuses one that others could change, and
    /// takes its lock (refused while another daemon holds it).
    pub fn open(dir: &Path) -> Result<LeaseFiles> {
        use std::os::unix::fs::OpenOptionsExt;
        ipamd::files::create_dir(dir, ipamd::files::NETWORK_DIR_MODE).map_err(store_error)?;
        ipamd::files::check_owner(dir).map_err(store_error)?;
        let path = dir.join(".lock");
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(ipamd::files::FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| io_error(&format!("opening {}", path.display()), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "another DHCP daemon keeps its leases in {} (it holds {})",
                        dir.display(),
                        path.display()
                    ),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io_error(&format!("locking {}", path.display()), e))
            }
        }
        Ok(LeaseFiles {
            dir: dir.to_path_buf(),
            _lock: std::sync::Arc::new(lock),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `record` durably (file and directory synced) in place of the old one.
    pub fn save<R: Stored>(&self, record: &R) -> Result<()> {
        let path = self.path_of::<R>(record.attachment());
        // One temporary name per kind: an attachment's DHCPv4 and DHCPv6 records are
        // saved at the same time.
        let tmp = path.with_extension(format!("{}.tmp", R::EXT));
        let _ = std::fs::remove_file(&tmp);
        let text =
            serde_json::to_vec(record).map_err(|e| corrupt(&format!("cannot encode: {e}")))?;
        let mut f = ipamd::files::create_new(&tmp).map_err(store_error)?;
        f.write_all(&text)
            .and_then(|()| f.sync_all())
            .map_err(|e| io_error(&format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            io_error(
                &format!("renaming {} to {}", tmp.display(), path.display()),
                e,
            )
        })?;
        self.sync_dir()
    }

    /// Forgets the record of `attachment` (none is fine).
    pub fn remove<R: Stored>(&self, attachment: &Attachment) -> Result<()> {
        let path = self.path_of::<R>(attachment);
        match std::fs::remove_file(&path) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&format!("removing {}", path.display()), e)),
        }
    }

    /// Every readable record; the unreadable ones are named in the second list (and left
    /// in place for a person to look at).
    pub fn load<R: Stored>(&self) -> Result<(Vec<R>, Vec<String>)> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| io_error(&format!("listing {}", self.dir.display()), e))?;
        let (mut records, mut bad) = (Vec::new(), Vec::new());
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some(R::EXT) {
                continue;
            }
            match read_record::<R>(&path) {
                Ok(r) if path == self.path_of::<R>(r.attachment()) => records.push(r),
                Ok(_) => bad.push(format!("{}: named for another attachment", path.display())),
                Err(e) => bad.push(format!("{}: {e}", path.display())),
            }
        }
        Ok((records, bad))
    }

    /// A name from a hash of the attachment: container IDs and network names may hold
    /// characters a file name must not.
    fn path_of<R: Stored>(&self, a: &Attachment) -> PathBuf {
        let digest = Sha256::digest(format!("{}\0{}\0{}", a.network, a.container_id, a.ifname));
        self.dir.join(format!("{}.{}", &hex(&digest)[..32], R::EXT))
    }

    fn sync_dir(&self) -> Result<()> {
        ipamd::files::open_dir(&self.dir)
            .map_err(store_error)?
            .sync_all()
            .map_err(|e| io_error(&format!("syncing {}", self.dir.display()), e))
    }
}

fn read_record<R: Stored>(path: &Path) -> Result<R> {
    use std::io::Read;
    let f = ipamd::files::open_nofollow(std::fs::OpenOptions::new().read(true), path)
        .map_err(store_error)?;
    let mut text = Vec::new();
    f.take(MAX_RECORD + 1)
        .read_to_end(&mut text)
        .map_err(|e| io_error("reading", e))?;
    if text.len() as u64 > MAX_RECORD {
        return Err(corrupt("larger than any lease record"));
    }
    let record: R =
        serde_json::from_slice(&text).map_err(|e| corrupt(&format!("not a lease record: {e}")))?;
    if record.format() != R::FORMAT {
        return Err(corrupt(&format!(
            "record format {} (this daemon reads {})",
            record.format(),
            R::FORMAT
        )));
    }
    Ok(record)
}

pub fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub fn corrupt(what: &str) -> Error {
    Error::new(ErrorKind::Io, format!("unreadable lease record: {what}"))
}

fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("lease records: {what}: {e}"))
}

fn store_error(e: ipamd::Error) -> Error {
    Error::new(ErrorKind::Io, format!("lease records: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let files = LeaseFiles::open(&tmp.path().join("leases")).unwrap();
        let a = Attachment::new("net", "c1", "eth0");
        let mut record = Record {
            format: FORMAT,
            attachment: a.clone(),
            netns: "/run/netns/p".into(),
            options: ClientOptions {
                client_id: vec![0, b'x'],
                provide: vec![],
                request: vec![3, 1],
            },
            ack: "00ff".into(),
            bound_at_ms: 1_700_000_000_000,
        };
        files.save(&record).unwrap();
        record.bound_at_ms += 10;
        files.save(&record).unwrap();
        std::fs::write(files.dir().join("junk.json"), b"{").unwrap();
        let (records, bad) = files.load::<Record>().unwrap();
        assert_eq!(records, vec![record]);
        assert_eq!(bad.len(), 1, "{bad:?}");
        files.remove::<Record>(&a).unwrap();
        files.remove::<Record>(&a).unwrap();
        assert!(files.load::<Record>().unwrap().0.is_empty());
        let e = LeaseFiles::open(files.dir()).unwrap_err();
        assert!(e.message.contains("another DHCP daemon"), "{e}");
    }
}
