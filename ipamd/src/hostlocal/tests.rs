use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::fault::{self, Call};

const NET: &str = "hl";

fn sets(json: &str) -> Vec<RangeSet> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    crate::config::IpamConfig::ranges_from_json(&v).unwrap()
}

/// A store in a temp dir of its own (kept as long as the dir), and the range sets of
/// `json`.
fn store(json: &str) -> (tempfile::TempDir, HostLocal, Vec<RangeSet>) {
    let d = tempfile::tempdir().unwrap();
    let hl = HostLocal::new(d.path());
    (d, hl, sets(json))
}

fn key(cid: &str, ifname: &str) -> Attachment {
    Attachment::new(NET, cid, ifname)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}

fn lease_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.parse::<IpAddr>().is_ok())
        .collect();
    v.sort();
    v
}

#[test]
fn files_are_the_reference_format() {
    let (_dir, hl, s) = store(r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd01::/64"}]]"#);
    let a = hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap();
    assert_eq!(a[0].address.to_string(), "10.1.0.2/24");
    assert_eq!(a[0].gateway, Some(ip("10.1.0.1")));
    assert_eq!(a[1].address.to_string(), "fd01::2/64");
    let net = hl.network_dir(NET);
    assert_eq!(read(&net, "10.1.0.2"), "c1\r\neth0");
    assert_eq!(read(&net, "fd01::2"), "c1\r\neth0");
    assert_eq!(read(&net, "last_reserved_ip.0"), "10.1.0.2");
    assert_eq!(read(&net, "last_reserved_ip.1"), "fd01::2");
    let mode = |n: &str| std::fs::metadata(net.join(n)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("10.1.0.2"), 0o600);
    assert_eq!(mode("lock"), 0o600);
    assert_eq!(
        std::fs::metadata(&net).unwrap().permissions().mode() & 0o7777,
        0o700
    );
}

#[test]
fn repeated_add_returns_the_same_and_del_frees_exactly_its_own() {
    let (_dir, hl, s) = store(r#"[[{"subnet":"10.1.0.0/24"}]]"#);
    let a1 = hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap();
    assert_eq!(hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap(), a1);
    let b = hl.allocate(&key("c1", "eth1"), &s, &[]).unwrap();
    assert_ne!(a1, b);
    assert_eq!(hl.held(&key("c1", "eth0")).unwrap(), [ip("10.1.0.2")]);
    assert_eq!(hl.release(&key("c1", "eth0")).unwrap(), 1);
    assert_eq!(hl.release(&key("c1", "eth0")).unwrap(), 0);
    assert_eq!(lease_names(&hl.network_dir(NET)), ["10.1.0.3"]);
    // The round robin does not go back to the freed address at once.
    let c = hl.allocate(&key("c2", "eth0"), &s, &[]).unwrap();
    assert_eq!(c[0].address.to_string(), "10.1.0.4/24");
}

#[test]
fn id_only_leases_are_kept_taken_and_freed_by_their_container() {
    let (_dir, hl, s) = store(r#"[[{"subnet":"10.1.0.0/29"}]]"#);
    let net = hl.network_dir(NET);
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.0.2"), "old-ctr").unwrap();
    std::fs::write(net.join("10.1.0.3"), "other\r\neth0").unwrap();
    let a = hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap();
    assert_eq!(a[0].address.to_string(), "10.1.0.4/29");
    assert_eq!(hl.held(&key("old-ctr", "eth9")).unwrap(), [ip("10.1.0.2")]);
    assert_eq!(hl.release(&key("old-ctr", "eth9")).unwrap(), 1);
    assert_eq!(lease_names(&net), ["10.1.0.3", "10.1.0.4"]);
}

#[test]
fn unknown_network_creates_nothing() {
    let d = tempfile::tempdir().unwrap();
    let hl = HostLocal::new(d.path().join("data"));
    assert_eq!(hl.release(&key("c1", "eth0")).unwrap(), 0);
    assert!(hl.held(&key("c1", "eth0")).unwrap().is_empty());
    assert_eq!(hl.gc(NET, &[]).unwrap(), 0);
    hl.status(NET, &sets(r#"[[{"subnet":"10.1.0.0/24"}]]"#))
        .unwrap();
    assert!(!d.path().join("data").exists());
    // A name no ADD accepts has nothing to free either.
    let long = Attachment::new(&"n".repeat(201), "c1", "eth0");
    assert_eq!(hl.release(&long).unwrap(), 0);
    let e = hl.allocate(&long, &sets(r#"[[{"subnet":"10.1.0.0/24"}]]"#), &[]);
    assert_eq!(e.unwrap_err().kind(), ErrorKind::InvalidConfig);
}

#[test]
fn gc_frees_all_but_the_valid() {
    let (_dir, hl, s) = store(r#"[[{"subnet":"10.1.0.0/24"}]]"#);
    for c in ["c1", "c2", "c3"] {
        hl.allocate(&key(c, "eth0"), &s, &[]).unwrap();
    }
    let net = hl.network_dir(NET);
    std::fs::write(net.join("10.1.0.50"), "c3").unwrap();
    std::fs::write(net.join("10.1.0.51"), "gone").unwrap();
    std::fs::write(net.join("10.1.0.52"), vec![b'x'; 10_000]).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", net.join("10.1.0.53")).unwrap();
    let freed = hl.gc(NET, &[key("c2", "eth0"), key("c3", "eth1")]).unwrap();
    assert_eq!(
        freed, 4,
        "c1, c3/eth0, the ID-only gone, the unreadable one"
    );
    assert_eq!(
        lease_names(&net),
        ["10.1.0.3", "10.1.0.50", "10.1.0.53"],
        "c2, c3's ID-only lease, the link"
    );
    assert!(std::fs::read_to_string("/etc/passwd").is_ok());
}

#[test]
fn planted_link_is_taken_and_never_followed() {
    let (d, hl, s) = store(r#"[[{"subnet":"10.1.0.0/29"}]]"#);
    let net = hl.network_dir(NET);
    std::fs::create_dir_all(&net).unwrap();
    let target = d.path().join("target");
    std::fs::write(&target, "c1\r\neth0").unwrap();
    std::os::unix::fs::symlink(&target, net.join("10.1.0.2")).unwrap();
    let a = hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap();
    assert_eq!(
        a[0].address.to_string(),
        "10.1.0.3/29",
        "the link's content is not read"
    );
    let e = hl
        .allocate(&key("c2", "eth0"), &s, &[ip("10.1.0.2")])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    hl.release(&key("c1", "eth0")).unwrap();
    assert_eq!(read(d.path(), "target"), "c1\r\neth0");
    assert!(net.join("10.1.0.2").symlink_metadata().is_ok());
}

#[test]
fn status_says_when_a_set_is_full() {
    let (_dir, hl, s) = store(r#"[[{"subnet":"10.1.0.0/30"}]]"#);
    hl.status(NET, &s).unwrap();
    hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap();
    let e = hl.status(NET, &s).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exhausted);
    let e = hl.allocate(&key("c2", "eth0"), &s, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exhausted);
}

#[test]
fn a_failed_write_leaves_nothing() {
    for (call, skip) in [
        (Call::Write, 0),
        (Call::Fsync, 0),
        (Call::Write, 1),
        (Call::Fsync, 1),
        (Call::Write, 2),
    ] {
        let d = tempfile::tempdir().unwrap();
        let hl = HostLocal::new(d.path());
        let s = sets(r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd01::/64"}]]"#);
        // Create the directory first so that the plan only meets the ADD's own calls.
        hl.allocate(&key("c0", "eth0"), &s, &[]).unwrap();
        hl.release(&key("c0", "eth0")).unwrap();
        fault::inject(d.path(), call, skip, 1);
        let e = hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{call:?} {skip}: {e}");
        assert_eq!(fault::fired(d.path(), call), 1);
        assert!(
            lease_names(&hl.network_dir(NET)).is_empty(),
            "{call:?} {skip}: a lease is left"
        );
    }
}

#[test]
fn a_held_lock_times_out_with_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let hl = HostLocal::new(d.path()).with_lock_timeout(Duration::from_millis(100));
    let s = sets(r#"[[{"subnet":"10.1.0.0/24"}]]"#);
    hl.allocate(&key("c0", "eth0"), &s, &[]).unwrap();
    let holder = std::fs::File::open(hl.network_dir(NET).join("lock")).unwrap();
    holder.lock().unwrap();
    let e = hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("timed out"), "{e}");
    holder.unlock().unwrap();
    hl.allocate(&key("c1", "eth0"), &s, &[]).unwrap();
}

#[test]
fn parallel_allocations_never_share_an_address() {
    let d = tempfile::tempdir().unwrap();
    let hl = Arc::new(HostLocal::new(d.path()));
    let s = Arc::new(sets(r#"[[{"subnet":"10.1.0.0/24"}]]"#));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (hl, s) = (hl.clone(), s.clone());
            std::thread::spawn(move || {
                (0..20)
                    .map(|i| {
                        hl.allocate(&key(&format!("c{t}-{i}"), "eth0"), &s, &[])
                            .unwrap()
                    })
                    .map(|a| a[0].address.addr())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all: Vec<IpAddr> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "an address was handed out twice");
    assert_eq!(lease_names(&hl.network_dir(NET)).len(), 160);
}
