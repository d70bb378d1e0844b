//! tuning's backup of what it changes on the container's interface, so that DEL can put
//! it back: `<dataDir>/<containerID>_<ifname>.json` (dataDir `/run/cni/tuning`), the
//! reference's file and JSON, so that either plugin's DEL restores the other's ADD.
//!
//! The directory is opened component by component from `/` without following links and
//! must be ours and writable by no one else (see `safe_dir.rs`); the file is replaced
//! atomically, mode 0600, and read back bounded.

use crate::cni::{Code, Error};
use crate::netlink::{Link, Netlink};
use crate::safe_dir::{components, open_dir, read_at, unlink_at, write_at};
use serde::{Deserialize, Serialize};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The reference's default `dataDir`.
pub(super) const DEFAULT_DIR: &str = "/run/cni/tuning";
/// A backup is a handful of fields.
const MAX_BACKUP: u64 = 64 << 10;

/// What an ADD changed, as it was before (the reference's `configToRestore`: absent fields
/// were not changed; a zero MTU and an empty MAC mean absent, as Go's `omitempty` writes
/// them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Backup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promisc: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allmulti: Option<bool>,
    #[serde(default, rename = "txQLen", skip_serializing_if = "Option::is_none")]
    pub tx_qlen: Option<u32>,
}

impl Backup {
    /// Record `link`'s current value of each field `want` says will change, keeping
    /// what `self` already holds (a repeated ADD must not back up its own changes).
    pub(super) fn record(&mut self, link: &Link, want: &Backup) {
        if want.mac.is_some() && self.mac.is_none() {
            self.mac = link.mac.clone();
        }
        if want.promisc.is_some() && self.promisc.is_none() {
            self.promisc = Some(link.promisc);
        }
        if want.mtu.is_some() && self.mtu.is_none() {
            self.mtu = Some(link.mtu);
        }
        if want.allmulti.is_some() && self.allmulti.is_none() {
            self.allmulti = Some(link.allmulti);
        }
        if want.tx_qlen.is_some() && self.tx_qlen.is_none() {
            self.tx_qlen = Some(link.txqlen);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self == &Backup::default()
    }

    /// Go's `json.MarshalIndent(v, "", " ")`, byte for byte.
    pub(super) fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b" ");
        let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
        // Serializing plain fields cannot fail.
        let _ = self.serialize(&mut ser);
        out
    }

    fn from_json(bytes: &[u8]) -> Result<Backup, serde_json::Error> {
        let mut b: Backup = serde_json::from_slice(bytes)?;
        // omitempty: the reference never writes these, and would not restore them.
        b.mac = b.mac.filter(|m| !m.is_empty());
        b.mtu = b.mtu.filter(|m| *m != 0);
        Ok(b)
    }

    /// Put back every field, in the reference's order (MTU, MAC, promisc, allmulti, queue
    /// length); every failure is returned, after trying the rest.
    pub(super) fn restore(&self, nl: &mut Netlink, index: u32) -> Vec<Error> {
        let mut failed = Vec::new();
        let mut step = |r: crate::netlink::Result<()>| {
            if let Err(e) = r {
                failed.push(Error::from(e));
            }
        };
        if let Some(mtu) = self.mtu {
            step(nl.set_mtu(index, mtu));
        }
        if let Some(mac) = &self.mac {
            step(nl.set_mac(index, mac));
        }
        if let Some(on) = self.promisc {
            step(nl.set_promisc(index, on));
        }
        if let Some(on) = self.allmulti {
            step(nl.set_allmulti(index, on));
        }
        if let Some(q) = self.tx_qlen {
            step(nl.set_txqlen(index, q));
        }
        failed
    }
}

/// Where one attachment's backup lives.
pub(super) struct BackupFile {
    dir: PathBuf,
    name: String,
}

impl BackupFile {
    pub(super) fn new(dir: &Path, container_id: &str, ifname: &str) -> BackupFile {
        BackupFile {
            dir: dir.to_path_buf(),
            name: format!("{container_id}_{ifname}.json"),
        }
    }

    pub(super) fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    fn open_dir(&self, create: bool) -> Result<Option<OwnedFd>, Error> {
        let parts = components(&self.dir).map_err(|e| self.error(Code::InvalidConfig, e))?;
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        open_dir(Path::new("/"), &parts, create).map_err(|e| self.error(Code::Io, e))
    }

    /// The backup, None when there is none.
    pub(super) fn read(&self) -> Result<Option<Backup>, Error> {
        let Some(dir) = self.open_dir(false)? else {
            return Ok(None);
        };
        let Some(bytes) =
            read_at(&dir, &self.name, MAX_BACKUP).map_err(|e| self.error(Code::Io, e))?
        else {
            return Ok(None);
        };
        Backup::from_json(&bytes)
            .map(Some)
            .map_err(|e| self.error(Code::Decode, io::Error::other(e)))
    }

    pub(super) fn write(&self, backup: &Backup) -> Result<(), Error> {
        let dir = self
            .open_dir(true)?
            .ok_or_else(|| self.error(Code::Io, io::Error::other("vanished")))?;
        write_at(&dir, &self.name, &backup.to_json()).map_err(|e| self.error(Code::Io, e))
    }

    pub(super) fn remove(&self) -> Result<(), Error> {
        match self.open_dir(false)? {
            Some(dir) => unlink_at(&dir, &self.name).map_err(|e| self.error(Code::Io, e)),
            None => Ok(()),
        }
    }

    fn error(&self, code: Code, e: io::Error) -> Error {
        Error::new(
            code,
            format!("tuning backup {}: {e}", self.path().display()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_the_references() {
        let b = Backup {
            mac: Some("0a:58:0a:00:00:05".into()),
            promisc: Some(false),
            mtu: Some(1500),
            allmulti: Some(true),
            tx_qlen: Some(1000),
        };
        assert_eq!(
            String::from_utf8(b.to_json()).unwrap(),
            "{\n \"mac\": \"0a:58:0a:00:00:05\",\n \"promisc\": false,\n \"mtu\": 1500,\n \"allmulti\": true,\n \"txQLen\": 1000\n}"
        );
        assert_eq!(Backup::from_json(&b.to_json()).unwrap(), b);
        assert_eq!(Backup::default().to_json(), b"{}");
        let go = br#"{"mac":"","mtu":0,"promisc":true}"#;
        assert_eq!(
            Backup::from_json(go).unwrap(),
            Backup {
                promisc: Some(true),
                ..Backup::default()
            }
        );
    }

    #[test]
    fn file_round_trip_with_explicit_mode_and_no_untrusted_links() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("run/cni/tuning");
        let f = BackupFile::new(&dir, "ctr1", "eth0");
        assert_eq!(f.read().unwrap(), None);
        f.remove().unwrap();
        assert!(!dir.exists(), "reading and removing create nothing");
        let b = Backup {
            mtu: Some(1400),
            ..Backup::default()
        };
        f.write(&b).unwrap();
        assert_eq!(f.read().unwrap(), Some(b));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("ctr1_eth0.json")), 0o600);
        f.remove().unwrap();
        assert_eq!(f.read().unwrap(), None);

        // A link in a directory others may write (a /tmp) is anyone's: refused.
        let shared = d.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let linked = shared.join("linked");
        std::os::unix::fs::symlink(&dir, &linked).unwrap();
        let e = BackupFile::new(&linked, "ctr1", "eth0").write(&Backup::default());
        assert!(e.unwrap_err().msg.contains("refusing"));
        // Root's link in a directory only root may write (Debian's /var/run) is followed.
        if unsafe { libc::geteuid() } == 0 {
            let trusted = d.path().join("trusted");
            std::os::unix::fs::symlink(&dir, &trusted).unwrap();
            BackupFile::new(&trusted, "ctr1", "eth0")
                .write(&Backup::default())
                .unwrap();
            assert!(dir.join("ctr1_eth0.json").exists());
        }
        std::os::unix::fs::symlink("/etc/passwd", dir.join("ctr2_eth0.json")).unwrap();
        assert!(BackupFile::new(&dir, "ctr2", "eth0").read().is_err());
        assert_eq!(
            BackupFile::new(Path::new("relative/dir"), "c", "eth0")
                .read()
                .unwrap_err()
                .code,
            7
        );
    }
}
