//! cnikit's firewall transactions take turns on a lock file, so that they do
//! not keep restarting each other (see `store.rs`). A turn also spans a
//! transaction and the record changes that go with it (`index.rs`), so that
//! a repair (`repair.rs`), which reads the records and the kernel in its own
//! turn, never sees a record whose elements a DEL already removed.

use std::cell::Cell;
use std::fs::{File, TryLockError};
use std::time::{Duration, Instant};

const LOCK_DIR: &str = "/run/cnikit";
const LOCK_FILE: &str = "/run/cnikit/nftables.lock";
/// How long a transaction waits for its turn before going ahead without it:
/// far longer than a queue of legitimate transactions takes.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// cnikit's firewall transactions take turns (flock, released when the
/// returned file is dropped at the end of the transaction). The turn is only
/// an optimisation — the generation check alone keeps every transaction
/// correct, just with more restarts — so whatever keeps us from the lock
/// (no directory, a file that is not ours, a holder that does not let go
/// within [`LOCK_WAIT`]) means going ahead without it, never waiting forever.
/// The file is root's and 0600, so other users cannot open it to hold it. A
/// repair is the one caller that never goes without it ([`lock_held`]).
///
/// A thread that already has the turn gets it again at once (the outer
/// holder keeps the lock): a DEL holds its turn across its transaction and
/// the removal of its record, and the transaction takes a turn too.
pub(super) fn lock() -> Turn {
    match lock_held() {
        Ok(turn) => turn,
        Err(why) => {
            eprintln!("firewall: {why}; going ahead without taking turns");
            // Still counted: a nested call must not try again.
            HELD.with(|held| held.set(held.get() + 1));
            Turn { _file: None }
        }
    }
}

/// The turn, or why it could not be had (see [`lock`]): for a caller that
/// must not go ahead without it.
pub(super) fn lock_held() -> Result<Turn, String> {
    let depth = HELD.with(Cell::get);
    if depth > 0 {
        HELD.with(|held| held.set(depth + 1));
        return Ok(Turn { _file: None });
    }
    let file = acquire()?;
    HELD.with(|held| held.set(1));
    Ok(Turn { _file: Some(file) })
}

thread_local! {
    /// How many turns this thread holds (nested).
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// A turn: the lock is released when the outermost one is dropped.
pub(super) struct Turn {
    _file: Option<File>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        HELD.with(|held| held.set(held.get().saturating_sub(1)));
    }
}

fn acquire() -> Result<File, String> {
    let file = open_lock_file().map_err(|e| format!("cannot open {LOCK_FILE}: {e}"))?;
    let deadline = Instant::now() + LOCK_WAIT;
    let mut pause = Duration::from_micros(200);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(format!("{LOCK_FILE} still held after {LOCK_WAIT:?}"));
            }
            Err(TryLockError::Error(e)) => return Err(format!("cannot lock {LOCK_FILE}: {e}")),
        }
    }
}

/// The lock file, created root-owned 0600 whatever the umask, never through
/// a symlink; an existing one must be a regular file owned by us.
fn open_lock_file() -> std::io::Result<File> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o755).create(LOCK_DIR) {
        Ok(()) => std::fs::set_permissions(LOCK_DIR, std::fs::Permissions::from_mode(0o755))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(LOCK_FILE)?;
    let meta = file.metadata()?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me {
        return Err(std::io::Error::other(format!(
            "it is not a regular file owned by uid {me}"
        )));
    }
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}
