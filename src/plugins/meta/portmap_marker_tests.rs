//! The marker files under hostile conditions: container IDs of any length,
//! umask 000, directories and files planted by someone else.

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use tempfile::tempdir;

/// Where the markers of a base directory `b` go.
fn portmap(b: &Path) -> PathBuf {
    b.join("cnikit/portmap")
}

const SUB: [&str; 2] = ["cnikit", "portmap"];

fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_container_id_of_any_length_gets_a_marker() {
    let dir = tempdir().unwrap();
    let b = dir.path();
    let key = ["net", &"c".repeat(1000), "eth0"].join("\0");
    set_in(b, &SUB, key.as_bytes()).unwrap();
    assert!(is_set_in(b, &SUB, key.as_bytes()));
    assert!(!is_set_in(b, &SUB, b"net\0c\0eth0"));
    clear_in(b, &SUB, key.as_bytes()).unwrap();
    assert!(!is_set_in(b, &SUB, key.as_bytes()));
    assert_eq!(name(key.as_bytes()).as_bytes().len(), 64);
}

#[test]
fn under_umask_000_the_modes_are_still_0755_0700_and_0600() {
    let dir = tempdir().unwrap();
    let b = dir.path();
    // SAFETY: umask cannot fail; restored right after.
    let old = unsafe { libc::umask(0) };
    let made = set_in(b, &SUB, b"n\0c\0eth0");
    unsafe { libc::umask(old) };
    made.unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&b.join("cnikit")), 0o755);
    assert_eq!(mode(&portmap(b)), 0o700);
    assert_eq!(
        mode(&portmap(b).join(name(b"n\0c\0eth0").to_str().unwrap())),
        0o600
    );
}

#[test]
fn a_directory_others_can_write_is_refused() {
    let dir = tempdir().unwrap();
    let b = dir.path();
    std::fs::create_dir_all(portmap(b)).unwrap();
    std::fs::set_permissions(portmap(b), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = set_in(b, &SUB, b"n\0c\0eth0").unwrap_err();
    assert!(e.to_string().contains("refusing"), "{e}");
    assert_eq!(std::fs::read_dir(portmap(b)).unwrap().count(), 0);
}

#[test]
fn a_symlink_in_place_of_the_directory_is_refused() {
    let dir = tempdir().unwrap();
    let b = dir.path();
    let elsewhere = b.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::create_dir(b.join("cnikit")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, portmap(b)).unwrap();
    let e = set_in(b, &SUB, b"n\0c\0eth0").unwrap_err();
    assert!(e.to_string().contains("refusing"), "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

#[test]
fn a_planted_marker_symlink_is_not_followed_nor_counted() {
    let dir = tempdir().unwrap();
    let b = dir.path();
    let victim = b.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    set_in(b, &SUB, b"other\0c\0eth0").unwrap();
    let marker = portmap(b).join(name(b"n\0c\0eth0").to_str().unwrap());
    std::os::unix::fs::symlink(&victim, &marker).unwrap();
    assert!(set_in(b, &SUB, b"n\0c\0eth0").is_err());
    assert!(!is_set_in(b, &SUB, b"n\0c\0eth0"));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    clear_in(b, &SUB, b"n\0c\0eth0").unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn a_directory_owned_by_nobody_is_refused() {
    if !root() {
        eprintln!("skipping: needs root to chown");
        return;
    }
    let dir = tempdir().unwrap();
    let b = dir.path();
    std::fs::create_dir_all(portmap(b)).unwrap();
    std::os::unix::fs::chown(b.join("cnikit"), Some(65534), Some(65534)).unwrap();
    let e = set_in(b, &SUB, b"n\0c\0eth0").unwrap_err();
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    assert_eq!(std::fs::metadata(portmap(b)).unwrap().uid(), 0);
    assert_eq!(std::fs::read_dir(portmap(b)).unwrap().count(), 0);
}

#[test]
fn a_sticky_parent_is_fine_but_not_a_sticky_marker_directory() {
    let dir = tempdir().unwrap();
    let b = dir.path();
    std::fs::create_dir(b.join("cnikit")).unwrap();
    let sticky = std::fs::Permissions::from_mode(0o1777);
    std::fs::set_permissions(b.join("cnikit"), sticky.clone()).unwrap();
    set_in(b, &SUB, b"n\0c\0eth0").unwrap();
    assert!(is_set_in(b, &SUB, b"n\0c\0eth0"));
    std::fs::set_permissions(portmap(b), sticky).unwrap();
    assert!(set_in(b, &SUB, b"n\0c\0eth1").is_err());
}
