//! Directories of ours below a trusted base (the system's `/run`, or `/`), opened
//! component by component relative to the parent's descriptor, never through a symbolic
//! link, created with explicit modes, and refused when not ours or writable by others:
//! whoever could plant a link or swap a directory there would make a root plugin write
//! where they choose. Files inside are then reached relative to the directory's
//! descriptor only. A configured path may name a link only root can have made (Debian's
//! `/var/run`): [`components`] resolves those before the opening.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// Opens `base/sub[0]/sub[1]/…` below `base` (the system's `/run`, trusted)
/// component by component without following symlinks, creating the missing
/// ones when `create` (the last one 0700, the others 0755), and checks each is
/// a directory of ours that no one else may write. None: it does not exist
/// and `create` is false.
pub(crate) fn open_dir(base: &Path, sub: &[&str], create: bool) -> io::Result<Option<OwnedFd>> {
    let c = |s: &[u8]| CString::new(s).map_err(|_| io::Error::other("NUL in a path"));
    let mut fd = open_at(libc::AT_FDCWD, &c(base.as_os_str().as_encoded_bytes())?)?;
    let mut at = base.to_path_buf();
    for (i, part) in sub.iter().enumerate() {
        at.push(part);
        let name = c(part.as_bytes())?;
        let mode = if i + 1 == sub.len() { 0o700 } else { 0o755 };
        let next = match open_at(fd.as_raw_fd(), &name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                // SAFETY: a NUL-terminated name relative to a descriptor we own.
                let made = unsafe { libc::mkdirat(fd.as_raw_fd(), name.as_ptr(), mode) } == 0;
                if !made {
                    let e = io::Error::last_os_error();
                    // Another plugin run made it meanwhile: checked below like any.
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(e);
                    }
                }
                let next = open_at(fd.as_raw_fd(), &name)?;
                // The umask may have taken bits away, or (000) left others'.
                // SAFETY: fchmod of a descriptor we own.
                if made && unsafe { libc::fchmod(next.as_raw_fd(), mode) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                next
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(explain(&at, e)),
            Ok(next) => next,
        };
        check_safe(&next, i + 1 == sub.len()).map_err(|why| {
            io::Error::other(format!(
                "refusing {}: {why}; it must be a directory owned by uid {} that only its owner can write",
                at.display(),
                // SAFETY: geteuid cannot fail.
                unsafe { libc::geteuid() }
            ))
        })?;
        fd = next;
    }
    Ok(Some(fd))
}

fn explain(at: &Path, e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
        return io::Error::other(format!(
            "refusing {}: not a directory (a symlink?)",
            at.display()
        ));
    }
    e
}

/// A directory, never through a symlink.
pub(crate) fn open_at(dirfd: RawFd, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name relative to a valid descriptor.
    let fd = unsafe { libc::openat(dirfd, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Ours, and no one else may write it; a parent (not `last`) may be sticky
/// instead (a tmpfs's 1777): others cannot then move or remove our entries.
fn check_safe(dir: &OwnedFd, last: bool) -> Result<(), String> {
    // SAFETY: fstat of a descriptor we own into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(dir.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if st.st_uid != me {
        return Err(format!("it is owned by uid {}", st.st_uid));
    }
    let sticky = st.st_mode & libc::S_ISVTX != 0;
    if st.st_mode & 0o022 != 0 && (last || !sticky) {
        return Err(format!(
            "its mode {:o} lets others write",
            st.st_mode & 0o7777
        ));
    }
    Ok(())
}

pub(crate) fn stat_at(dirfd: RawFd, name: &std::ffi::CStr) -> Option<libc::stat> {
    // SAFETY: fstatat without following a symlink, into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatat(dirfd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    (rc == 0).then_some(st)
}

/// `name` relative to `dir` as a C string (no NUL, no `/`: one entry of that directory).
pub(crate) fn entry_name(name: &str) -> io::Result<CString> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::other(format!("{name:?} is not a file name")));
    }
    CString::new(name).map_err(|_| io::Error::other("NUL in a file name"))
}

/// At most `max` bytes of the regular file `name` in `dir`: Ok(None) when there is none;
/// an error when it is a link, not a regular file, or longer. Opened non-blocking so that
/// a FIFO in its place cannot hang the caller.
pub(crate) fn read_at(dir: &OwnedFd, name: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let c = entry_name(name)?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name relative to a directory descriptor we own.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::NotFound => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: a descriptor the kernel just gave us.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if !file.metadata()?.is_file() {
        return Err(io::Error::other(format!("{name} is not a regular file")));
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::other(format!(
            "{name} is larger than {max} bytes"
        )));
    }
    Ok(Some(bytes))
}

/// Replace `name` in `dir` with `bytes`, mode 0600, atomically: a temporary file of
/// ours is written and renamed over it, so a reader sees the old or the new content.
pub(crate) fn write_at(dir: &OwnedFd, name: &str, bytes: &[u8]) -> io::Result<()> {
    write_at_mode(dir, name, bytes, 0o600)
}

/// [`write_at`] with another mode, for files others must read (a CNI conf dir's lists).
pub(crate) fn write_at_mode(dir: &OwnedFd, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    let tmp_name = format!(".{name}.tmp");
    let (c, tmp) = (entry_name(name)?, entry_name(&tmp_name)?);
    // A temporary file left by a crash, or anything planted under its name, goes first.
    unlink_at(dir, &tmp_name)?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name relative to a directory descriptor we own.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), tmp.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let written = (|| {
        // Explicit whatever the umask was.
        // SAFETY: fchmod of a descriptor we own.
        if unsafe { libc::fchmod(file.as_raw_fd(), mode) } != 0 {
            return Err(io::Error::last_os_error());
        }
        file.write_all(bytes)?;
        file.sync_all()?;
        // SAFETY: both names are relative to the directory descriptor we own.
        let rc =
            unsafe { libc::renameat(dir.as_raw_fd(), tmp.as_ptr(), dir.as_raw_fd(), c.as_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = unlink_at(dir, &tmp_name);
    }
    written
}

/// The names in `dir`, at most `max` of them (a directory someone filled is
/// refused, not read into memory whole).
pub(crate) fn names_at(dir: &OwnedFd, max: usize) -> io::Result<Vec<String>> {
    // The descriptor's own entry names exactly the directory we opened.
    let mut names = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
        if names.len() == max {
            return Err(io::Error::other(format!("more than {max} entries")));
        }
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Whether an entry of `dir` has a name `wanted` accepts; reads the
/// directory in batches of a few dozen entries and stops at the first such
/// one. std's `read_dir` asks the kernel for 32 KiB of entries at a time:
/// in a directory of a thousand attachment records that is most of it on
/// every question, where the answer is usually in the first few.
pub(crate) fn any_name_at(dir: &OwnedFd, wanted: impl Fn(&str) -> bool) -> io::Result<bool> {
    /// `struct linux_dirent64` is 8-byte aligned; the kernel writes it in place.
    #[repr(C, align(8))]
    struct Batch([u8; 1024]);
    // A descriptor of its own, so that reading starts at the first entry.
    let own = open_at(dir.as_raw_fd(), c".")?;
    let mut batch = Batch([0; 1024]);
    loop {
        // SAFETY: the kernel writes at most the buffer's length into it.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                own.as_raw_fd(),
                batch.0.as_mut_ptr(),
                batch.0.len(),
            )
        };
        let Ok(len) = usize::try_from(n) else {
            return Err(io::Error::last_os_error());
        };
        if len == 0 {
            return Ok(false);
        }
        if dirent_names(&batch.0[..len])?.any(|name| name != "." && name != ".." && wanted(&name)) {
            return Ok(true);
        }
    }
}

/// The names of a getdents64 batch: records of d_ino (8 bytes), d_off (8),
/// d_reclen (2), d_type (1), then the NUL-terminated name.
fn dirent_names(batch: &[u8]) -> io::Result<impl Iterator<Item = String> + '_> {
    const NAME_AT: usize = 19;
    let mut records = Vec::new();
    let mut at = 0;
    while at < batch.len() {
        let reclen = batch
            .get(at + 16..at + 18)
            .map(|b| usize::from(u16::from_ne_bytes([b[0], b[1]])))
            .filter(|&r| r > NAME_AT && at + r <= batch.len())
            .ok_or_else(|| io::Error::other("a malformed directory entry"))?;
        records.push(&batch[at + NAME_AT..at + reclen]);
        at += reclen;
    }
    Ok(records.into_iter().map(|raw| {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        String::from_utf8_lossy(&raw[..end]).into_owned()
    }))
}

/// Remove `name` from `dir`; one already gone is fine.
pub(crate) fn unlink_at(dir: &OwnedFd, name: &str) -> io::Result<()> {
    let c = entry_name(name)?;
    // SAFETY: a NUL-terminated name relative to a directory descriptor we own.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::NotFound {
            return Err(e);
        }
    }
    Ok(())
}

/// The components of an absolute path below `/`, for [`open_dir`] with base `/`, with
/// the symbolic links that only root can have made followed: a link owned by root, in a
/// directory owned by root that no one else may write (`/var/run` → `/run` on Debian, so
/// a configuration naming `/var/run/…` works as with the reference plugins). Any other
/// link stays a component, and [`open_dir`] refuses it. A relative path, or one with
/// `.`/`..` components, is refused (it would not say which directory it names).
pub(crate) fn components(path: &Path) -> io::Result<Vec<String>> {
    use std::os::unix::fs::MetadataExt;
    /// Links followed at most, as the kernel bounds a lookup (ELOOP).
    const MAX_LINKS: usize = 8;
    let mut todo = plain_components(path)?;
    todo.reverse();
    let mut done: Vec<String> = Vec::new();
    let mut links = 0;
    // Once a link is kept, nothing after it is looked at: the path through it is
    // not one to resolve (open_dir refuses it), only to report.
    let mut kept_link = false;
    while let Some(part) = todo.pop() {
        let here: std::path::PathBuf = std::iter::once("/")
            .chain(done.iter().map(String::as_str))
            .collect();
        let at = here.join(&part);
        let link = if kept_link {
            None
        } else {
            std::fs::symlink_metadata(&at)
                .ok()
                .filter(|m| m.file_type().is_symlink())
        };
        let root_link = link.as_ref().is_some_and(|m| m.uid() == 0)
            && std::fs::symlink_metadata(&here)
                .is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0);
        if !root_link || links == MAX_LINKS {
            kept_link |= link.is_some();
            done.push(part);
            continue;
        }
        links += 1;
        let target = here.join(std::fs::read_link(&at)?);
        // The rest of the path goes on from the link's target, resolved from `/`.
        let mut resolved = lexical_components(&target);
        resolved.reverse();
        todo.extend(resolved);
        done.clear();
    }
    Ok(done)
}

/// `path`'s components below `/` as written; `.`/`..` or a relative path refused.
fn plain_components(path: &Path) -> io::Result<Vec<String>> {
    use std::path::Component;
    if !path.is_absolute() {
        return Err(io::Error::other(format!(
            "{} is not an absolute path",
            path.display()
        )));
    }
    path.components()
        .filter(|c| !matches!(c, Component::RootDir))
        .map(|c| match c {
            Component::Normal(s) => s
                .to_str()
                .map(str::to_string)
                .ok_or_else(|| io::Error::other(format!("{} is not UTF-8", path.display()))),
            _ => Err(io::Error::other(format!(
                "{} has a . or .. component",
                path.display()
            ))),
        })
        .collect()
}

/// A link target's components below `/`, `..` taken lexically: the directories it
/// climbs out of were just walked and hold no link.
fn lexical_components(path: &Path) -> Vec<String> {
    use std::path::Component;
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(s.to_string_lossy().into_owned()),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn parts(p: &str) -> Vec<String> {
        components(Path::new(p)).expect("components")
    }

    /// Proves: the batched search finds a name among thousands whatever its
    /// place, says no when none matches, and never offers `.` or `..`.
    #[test]
    fn any_name_at_reads_past_many_batches() {
        let base = std::env::temp_dir().join(format!("cnikit-names-{}", std::process::id()));
        std::fs::create_dir_all(&base).expect("mkdir");
        for i in 0..3000 {
            std::fs::write(base.join(format!("{i:016x}.masq")), b"").expect("write");
        }
        std::fs::write(base.join("00000000000abcde.portmap"), b"").expect("write");
        let dir = open_at(
            libc::AT_FDCWD,
            &CString::new(base.as_os_str().as_encoded_bytes()).expect("path"),
        )
        .expect("open");
        assert!(any_name_at(&dir, |n| n.ends_with(".portmap")).expect("read"));
        assert!(any_name_at(&dir, |n| n == "0000000000000bb7.masq").expect("read"));
        assert!(!any_name_at(&dir, |n| n.ends_with(".tuning")).expect("read"));
        assert!(!any_name_at(&dir, |n| n.starts_with('.')).expect("read"));
        let names = names_at(&dir, 10_000).expect("names");
        assert_eq!(names.len(), 3001, "every entry still listed");
        std::fs::remove_dir_all(&base).expect("clean up");
    }

    #[test]
    fn relative_and_dotted_paths_are_refused() {
        for p in ["run/x", "/run/../etc"] {
            assert!(components(Path::new(p)).is_err(), "{p}");
        }
    }

    #[test]
    fn root_links_in_root_directories_are_followed_others_kept() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: the links must be root's");
            return;
        }
        let base = std::env::temp_dir().join(format!("cnikit-links-{}", std::process::id()));
        let real = base.join("real");
        std::fs::create_dir_all(&real).expect("mkdir");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::symlink("real", base.join("rel")).expect("link");
        std::os::unix::fs::symlink(&real, base.join("abs")).expect("link");
        let b = base.to_str().expect("utf-8");
        let mut want = parts(b);
        want.extend(["real".to_string(), "x".to_string()]);
        assert_eq!(parts(&format!("{b}/rel/x")), want);
        assert_eq!(parts(&format!("{b}/abs/x")), want);
        // In a directory others may write, a link is anyone's: kept, for open_dir to refuse.
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert_eq!(
            parts(&format!("{b}/rel/x")).last().map(String::as_str),
            Some("x")
        );
        assert!(parts(&format!("{b}/rel/x")).contains(&"rel".to_string()));
        // Nor is a root link reached through that one resolved.
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::symlink("/run", real.join("run")).expect("link");
        assert_eq!(
            parts(&format!("{b}/rel/run")).last().map(String::as_str),
            Some("run")
        );
        assert!(parts(&format!("{b}/rel/run")).contains(&"rel".to_string()));
        std::fs::remove_dir_all(&base).expect("clean up");
        // Debian's /var/run, when the machine has it.
        if std::fs::read_link("/var/run").is_ok_and(|t| t == Path::new("/run")) {
            assert_eq!(parts("/var/run/cni/tuning"), ["run", "cni", "tuning"]);
        }
    }
}
