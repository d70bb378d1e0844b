//! The store's files: explicit modes whatever the umask, never through a planted link,
//! and only in a data dir no one but root can change.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::store::{Store, StoreOptions};
use crate::testutil::{in_child, req, sets, skip_unless_root, temp_dir};
use crate::ErrorKind;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn modes_are_explicit_under_umask_000_and_planted_links_are_refused() {
    if !in_child("tests::files::modes_are_explicit_under_umask_000_and_planted_links_are_refused") {
        return;
    }
    // SAFETY: umask cannot fail; this child process runs only this test.
    unsafe { libc::umask(0) };
    let d = temp_dir("files");
    let data = d.path().join("data");
    let rs = sets("10.50.0.0/24");
    let mut s = Store::open(&data, "net1", StoreOptions::default()).unwrap();
    s.allocate(&req("net1", "c1", &rs)).unwrap();
    s.compact().unwrap();
    drop(s);
    assert_eq!(mode(&data), 0o755);
    assert_eq!(mode(&data.join("net1")), 0o700);
    for f in ["lock", "journal", "snapshot"] {
        assert_eq!(mode(&data.join("net1").join(f)), 0o600, "{f}");
    }

    // A journal replaced by a link to a file someone wants a root process to write.
    let victim = d.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let journal = data.join("net1").join("journal");
    std::fs::remove_file(&journal).unwrap();
    std::os::unix::fs::symlink(&victim, &journal).unwrap();
    let e = Store::open(&data, "net1", StoreOptions::default())
        .unwrap()
        .allocate(&req("net1", "c2", &rs))
        .unwrap_err();
    assert!(e.to_string().contains("is a symbolic link"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

    // A lock file planted as a link is not followed either.
    let lock = data.join("net2");
    std::fs::create_dir(&lock).unwrap();
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&victim, lock.join("lock")).unwrap();
    let e = Store::open(&data, "net2", StoreOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("is a symbolic link"), "{e}");
}

#[test]
fn as_root_a_data_dir_others_can_write_is_refused() {
    skip_unless_root!("to chown the data directory");
    let d = temp_dir("files-owner");
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = Store::open(&data, "net1", StoreOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(
        e.to_string()
            .contains("must be a directory owned by root and writable by no one else"),
        "{e}"
    );
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&data, Some(65534), None).unwrap();
    assert!(Store::open(&data, "net1", StoreOptions::default()).is_err());
    std::os::unix::fs::chown(&data, Some(0), None).unwrap();
    assert!(Store::open(&data, "net1", StoreOptions::default()).is_ok());
}
