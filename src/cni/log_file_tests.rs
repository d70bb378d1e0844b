use super::*;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

#[test]
fn rfc3339_in_utc_with_milliseconds() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    assert_eq!(rfc3339(t), "2023-11-14T22:13:20.123Z");
    // A leap day and the last second of a year.
    let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
    assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    let t = UNIX_EPOCH + Duration::from_secs(1_735_689_599);
    assert_eq!(rfc3339(t), "2024-12-31T23:59:59.000Z");
}

#[test]
fn log_file_key_is_matched_as_go_does() {
    assert_eq!(
        log_file_of(br#"{"logFile": "/var/log/cni.log"}"#).as_deref(),
        Some("/var/log/cni.log")
    );
    assert_eq!(log_file_of(br#"{"LogFile": "/a"}"#).as_deref(), Some("/a"));
    assert_eq!(log_file_of(br#"{"logFile": ""}"#), None);
    assert_eq!(log_file_of(br#"{"logFile": 7}"#), None);
    assert_eq!(log_file_of(br#"{"ipam": {"logFile": "/a"}}"#), None);
    assert_eq!(log_file_of(b"not json"), None);
}

#[test]
fn lines_are_split_across_chunks() {
    let mut l = Lines::default();
    assert!(l.push(b"DEL: ign").is_empty());
    assert_eq!(l.push(b"oring\r\nsecond\nthi"), ["DEL: ignoring", "second"]);
    assert_eq!(l.rest().as_deref(), Some("thi"));
    assert_eq!(l.rest(), None);
}

#[test]
fn control_characters_cannot_forge_lines() {
    assert_eq!(clean("abc\nfake 2025 line\t"), "abc\\nfake 2025 line\\t");
    assert_eq!(clean("plain ü"), "plain ü");
}

#[test]
fn relative_paths_are_refused() {
    let err = open("cni.log").unwrap_err();
    assert!(err.contains("absolute"), "{err}");
}

#[test]
fn a_new_file_is_0600_and_appended_to() {
    let dir = tmp();
    let path = dir.path().join("cni.log");
    let p = path.to_str().unwrap();
    (&open(p).unwrap()).write_all(b"one\n").unwrap();
    (&open(p).unwrap()).write_all(b"two\n").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o600);
}

#[test]
fn symlinks_fifos_directories_and_hard_links_are_refused() {
    let dir = tmp();
    let target = dir.path().join("target");
    std::fs::write(&target, "keep\n").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = open(link.to_str().unwrap()).unwrap_err();
    assert!(err.contains("symbolic link"), "{err}");

    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err = open(fifo.to_str().unwrap()).unwrap_err();
    assert!(err.contains("regular file"), "{err}");

    let err = open(dir.path().to_str().unwrap()).unwrap_err();
    assert!(err.contains("regular file"), "{err}");

    let hard = dir.path().join("hard");
    std::fs::hard_link(&target, &hard).unwrap();
    let err = open(hard.to_str().unwrap()).unwrap_err();
    assert!(err.contains("hard links"), "{err}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");
}

#[test]
fn a_missing_directory_is_reported_not_created() {
    let dir = tmp();
    let path = dir.path().join("nope/cni.log");
    let err = open(path.to_str().unwrap()).unwrap_err();
    assert!(err.contains("cannot open"), "{err}");
    assert!(!dir.path().join("nope").exists());
}
