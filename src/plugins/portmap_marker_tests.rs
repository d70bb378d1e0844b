//! The marker files under hostile conditions: container IDs of any length,
//! umask 000, directories and files planted by someone else.

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

struct Base(PathBuf);

impl Base {
    fn new(tag: &str) -> Base {
        let p = std::env::temp_dir().join(format!("cnikit-marker-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        Base(p)
    }
    fn portmap(&self) -> PathBuf {
        self.0.join("cnikit/portmap")
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const SUB: [&str; 2] = ["cnikit", "portmap"];

fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_container_id_of_any_length_gets_a_marker() {
    let b = Base::new("long");
    let key = ["net", &"c".repeat(1000), "eth0"].join("\0");
    set_in(&b.0, &SUB, key.as_bytes()).unwrap();
    assert!(is_set_in(&b.0, &SUB, key.as_bytes()));
    assert!(!is_set_in(&b.0, &SUB, b"net\0c\0eth0"));
    clear_in(&b.0, &SUB, key.as_bytes()).unwrap();
    assert!(!is_set_in(&b.0, &SUB, key.as_bytes()));
    assert_eq!(name(key.as_bytes()).as_bytes().len(), 64);
}

#[test]
fn under_umask_000_the_modes_are_still_0755_0700_and_0600() {
    let b = Base::new("umask");
    // SAFETY: umask cannot fail; restored right after.
    let old = unsafe { libc::umask(0) };
    let made = set_in(&b.0, &SUB, b"n\0c\0eth0");
    unsafe { libc::umask(old) };
    made.unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&b.0.join("cnikit")), 0o755);
    assert_eq!(mode(&b.portmap()), 0o700);
    assert_eq!(
        mode(&b.portmap().join(name(b"n\0c\0eth0").to_str().unwrap())),
        0o600
    );
}

#[test]
fn a_directory_others_can_write_is_refused() {
    let b = Base::new("open");
    std::fs::create_dir_all(b.portmap()).unwrap();
    std::fs::set_permissions(b.portmap(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = set_in(&b.0, &SUB, b"n\0c\0eth0").unwrap_err();
    assert!(e.to_string().contains("refusing"), "{e}");
    assert_eq!(std::fs::read_dir(b.portmap()).unwrap().count(), 0);
}

#[test]
fn a_symlink_in_place_of_the_directory_is_refused() {
    let b = Base::new("dirlink");
    let elsewhere = b.0.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::create_dir(b.0.join("cnikit")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, b.portmap()).unwrap();
    let e = set_in(&b.0, &SUB, b"n\0c\0eth0").unwrap_err();
    assert!(e.to_string().contains("refusing"), "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

#[test]
fn a_planted_marker_symlink_is_not_followed_nor_counted() {
    let b = Base::new("filelink");
    let victim = b.0.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    set_in(&b.0, &SUB, b"other\0c\0eth0").unwrap();
    let marker = b.portmap().join(name(b"n\0c\0eth0").to_str().unwrap());
    std::os::unix::fs::symlink(&victim, &marker).unwrap();
    assert!(set_in(&b.0, &SUB, b"n\0c\0eth0").is_err());
    assert!(!is_set_in(&b.0, &SUB, b"n\0c\0eth0"));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    clear_in(&b.0, &SUB, b"n\0c\0eth0").unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn a_directory_owned_by_nobody_is_refused() {
    if !root() {
        eprintln!("skipping: needs root to chown");
        return;
    }
    let b = Base::new("nobody");
    std::fs::create_dir_all(b.portmap()).unwrap();
    std::os::unix::fs::chown(b.0.join("cnikit"), Some(65534), Some(65534)).unwrap();
    let e = set_in(&b.0, &SUB, b"n\0c\0eth0").unwrap_err();
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    assert_eq!(std::fs::metadata(b.portmap()).unwrap().uid(), 0);
    assert_eq!(std::fs::read_dir(b.portmap()).unwrap().count(), 0);
}

#[test]
fn a_sticky_parent_is_fine_but_not_a_sticky_marker_directory() {
    let b = Base::new("sticky");
    std::fs::create_dir(b.0.join("cnikit")).unwrap();
    let sticky = std::fs::Permissions::from_mode(0o1777);
    std::fs::set_permissions(b.0.join("cnikit"), sticky.clone()).unwrap();
    set_in(&b.0, &SUB, b"n\0c\0eth0").unwrap();
    assert!(is_set_in(&b.0, &SUB, b"n\0c\0eth0"));
    std::fs::set_permissions(b.portmap(), sticky).unwrap();
    assert!(set_in(&b.0, &SUB, b"n\0c\0eth1").is_err());
}
