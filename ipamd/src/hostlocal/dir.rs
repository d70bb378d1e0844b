//! One network's directory in the reference host-local's on-disk format, file by file.
//!
//! - `<address>`: one file per leased address, named by it as Go prints it (`10.22.0.5`,
//!   `fd00::5`), holding `ID\r\nIFNAME` (host-local 0.7 and later) or only `ID` (earlier);
//! - `last_reserved_ip.<range set index>`: the address last handed out from that set, no
//!   trailing newline, where the next round-robin walk starts;
//! - `lock`: `flock(LOCK_EX)` on it serialises every reader and writer, ours and the
//!   reference's (go-filemutex takes the same kind of lock).
//!
//! Everything is opened without following links, and lease files are read bounded and
//! non-blocking (a FIFO planted under an address name cannot hang an ADD).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::attachment::check_network;
use crate::fault::{self, Call};
use crate::{files, journal, Error, ErrorKind};

/// The reference's separator between container ID and ifname in a lease file.
const LINE_BREAK: &str = "\r\n";
const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
/// A lease file is an ID and an interface name; anything longer is not one of ours or
/// the reference's, and reading it whole would let a planted file cost unbounded memory.
const MAX_LEASE_FILE: u64 = 4096;
/// `last_reserved_ip.N` holds one address.
const MAX_LAST_RESERVED: u64 = 64;

/// Who a lease file says holds its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// `ID\r\nIFNAME`.
    Attachment { id: String, ifname: String },
    /// Only an ID (host-local before 0.7): the container's, whatever interface.
    Container(String),
    /// A regular file whose content is neither (too long, not text, unreadable): the
    /// address is taken and only GC frees it.
    Unreadable,
    /// Not a regular file (a link, a directory, a FIFO): taken, and never touched.
    Foreign,
}

impl Owner {
    /// The reference compares the whole content, trimmed of white space, with
    /// `trim(ID) + "\r\n" + IFNAME`, then with `trim(ID)`: split the same way.
    fn parse(bytes: &[u8]) -> Owner {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Owner::Unreadable;
        };
        let text = text.trim();
        match text.split_once(LINE_BREAK) {
            Some((id, ifname)) => Owner::Attachment {
                id: id.to_string(),
                ifname: ifname.to_string(),
            },
            None => Owner::Container(text.to_string()),
        }
    }

    /// Written as `ID\r\nIFNAME` exactly (the ID trimmed), as the reference writes it.
    pub(crate) fn attachment(id: &str, ifname: &str) -> Owner {
        Owner::Attachment {
            id: id.trim().to_string(),
            ifname: ifname.to_string(),
        }
    }

    pub(crate) fn is_attachment(&self, id: &str, ifname: &str) -> bool {
        matches!(self, Owner::Attachment { id: i, ifname: n } if i == id.trim() && n == ifname)
    }

    pub(crate) fn is_container_only(&self, id: &str) -> bool {
        matches!(self, Owner::Container(i) if i == id.trim())
    }

    /// For messages: `container/ifname`, or what else the file is.
    pub(crate) fn describe(&self) -> String {
        match self {
            Owner::Attachment { id, ifname } => format!("container {id}/{ifname}"),
            Owner::Container(id) => format!("container {id}"),
            Owner::Unreadable => "a lease file that cannot be read".to_string(),
            Owner::Foreign => "something that is not a regular file".to_string(),
        }
    }
}

/// Every address file of a network and who holds it.
pub(crate) type Leases = BTreeMap<IpAddr, Owner>;

/// A network's directory with its lock file open (not yet locked).
pub(crate) struct Dir {
    path: PathBuf,
    lock: File,
}

impl Dir {
    /// The directory of `network` under `data_dir`, created (0700, parents 0755) when
    /// `create`; None when it does not exist and `create` is false, so that DEL, CHECK
    /// and GC of unknown networks leave no trace.
    pub(crate) fn open(data_dir: &Path, network: &str, create: bool) -> Result<Option<Dir>, Error> {
        match check_network(network) {
            Ok(()) => {}
            // No ADD can have made a directory for that name: nothing to read or free.
            Err(_) if !create => return Ok(None),
            Err(e) => return Err(e),
        }
        let path = data_dir.join(network);
        if create {
            files::create_dir(data_dir, files::DATA_DIR_MODE)?;
            files::check_owner(data_dir)?;
            if files::create_dir(&path, files::NETWORK_DIR_MODE)? {
                // The new entry must survive a crash together with the first lease.
                journal::fsync_dir(data_dir)?;
            }
        } else {
            match std::fs::symlink_metadata(&path) {
                Ok(_) => {}
                Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
                Err(e) => return Err(Error::io(format!("stat {}", path.display()), &e)),
            }
            files::check_owner(data_dir)?;
        }
        files::check_owner(&path)?;
        let lock = files::open_lock(&path.join("lock"))?;
        Ok(Some(Dir { path, lock }))
    }

    /// Take the flock, polling so that a stuck holder becomes a clear error after
    /// `timeout` instead of a hang.
    pub(crate) fn lock(&self, timeout: Duration) -> Result<Locked<'_>, Error> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(50);
        loop {
            match self.lock.try_lock() {
                Ok(()) => return Ok(Locked { dir: self }),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("locking {}: {e}", self.path.join("lock").display()),
                    ))
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "timed out after {timeout:?} waiting for the lock on {} (another process holds it)",
                        self.path.join("lock").display()
                    ),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

/// The directory while its lock is held; every read and write goes through here.
pub(crate) struct Locked<'a> {
    dir: &'a Dir,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too; failing here means a broken fd.
        let _ = self.dir.lock.unlock();
    }
}

impl Locked<'_> {
    pub(crate) fn path(&self) -> &Path {
        &self.dir.path
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path.join(name)
    }

    /// Every file named by an address, with its holder. Other names (`lock`,
    /// `last_reserved_ip.N`, whatever an admin left) are not leases.
    pub(crate) fn scan(&self) -> Result<Leases, Error> {
        let path = &self.dir.path;
        let rd = std::fs::read_dir(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
        let mut out = Leases::new();
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
            let Some(addr) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let owner = match entry.file_type() {
                Ok(t) if t.is_file() => read_owner(&entry.path()),
                _ => Owner::Foreign,
            };
            out.insert(addr, owner);
        }
        Ok(out)
    }

    /// Where the round-robin walk of range set `set` resumes; None when unknown or
    /// unreadable (the walk then starts at the set's beginning, as in the reference).
    pub(crate) fn last_reserved(&self, set: usize) -> Option<IpAddr> {
        let path = self.file(&format!("{LAST_RESERVED_PREFIX}{set}"));
        let bytes = read_bounded(&path, MAX_LAST_RESERVED).ok()??;
        std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
    }

    /// Record the address last handed out from `set`. Not fsynced: it only steers the
    /// round robin, and losing it in a crash costs nothing but where the next walk starts.
    pub(crate) fn set_last_reserved(&self, set: usize, addr: IpAddr) -> Result<(), Error> {
        let path = self.file(&format!("{LAST_RESERVED_PREFIX}{set}"));
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(files::FILE_MODE)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)?;
            f.set_permissions(std::fs::Permissions::from_mode(files::FILE_MODE))?;
            fault::check(&path, Call::Write)?;
            f.write_all(addr.to_string().as_bytes())
        };
        write().map_err(|e| Error::io(format!("writing {}", path.display()), &e))
    }

    /// Create the lease file of `addr` for `owner` (only an `Attachment`) with O_EXCL and
    /// make its content durable. Ok(false) when the file exists already.
    pub(crate) fn reserve(&self, addr: IpAddr, owner: &Owner) -> Result<bool, Error> {
        let Owner::Attachment { id, ifname } = owner else {
            return Err(Error::internal("a lease is written for an attachment only"));
        };
        let path = self.file(&addr.to_string());
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(files::FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path);
        let mut f = match created {
            Ok(f) => f,
            Err(e) if e.kind() == IoKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(Error::io(format!("creating {}", path.display()), &e)),
        };
        let content = format!("{id}{LINE_BREAK}{ifname}");
        let mut write = || -> std::io::Result<()> {
            // The umask may have taken bits away; the mode is exactly ours.
            f.set_permissions(std::fs::Permissions::from_mode(files::FILE_MODE))?;
            fault::check(&path, Call::Write)?;
            f.write_all(content.as_bytes())?;
            fault::check(&path, Call::Fsync)?;
            f.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&path);
            return Err(Error::io(format!("writing {}", path.display()), &e));
        }
        Ok(true)
    }

    /// Remove the lease file of `addr`; a file already gone is fine.
    pub(crate) fn remove(&self, addr: IpAddr) -> Result<(), Error> {
        let path = self.file(&addr.to_string());
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == IoKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", path.display()), &e)),
        }
    }

    /// Make created and removed entries durable.
    pub(crate) fn sync(&self) -> Result<(), Error> {
        journal::fsync_dir(&self.dir.path)
    }
}

/// The holder named by the regular file at `path`.
fn read_owner(path: &Path) -> Owner {
    match read_bounded(path, MAX_LEASE_FILE) {
        Ok(Some(bytes)) => Owner::parse(&bytes),
        // Gone between listing and reading: another process freed it (it holds the lock
        // only if it is not host-local); the address is free.
        Ok(None) => Owner::Unreadable,
        Err(_) => Owner::Unreadable,
    }
}

/// At most `max` bytes of the regular file at `path`; Ok(None) when it does not exist,
/// an error when it is longer or not a regular file.
fn read_bounded(path: &Path, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other("too large"));
    }
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_parse_like_the_reference_compares() {
        assert_eq!(
            Owner::parse(b"abc\r\neth0"),
            Owner::attachment("abc", "eth0")
        );
        // TrimSpace of the whole content, as the reference compares it.
        assert_eq!(
            Owner::parse(b" abc\r\neth0\n"),
            Owner::attachment("abc", "eth0")
        );
        assert_eq!(Owner::parse(b"abc"), Owner::Container("abc".into()));
        assert_eq!(Owner::parse(b"abc\n"), Owner::Container("abc".into()));
        assert_eq!(Owner::parse(&[0xff, 0xfe]), Owner::Unreadable);
        let o = Owner::parse(b"abc\r\neth0");
        assert!(o.is_attachment(" abc ", "eth0"));
        assert!(!o.is_attachment("abc", "eth1"));
        assert!(Owner::parse(b"abc").is_container_only("abc"));
        assert!(!o.is_container_only("abc"));
    }
}
