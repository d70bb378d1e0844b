//! A damaged store end to end: the plugin refuses that network with code 5 and
//! says where the damage is, other networks keep working, and `cnikit ipamd
//! fsck` reports it, exits non-zero, and with --repair keeps every valid record.

use super::*;
use std::process::Command;

/// `cnikit ipamd fsck --data-dir DATA ARGS…`: (exit code, stdout).
fn fsck(data: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(cnikit_exe())
        .args(["ipamd", "fsck", "--data-dir"])
        .arg(data)
        .args(args)
        .output()
        .expect("run cnikit ipamd fsck");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "fsck panicked: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("fsck exited by a signal"), stdout)
}

/// Offsets of the records of a journal (16-byte header, then `[len][crc][payload]`).
fn record_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut off = 16;
    while off + 8 <= bytes.len() {
        starts.push(off);
        let len = u32::from_le_bytes(bytes[off..off + 4].try_into().expect("4 bytes"));
        off += 8 + len as usize;
    }
    assert_eq!(off, bytes.len(), "the journal should hold whole records");
    starts
}

/// Proves (the case: five ADDs, one bit flipped in the second record):
/// the next ADD fails with code 5 naming the journal and the offsets, and the
/// journal stays byte for byte as it was (no address handed out again); a
/// daemon still starts and another network still allocates; fsck reports the
/// damaged range and exits 1, and `--repair` keeps the damaged journal aside,
/// keeps c1, c3, c4 and c5, after which ADD works and never hands out theirs.
fn damaged_journal(mode: Mode, test: &str) {
    let mut fix = Fix::new(test, mode);
    let conf = fix.conf_24();
    let addrs: Vec<IpAddr> = (1..=5)
        .map(|i| only_addr(&fix.add(&format!("c{i}"), &conf).result()))
        .collect();
    // A running daemon has the records in memory already: damage the file while
    // it is stopped, as after a reboot.
    fix.stop_daemon();
    let journal = fix.data.join(NET).join("journal");
    let mut bytes = std::fs::read(&journal).expect("read the journal");
    let starts = record_starts(&bytes);
    bytes[(starts[1] + starts[2]) / 2] ^= 0x04;
    std::fs::write(&journal, &bytes).expect("write the journal");
    if mode == Mode::Daemon {
        fix.start_daemon(&[], &[]);
    }

    fix.add("c6", &conf).expect_err(
        5,
        &[
            &journal.display().to_string(),
            &format!("byte offset {}", starts[1]),
            &format!("offset {}", starts[2]),
            "cnikit ipamd fsck",
        ],
    );
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        bytes,
        "the journal changed"
    );
    let mut other = conf.clone();
    other["name"] = json!("ipamd-it-other");
    fix.add("x1", &other).result();

    let (code, text) = fsck(&fix.data, &["--network", NET]);
    assert_eq!(code, 1, "{text}");
    let range = format!("{} byte(s) at offset {}", starts[2] - starts[1], starts[1]);
    assert!(text.contains("DAMAGED") && text.contains(&range), "{text}");
    let (code, text) = fsck(&fix.data, &["--network", NET, "--json"]);
    assert_eq!(code, 1, "{text}");
    let report: Value = serde_json::from_str(&text).expect("fsck --json prints JSON");
    assert_eq!(report[0]["journal"]["damaged"][0]["offset"], starts[1]);
    assert_eq!(report[0]["journal"]["records_after_damage"], 3);
    assert_eq!(std::fs::read(&journal).unwrap(), bytes, "fsck wrote");

    let (code, text) = fsck(&fix.data, &["--repair"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("cannot be recovered"), "{text}");
    let kept: Vec<PathBuf> = std::fs::read_dir(fix.data.join(NET))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("journal.damaged-"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read(&kept[0]).unwrap(), bytes);

    let held: Vec<(String, IpAddr)> = fix.leases().into_iter().map(|l| (l.cid, l.addr)).collect();
    let want: Vec<(String, IpAddr)> = [0, 2, 3, 4]
        .iter()
        .map(|&i| (format!("c{}", i + 1), addrs[i]))
        .collect();
    assert_eq!(held, want);
    for i in 0..5 {
        let a = only_addr(&fix.add(&format!("n{i}"), &conf).result());
        assert!(!want.iter().any(|(_, w)| *w == a), "{a} handed out twice");
    }
    let (code, text) = fsck(&fix.data, &[]);
    assert_eq!(code, 0, "{text}");
}
both_modes!(damaged_journal);
