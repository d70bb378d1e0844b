//! Damaged files: refused with the place of the damage, left as they are, and salvaged by
//! fsck; other networks unaffected.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::testkit::{alloc, daemon, held, open, opts, Net1};
use crate::config::RangeSet;
use crate::fsck::{self, FsckOptions};
use crate::journal::{self, HEADER_LEN};
use crate::store::*;
use crate::testutil::req;
use crate::ErrorKind;

/// The journal's bytes and the offset of each record.
fn record_starts(journal: &Path) -> (Vec<u8>, Vec<usize>) {
    let bytes = std::fs::read(journal).unwrap();
    let out = journal::decode(&bytes[HEADER_LEN as usize..], HEADER_LEN).unwrap();
    let mut starts = Vec::new();
    let mut off = HEADER_LEN as usize;
    for r in &out.records {
        starts.push(off);
        off += journal::encode(r).unwrap().len();
    }
    assert_eq!(off, bytes.len());
    (bytes, starts)
}

#[derive(Debug, Clone, Copy)]
enum Harm {
    FlipBit,
    HugeLength,
}

/// The case: c1..c5 allocated in net1 of a fresh directory, then record 2 (c2's)
/// damaged.
struct Damaged {
    dir: TempDir,
    rs: Vec<RangeSet>,
    journal: PathBuf,
    /// The journal as damaged.
    bytes: Vec<u8>,
    /// The offset of each record.
    starts: Vec<usize>,
    /// The addresses of c1..c5.
    addrs: Vec<IpAddr>,
}

fn damaged_five(tag: &str, harm: Harm) -> Damaged {
    let Net1 { dir, rs, acked, .. } = Net1::new(tag, &["c1", "c2", "c3", "c4", "c5"]);
    let addrs = acked.into_iter().map(|(_, a)| a).collect();
    let journal = dir.path().join("net1/journal");
    let (mut bytes, starts) = record_starts(&journal);
    match harm {
        Harm::FlipBit => bytes[(starts[1] + starts[2]) / 2] ^= 0x04,
        Harm::HugeLength => {
            bytes[starts[1]..starts[1] + 4].copy_from_slice(&u32::MAX.to_le_bytes())
        }
    }
    std::fs::write(&journal, &bytes).unwrap();
    Damaged {
        dir,
        rs,
        journal,
        bytes,
        starts,
        addrs,
    }
}

#[test]
fn damage_before_valid_records_is_refused_and_the_journal_left_as_is() {
    for harm in [Harm::FlipBit, Harm::HugeLength] {
        let dm = damaged_five("damage", harm);
        let d = &dm.dir;

        let e = alloc(&mut open(d.path(), "net1"), "c6", &dm.rs).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{harm:?}: {e}");
        let msg = e.to_string();
        for needle in [
            dm.journal.display().to_string(),
            format!("byte offset {}", dm.starts[1]),
            format!("valid record follows at offset {}", dm.starts[2]),
            format!(
                "cnikit ipamd fsck --data-dir {} --network net1",
                d.path().display()
            ),
        ] {
            assert!(msg.contains(&needle), "{harm:?}: no {needle:?} in {msg}");
        }
        // The in-process entry point, and reads, refuse the same way.
        let op = Op::Allocate(req("net1", "c7", &dm.rs));
        let e = run_once(d.path(), "net1", opts(), op).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(
            open(d.path(), "net1").leases().unwrap_err().kind(),
            ErrorKind::Io
        );
        assert_eq!(
            std::fs::read(&dm.journal).unwrap(),
            dm.bytes,
            "{harm:?}: journal changed"
        );
    }
}

#[test]
fn damage_found_by_a_handle_that_read_the_records_before_is_refused_too() {
    let mut t = Net1::new("damage-incr", &["c1"]);
    let mut other = open(t.dir.path(), "net1");
    alloc(&mut other, "c2", &t.rs).unwrap();
    alloc(&mut other, "c3", &t.rs).unwrap();
    // `s` has read up to c1; the two records it has not read yet get damaged.
    let path = t.dir.path().join("net1/journal");
    let (mut bytes, starts) = record_starts(&path);
    bytes[starts[1] + 12] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let e = t.alloc("c4").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.to_string().contains(&format!("offset {}", starts[1])),
        "{e}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn fsck_reports_the_damage_and_repair_keeps_every_valid_record() {
    for harm in [Harm::FlipBit, Harm::HugeLength] {
        let dm = damaged_five("fsck", harm);
        let d = &dm.dir;
        let mut fo = FsckOptions {
            data_dir: d.path().to_path_buf(),
            network: Some("net1".into()),
            repair: false,
        };

        let r = fsck::run(&fo).unwrap().remove(0);
        assert!(r.is_damaged() && r.needs_attention(), "{harm:?}: {r:?}");
        assert_eq!(r.journal.status, "damaged");
        let ranges: Vec<(u64, u64)> = r
            .journal
            .damaged
            .iter()
            .map(|x| (x.offset, x.length))
            .collect();
        assert_eq!(
            ranges,
            vec![(dm.starts[1] as u64, (dm.starts[2] - dm.starts[1]) as u64)]
        );
        assert_eq!(
            (r.journal.records_ok, r.journal.records_after_damage),
            (4, 3)
        );
        assert_eq!(r.leases, 4);
        assert!(r.repaired.is_none());
        let text = r.render(d.path());
        assert!(
            text.contains("DAMAGED") && text.contains("--repair"),
            "{text}"
        );
        if let Harm::HugeLength = harm {
            // The record's JSON is intact: the report says which lease is lost.
            let lost = format!("the allocation of {} to c2/eth0", dm.addrs[1]);
            assert_eq!(r.journal.damaged[0].looks_like.as_deref(), Some(&*lost));
            assert!(text.contains(&lost), "{text}");
        }
        assert_eq!(
            std::fs::read(&dm.journal).unwrap(),
            dm.bytes,
            "fsck without --repair wrote"
        );

        fo.network = None;
        fo.repair = true;
        let r = fsck::run(&fo).unwrap().remove(0);
        assert!(!r.needs_attention(), "{r:?}");
        let rep = r.repaired.as_ref().unwrap();
        assert_eq!(rep.kept.len(), 1, "no snapshot to keep");
        assert_eq!(std::fs::read(&rep.kept[0]).unwrap(), dm.bytes);
        let mode = std::fs::metadata(&rep.kept[0])
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o600);
        assert!(r.render(d.path()).contains("cannot be recovered"));

        let mut s = open(d.path(), "net1");
        let kept = vec![
            ("c1".to_string(), dm.addrs[0]),
            ("c3".to_string(), dm.addrs[2]),
            ("c4".to_string(), dm.addrs[3]),
            ("c5".to_string(), dm.addrs[4]),
        ];
        assert_eq!(held(&mut s), kept, "{harm:?}");
        for i in 0..20 {
            let a = alloc(&mut s, &format!("n{i}"), &dm.rs).unwrap();
            assert!(kept.iter().all(|(_, k)| *k != a), "{a} handed out twice");
        }
        let again = fsck::run(&fo).unwrap().remove(0);
        assert!(!again.is_damaged() && again.repaired.is_none(), "{again:?}");
        assert_eq!(again.leases, 24);
    }
}

#[test]
fn damaged_snapshot_is_refused_and_version_1_still_loads() {
    let mut t = Net1::new("snap", &["c1", "c2"]);
    t.s.locked(|st| st.compact()).unwrap();
    t.alloc("c3").unwrap();
    let path = t.dir.path().join("net1/snapshot");
    let good = std::fs::read(&path).unwrap();
    assert!(good.starts_with(b"ipamd-snapshot v2 crc32="));

    // A plain JSON version 1 snapshot (as written before checksums) loads.
    let mut v1 = crate::snapshot::decode(&good).unwrap();
    v1.version = 1;
    std::fs::write(&path, serde_json::to_vec(&v1).unwrap()).unwrap();
    let names = |s: &mut Store| held(s).into_iter().map(|(c, _)| c).collect::<Vec<_>>();
    assert_eq!(names(&mut open(t.dir.path(), "net1")), ["c1", "c2", "c3"]);

    // One flipped bit (c1 -> c0) still parses as JSON: only the checksum tells.
    let at = good.windows(4).position(|w| w == b"\"c1\"").unwrap() + 2;
    let mut bad = good.clone();
    bad[at] ^= 0x01;
    std::fs::write(&path, &bad).unwrap();
    let e = open(t.dir.path(), "net1").leases().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    assert!(e.to_string().contains("checksum mismatch"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), bad);

    let fo = FsckOptions {
        data_dir: t.dir.path().to_path_buf(),
        network: Some("net1".into()),
        repair: true,
    };
    let r = fsck::run(&fo).unwrap().remove(0);
    assert_eq!(r.snapshot.status, "bad");
    assert!(r.damage[0].contains("may not be what was written"), "{r:?}");
    let kept = &r.repaired.as_ref().unwrap().kept;
    assert!(kept.iter().any(|p| std::fs::read(p).unwrap() == bad));
    assert_eq!(names(&mut open(t.dir.path(), "net1")), ["c0", "c2", "c3"]);
}

#[test]
fn a_damaged_network_does_not_stop_the_others() {
    let dm = damaged_five("isolated", Harm::FlipBit);
    let d = &dm.dir;
    alloc(&mut open(d.path(), "net2"), "x1", &dm.rs).unwrap();

    // In-process, as the plugin does without a daemon.
    let ok = run_once(
        d.path(),
        "net2",
        opts(),
        Op::Allocate(req("net2", "x2", &dm.rs)),
    );
    assert!(ok.is_ok(), "{ok:?}");

    // The daemon starts (its start-up reclaim skips the damaged network) and serves net2.
    let (h, c) = daemon(&d.path().join("ipamd.sock"), d.path());
    c.allocate(&req("net2", "x3", &dm.rs)).unwrap();
    let e = c.allocate(&req("net1", "c6", &dm.rs)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("byte offset {}", dm.starts[1])),
        "{e}"
    );
    assert_eq!(c.leases(Some("net2")).unwrap().len(), 3);
    h.stop().unwrap();
    assert_eq!(std::fs::read(dm.journal).unwrap(), dm.bytes);
}

#[test]
fn fsck_repairs_a_bad_header_and_reports_a_missing_snapshot() {
    let t = Net1::new("fsck-hdr", &["c1", "c2"]);
    let path = t.dir.path().join("net1/journal");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let e = open(t.dir.path(), "net1").leases().unwrap_err();
    assert!(e.to_string().contains("cnikit ipamd fsck"), "{e}");
    let mut fo = FsckOptions {
        data_dir: t.dir.path().to_path_buf(),
        network: None,
        repair: true,
    };
    let r = fsck::run(&fo).unwrap().remove(0);
    assert!(r.damage[0].contains("bad header"), "{r:?}");
    assert_eq!((r.journal.records_ok, r.leases), (2, 2));
    assert_eq!(held(&mut open(t.dir.path(), "net1")).len(), 2);

    // The repair wrote a snapshot of generation 1; without it the journal (generation 1)
    // has nothing to continue: the leases in that snapshot are lost, and fsck says so.
    alloc(&mut open(t.dir.path(), "net1"), "c3", &t.rs).unwrap();
    std::fs::remove_file(t.dir.path().join("net1/snapshot")).unwrap();
    fo.repair = false;
    let r = fsck::run(&fo).unwrap().remove(0);
    assert!(r.needs_attention());
    assert!(
        r.damage[0].contains("newer than the snapshot (absent)"),
        "{r:?}"
    );
    assert_eq!(r.leases, 1);
}
