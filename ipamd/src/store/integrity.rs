//! Damaged files are refused, never guessed around.
//!
//! A bad frame with a valid one after it cannot be the torn tail of a crashed write (frames
//! are appended one after the other, and nothing is acknowledged before its fsync): the
//! records after it were acknowledged. Cutting the journal there, as for a torn tail, would
//! silently free their addresses for the next allocations. So only that network's store
//! refuses (ErrorKind::Io, CNI code 5), its files stay byte for byte as they are, and the
//! message says where the damage is and to run `cnikit ipamd fsck`, which salvages what is
//! valid. Other networks have their own files and stores, and keep working.

use std::path::Path;

use super::Store;
use crate::journal::Damage;
use crate::log::Level;
use crate::{log_at, Error, ErrorKind};

impl Store {
    /// The error for `damage` in this store's journal (logged as an error too).
    pub(super) fn damaged_journal(&self, damage: &Damage) -> Error {
        let msg = format!(
            "journal {} is damaged at byte offset {}: the record there is corrupt, but a valid record follows at offset {}, so this is not a write cut short by a crash and the records after it were acknowledged; refusing to use network {} rather than lose them. The file is left as it is: {}",
            self.journal_path().display(),
            damage.at,
            damage.next_valid,
            self.network,
            fsck_hint(&self.dir)
        );
        log_at!(Level::Error, "{msg}");
        Error::new(ErrorKind::Io, msg)
    }

    /// Run `f` on the network's directory under the store's lock, without reading the files
    /// (fsck reads them its own way). Nothing in memory is trusted afterwards.
    pub(crate) fn exclusive<T>(
        &mut self,
        f: impl FnOnce(&Path) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.acquire()?;
        let res = f(&self.dir);
        self.loaded = None;
        self.recovery = None;
        if let Err(e) = self.lock_file.unlock() {
            log_at!(Level::Error, "cannot unlock {}: {e}", self.dir.display());
        }
        res
    }
}

/// What to run about damage in the network whose directory is `dir`.
pub(crate) fn fsck_hint(dir: &Path) -> String {
    let cmd = command("fsck", dir);
    format!(
        "run `{cmd}` to see the damage, and `{cmd} --repair` to keep the valid records (the damaged files are kept beside them)"
    )
}

/// `cnikit ipamd <sub>` for the network whose directory is `dir`.
pub(crate) fn command(sub: &str, dir: &Path) -> String {
    let network = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let data_dir = dir.parent().unwrap_or(Path::new("."));
    let flag = if data_dir == Path::new(crate::config::DEFAULT_DATA_DIR) {
        String::new()
    } else {
        format!(" --data-dir {}", data_dir.display())
    };
    format!("cnikit ipamd {sub}{flag} --network {network}")
}
