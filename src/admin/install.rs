//! `cnikit install`: the plugin names in a CNI bin dir, as symlinks to this binary or
//! (`--copy`) as hard links of one copy of it. `cnikit node-agent` installs through here
//! too, into the host's bin dir mounted in its pod.

use crate::plugins;
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of the copy: runtimes exec it as root, anyone may (as with any CNI plugin).
const BINARY_MODE: u32 = 0o755;

/// Bytes every cnikit binary since the first release holds (clap's `about` of the
/// `cnikit` command): an older cnikit, which an upgrade replaces without --force, is told
/// from another project's plugin by them.
const SIGNATURE: &[u8] = b"CNI plugins in one binary";

/// Make DIR/<plugin> → this binary for every plugin. Idempotent: what an
/// earlier install made is left alone or redone; anything else needs --force.
///
/// With `copy`, the binary is copied once, as DIR/cnikit, and every plugin
/// name is a hard link to that copy: one copy of the binary on the host, not
/// one per plugin, and all the names in one directory share its filesystem.
/// An older cnikit's copy and hard links (an upgrade) count as ours.
pub(super) fn run(dir: &Path, force: bool, copy: bool) -> Result<(), String> {
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| format!("cannot find the running binary: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if copy {
        let mut known = Known::default();
        let main = dir.join("cnikit");
        install_copy(&me, &main, force, &mut known)?;
        println!("{} = copy of {}", main.display(), me.display());
        for name in plugins::NAMES {
            let target = dir.join(name);
            install_hard_link(&me, &main, &target, force, &mut known)?;
            println!("{} = hard link of {}", target.display(), main.display());
        }
        return Ok(());
    }
    for name in plugins::NAMES {
        let target = dir.join(name);
        install_one(&me, &target, force)?;
        println!("{} -> {}", target.display(), me.display());
    }
    Ok(())
}

fn install_one(me: &Path, target: &Path, force: bool) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(target) {
        if meta.file_type().is_symlink() && links_to(target, me) {
            return Ok(());
        }
        refuse_unless(force, target)?;
        std::fs::remove_file(target)
            .map_err(|e| format!("cannot remove {}: {e}", target.display()))?;
    }
    std::os::unix::fs::symlink(me, target)
        .map_err(|e| format!("cannot create {}: {e}", target.display()))
}

/// Which files (by device and inode) hold a cnikit binary: the names of an earlier
/// `--copy` install are hard links of one file, read once.
#[derive(Default)]
struct Known(HashMap<(u64, u64), bool>);

impl Known {
    fn is_cnikit(&mut self, path: &Path, meta: &std::fs::Metadata) -> bool {
        *self
            .0
            .entry((meta.dev(), meta.ino()))
            .or_insert_with(|| holds_signature(path))
    }
}

/// An ELF file holding [`SIGNATURE`]; read without following a link in its place.
fn holds_signature(path: &Path) -> bool {
    let Ok(file) = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    let mut bytes = Vec::new();
    // Our binary is < 16 MiB; a larger file is not an older cnikit.
    if file.take(64 << 20).read_to_end(&mut bytes).is_err() || !bytes.starts_with(b"\x7fELF") {
        return false;
    }
    bytes.windows(SIGNATURE.len()).any(|w| w == SIGNATURE)
}

/// DIR/cnikit: a regular file with our contents (it may be the running binary
/// itself). A symlink to us is ours too, and becomes a copy; so is an older
/// cnikit's copy, which is upgraded.
fn install_copy(me: &Path, main: &Path, force: bool, known: &mut Known) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(main) {
        if meta.is_file() && same_contents(me, main) {
            return Ok(());
        }
        let ours = if meta.file_type().is_symlink() {
            links_to(main, me)
        } else {
            meta.is_file() && known.is_cnikit(main, &meta)
        };
        if !ours {
            refuse_unless(force, main)?;
        }
    }
    put_in_place(main, |tmp| copy_binary(me, tmp))
        .map_err(|e| format!("cannot create {}: {e}", main.display()))
}

/// DIR/<plugin>: a hard link of DIR/cnikit. What is ours in another form (a
/// symlink to us, a separate copy of us, an older cnikit) is replaced without --force.
fn install_hard_link(
    me: &Path,
    main: &Path,
    target: &Path,
    force: bool,
    known: &mut Known,
) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(target) {
        let main_meta =
            std::fs::metadata(main).map_err(|e| format!("cannot read {}: {e}", main.display()))?;
        if meta.is_file() && (meta.dev(), meta.ino()) == (main_meta.dev(), main_meta.ino()) {
            return Ok(());
        }
        let ours = if meta.file_type().is_symlink() {
            links_to(target, me)
        } else {
            meta.is_file() && known.is_cnikit(target, &meta)
        };
        if !ours {
            refuse_unless(force, target)?;
        }
    }
    put_in_place(target, |tmp| std::fs::hard_link(main, tmp)).map_err(|e| {
        format!(
            "cannot link {} to {}: {e}",
            target.display(),
            main.display()
        )
    })
}

/// A copy of `from` as the new file `to`, mode 0755 whatever the umask, never written
/// through a link planted under its name, on disk before it is renamed into place.
fn copy_binary(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut src = std::fs::File::open(from)?;
    let mut dst = std::fs::File::options()
        .write(true)
        .create_new(true)
        .mode(BINARY_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(to)?;
    dst.set_permissions(std::fs::Permissions::from_mode(BINARY_MODE))?;
    std::io::copy(&mut src, &mut dst)?;
    dst.sync_all()
}

fn refuse_unless(force: bool, target: &Path) -> Result<(), String> {
    if force {
        return Ok(());
    }
    Err(format!(
        "{} already exists and is not a cnikit link; move it away or pass --force to replace it",
        target.display()
    ))
}

fn links_to(link: &Path, me: &Path) -> bool {
    link.canonicalize().ok().as_deref() == Some(me)
}

fn same_contents(a: &Path, b: &Path) -> bool {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len());
    matches!((len(a), len(b)), (Ok(x), Ok(y)) if x == y)
        && matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
}

/// Makes `target` with `make`, under a temporary name beside it that is then
/// renamed over it: a runtime never execs a half-written file, nor finds the
/// name missing, and one exec'ing the old file meanwhile keeps running it (the
/// rename replaces the name, not the file). Nothing is left behind on failure.
fn put_in_place(
    target: &Path,
    make: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = target.with_extension("cnikit-tmp");
    let _ = std::fs::remove_file(&tmp);
    make(&tmp)
        .and_then(|()| std::fs::rename(&tmp, target))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}
