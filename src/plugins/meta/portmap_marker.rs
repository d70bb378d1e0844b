//! A file per attachment that has port mappings, under /run (cleared on
//! reboot, like the rules themselves). It lets DEL without
//! `runtimeConfig.portMappings` find out, with one stat and no netlink,
//! whether there is anything to remove. Best effort: a missing marker only
//! means such a DEL leaves the entries to GC, as the reference always does.
//!
//! Safety of the files, whatever the runtime's umask and whoever else is on
//! the node: `/run/cnikit` (0755, or sticky) and `/run/cnikit/portmap` (0700)
//! must be directories owned by this plugin's user (root) that nobody else
//! can write; one that is not is refused and reported, never used. Markers are created
//! relative to the directory's descriptor with `O_NOFOLLOW`, mode 0600, and
//! only regular files count as markers. Their name is the SHA-256 of the
//! attachment key, so any container ID length fits a file name.

use crate::cni::{Attachment, Request};
use crate::safe_dir::{open_dir, stat_at};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

/// `/run/cnikit/portmap`: the system's `/run`, then directories of ours.
const BASE: &str = "/run";
const SUB: [&str; 2] = ["cnikit", "portmap"];

pub(super) fn set(req: &Request) {
    if let Err(e) = set_in(Path::new(BASE), &SUB, &key(req)) {
        eprintln!("portmap: cannot record the mapping marker: {e}");
    }
}

pub(super) fn is_set(req: &Request) -> bool {
    is_set_in(Path::new(BASE), &SUB, &key(req))
}

pub(super) fn clear(req: &Request) {
    if let Err(e) = clear_in(Path::new(BASE), &SUB, &key(req)) {
        eprintln!("portmap: cannot remove the mapping marker: {e}");
    }
}

/// GC: removes the markers of `network` whose attachment is not in `valid`.
pub(super) fn gc(network: &str, valid: &[Attachment]) {
    let valid: HashSet<Vec<u8>> = valid
        .iter()
        .map(|a| key_of(&a.network, &a.container_id, &a.ifname))
        .collect();
    if let Err(e) = gc_in(Path::new(BASE), &SUB, network, &valid) {
        eprintln!("portmap: cannot remove stale mapping markers: {e}");
    }
}

/// The attachment key, one byte string: NUL cannot occur in a network name,
/// a container ID or an ifname, so distinct keys give distinct strings.
fn key(req: &Request) -> Vec<u8> {
    key_of(&req.conf.name, req.container_id(), req.ifname())
}

fn key_of(network: &str, container_id: &str, ifname: &str) -> Vec<u8> {
    [network, container_id, ifname].join("\0").into_bytes()
}

/// The marker's file name: 64 hex digits, whatever the key's length.
fn name(key: &[u8]) -> CString {
    let hex: String = Sha256::digest(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    CString::new(hex).unwrap_or_default()
}

fn set_in(base: &Path, sub: &[&str], key: &[u8]) -> io::Result<()> {
    let dirfd = open_dir(base, sub, true)?.ok_or_else(|| io::Error::other("vanished"))?;
    // SAFETY: a NUL-terminated name relative to a directory descriptor we own.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            name(key).as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    // Explicit whatever the umask was when the file was created.
    // SAFETY: fchmod of a descriptor we own.
    if unsafe { libc::fchmod(file.as_raw_fd(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // The key itself is the content, so that GC can tell whose marker it is.
    let mut file = std::fs::File::from(file);
    file.set_len(0)?;
    file.write_all(key)
}

fn is_set_in(base: &Path, sub: &[&str], key: &[u8]) -> bool {
    let Ok(Some(dirfd)) = open_dir(base, sub, false) else {
        return false;
    };
    stat_at(dirfd.as_raw_fd(), &name(key))
        .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

fn clear_in(base: &Path, sub: &[&str], key: &[u8]) -> io::Result<()> {
    let Some(dirfd) = open_dir(base, sub, false)? else {
        return Ok(());
    };
    // SAFETY: a NUL-terminated name relative to a directory descriptor we own.
    let rc = unsafe { libc::unlinkat(dirfd.as_raw_fd(), name(key).as_ptr(), 0) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::NotFound {
            return Err(e);
        }
    }
    Ok(())
}

/// Markers older than their key content (empty) cannot be attributed and are
/// left; /run is cleared at boot.
fn gc_in(base: &Path, sub: &[&str], network: &str, valid: &HashSet<Vec<u8>>) -> io::Result<()> {
    let Some(dirfd) = open_dir(base, sub, false)? else {
        return Ok(());
    };
    // The directory was checked to be ours and writable by no one else, so
    // its entries cannot change under us but by our own kind.
    let path = sub.iter().fold(base.to_path_buf(), |p, s| p.join(s));
    for entry in std::fs::read_dir(&path)? {
        let Ok(file_name) = CString::new(entry?.file_name().into_vec()) else {
            continue;
        };
        let Some(key) = marker_key(dirfd.as_raw_fd(), &file_name) else {
            continue;
        };
        let of_network = key.split(|b| *b == 0).next() == Some(network.as_bytes());
        if of_network && !valid.contains(&key) && name(&key) == file_name {
            clear_in(base, sub, &key)?;
        }
    }
    Ok(())
}

/// The key a marker holds; None for anything that is not a regular file
/// holding a plausible key.
fn marker_key(dirfd: RawFd, file_name: &std::ffi::CStr) -> Option<Vec<u8>> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name relative to a directory descriptor we own.
    let fd = unsafe { libc::openat(dirfd, file_name.as_ptr(), flags) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor the kernel just gave us.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut key = Vec::new();
    file.take(MAX_KEY + 1).read_to_end(&mut key).ok()?;
    (!key.is_empty() && key.len() as u64 <= MAX_KEY).then_some(key)
}

/// A network name, a container ID and an ifname, generously.
const MAX_KEY: u64 = 64 << 10;

#[cfg(test)]
#[path = "portmap_marker_tests.rs"]
mod tests;
