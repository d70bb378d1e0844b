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
use crate::repair_hint::fsck_hint;
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
        self.base = None;
        self.recovery = None;
        if let Err(e) = self.lock_file.unlock() {
            log_at!(Level::Error, "cannot unlock {}: {e}", self.dir.display());
        }
        res
    }
}
