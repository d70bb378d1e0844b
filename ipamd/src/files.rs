//! How the store creates and opens its files: explicit modes (the caller's umask is not
//! trusted: a runtime started under umask 000 must not leave world-writable journals),
//! never through a symbolic link (someone who could plant one would make a root process
//! write where they point), and, when running as root, only in directories that no one but
//! root can change.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::{Error, ErrorKind};

/// The data dir: others may look up network directories, nothing more.
pub const DATA_DIR_MODE: u32 = 0o755;
/// A network's directory and files hold container IDs: root's alone.
pub const NETWORK_DIR_MODE: u32 = 0o700;
pub const FILE_MODE: u32 = 0o600;

/// Create `dir` (and missing parents) with `mode` exactly; Ok(true) when `dir` itself was
/// created. An existing directory is left as it is.
pub fn create_dir(dir: &Path, mode: u32) -> Result<bool, Error> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(false),
        Ok(_) => {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "{} is not a directory (a symbolic link or a file); refusing to use it",
                    dir.display()
                ),
            ))
        }
        Err(e) if e.kind() == IoKind::NotFound => {}
        Err(e) => return Err(unavailable(format!("stat {}", dir.display()), &e)),
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(DATA_DIR_MODE)
            .create(parent)
            .map_err(|e| unavailable(format!("creating {}", parent.display()), &e))?;
    }
    match DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        // Another process created it first: theirs is as good as ours.
        Err(e) if e.kind() == IoKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(unavailable(format!("creating {}", dir.display()), &e)),
    }
    // mkdir applied the umask; set the mode we meant.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| unavailable(format!("chmod {}", dir.display()), &e))?;
    Ok(true)
}

/// As root, refuse a directory that another user owns or may write to: they could swap
/// our files for links or their own contents. Unprivileged users (tests, rootless
/// runtimes) keep their own trust.
pub fn check_owner(dir: &Path) -> Result<(), Error> {
    if euid() != 0 {
        return Ok(());
    }
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| unavailable(format!("stat {}", dir.display()), &e))?;
    let group_writable = m.mode() & 0o020 != 0 && m.gid() != 0;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o002 != 0 || group_writable {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "{} must be a directory owned by root and writable by no one else (it is {}, uid {}, gid {}, mode {:o}); refusing to keep leases there",
                dir.display(),
                if m.is_dir() { "a directory" } else if m.is_symlink() { "a symbolic link" } else { "not a directory" },
                m.uid(),
                m.gid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Open an existing file without following a symbolic link in its place.
pub fn open_nofollow(opts: &mut OpenOptions, path: &Path) -> Result<File, Error> {
    open_flags(opts, path, 0)
}

/// A directory, to fsync it; not through a link either.
pub fn open_dir(path: &Path) -> Result<File, Error> {
    open_flags(OpenOptions::new().read(true), path, libc::O_DIRECTORY)
}

fn open_flags(opts: &mut OpenOptions, path: &Path, extra: i32) -> Result<File, Error> {
    opts.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | extra)
        .open(path)
        .map_err(|e| open_error(path, &e))
}

/// The lock file, created `FILE_MODE` if missing.
pub(crate) fn open_lock(path: &Path) -> Result<File, Error> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            let err = open_error(path, &e);
            Error::new(ErrorKind::Unavailable, err.to_string())
        })?;
    fix_mode(&f, path)?;
    Ok(f)
}

/// A new file that nothing else may exist in place of (`O_EXCL` does not follow links).
pub fn create_new(path: &Path) -> Result<File, Error> {
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| open_error(path, &e))?;
    fix_mode(&f, path)?;
    Ok(f)
}

/// open() applied the umask to a file it created; make the mode exactly ours.
fn fix_mode(f: &File, path: &Path) -> Result<(), Error> {
    let m = f
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), &e))?;
    if m.mode() & 0o7777 != FILE_MODE && m.uid() == euid() {
        f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
            .map_err(|e| Error::io(format!("chmod {}", path.display()), &e))?;
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn open_error(path: &Path, e: &std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return Error::new(
            ErrorKind::Unavailable,
            format!(
                "{} is a symbolic link; refusing to follow it (the store's files are never links)",
                path.display()
            ),
        );
    }
    Error::io(format!("opening {}", path.display()), e)
}

fn unavailable(context: String, e: &std::io::Error) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{context}: {e}"))
}
