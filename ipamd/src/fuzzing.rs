//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz). The code that reads untrusted
//! bytes (journal frames, snapshots, request bodies) is crate-private; these thin wrappers
//! run exactly that code on arbitrary input, so the fuzzer tests what the daemon runs and
//! not a copy. Nothing else calls them. Errors are expected and ignored: the property is
//! that no input panics or makes the code allocate or loop without bound. Where the code
//! promises more (replay keeps its indexes consistent, a snapshot re-reads as written),
//! that is asserted too, so a violation is a crash the fuzzer reports.

use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::Path;

use crate::api::{AllocateRequest, GcRequest, LeaseKey, StatusRequest};
use crate::attachment::check_network;
use crate::config::canonicalize_range_sets;
use crate::journal::{self, HEADER_LEN};
use crate::pool::Pool;
use crate::server::decode_body;
use crate::service::Service;
use crate::snapshot;
use crate::store::{answer_empty, Op, State};

/// Quiet logging for the fuzz targets that replay stores: replaying hand-edited files warns
/// about every moved lease, noise at fuzzing speed.
#[doc(hidden)]
pub fn quiet_log() {
    crate::log::set_level(crate::log::Level::Error);
}

/// The journal target's input: a journal file, and one without the journal's header also
/// as one record payload a line, framed with valid lengths and checksums. Random bytes
/// almost never pass a CRC; this way mutations reach record decoding and replay.
#[doc(hidden)]
pub fn journal_input(bytes: &[u8]) {
    journal_replay(bytes);
    if !bytes.starts_with(journal::MAGIC) {
        let mut file = journal::header(0);
        for payload in bytes.split(|b| *b == b'\n') {
            file.extend(journal::frame(payload.len() as u32, payload));
        }
        journal_replay(&file);
    }
}

/// The snapshot target's input: a snapshot file, and one without a header also as the JSON
/// of a snapshot under a header with its true length and checksum, which random bytes would
/// almost never have.
#[doc(hidden)]
pub fn snapshot_input(bytes: &[u8]) {
    snapshot_load(bytes);
    if !bytes.starts_with(snapshot::PREFIX) {
        snapshot_load(&snapshot::with_header(bytes));
    }
}

/// A journal file: header check, frame decoding and replay into an empty state, as a store
/// loads it (`Store::load`), from an in-memory file so it runs the same file reads.
#[doc(hidden)]
pub fn journal_replay(bytes: &[u8]) {
    let path = Path::new("fuzz-journal");
    let Some(file) = memfd(bytes) else { return };
    if journal::read_header(&file, path).is_err() {
        return;
    }
    let Ok(out) = journal::read_from(&file, path, HEADER_LEN) else {
        return;
    };
    // What the store relies on to cut a torn tail or to name the damage.
    assert_eq!(out.end + out.torn_bytes, bytes.len() as u64);
    if let Some(d) = out.damage {
        assert!(out.end == d.at && d.at < d.next_valid && d.next_valid < bytes.len() as u64);
    }
    let mut state = State::default();
    for rec in out.records {
        state.apply(rec);
    }
    check_state(&state);
}

/// A snapshot file as the store reads it; one that loads must survive the compaction round
/// trip (state → snapshot → bytes → snapshot) unchanged.
#[doc(hidden)]
pub fn snapshot_load(bytes: &[u8]) {
    let Ok(snap) = snapshot::decode(bytes) else {
        return;
    };
    let state = State::from_snapshot(snap.clone());
    check_state(&state);
    let again = state.to_snapshot(snap.generation);
    let encoded = snapshot::encode(&again).expect("a loaded snapshot encodes");
    let reread = snapshot::decode(&encoded).unwrap_or_else(|_| panic!("re-read {again:?}"));
    assert_eq!(reread, again);
}

/// A request body sent to `path` of the lease API: decoded as the server does, then the
/// checks the handlers make before queueing work, and for range sets what the store makes of
/// them (validation, capacity, the first free address). Unknown paths do nothing. Returns
/// whether the body decoded (for the seeds' test).
#[doc(hidden)]
pub fn request_body(path: &str, bytes: &[u8]) -> bool {
    match path {
        "/v1/allocate" => decode_body::<AllocateRequest>(bytes)
            .map(|req| {
                if req.key.validate().is_ok() {
                    range_sets(&req.range_sets, &req.requested);
                }
            })
            .is_ok(),
        "/v1/release" | "/v1/check" => decode_body::<LeaseKey>(bytes)
            .map(|key| key.validate())
            .is_ok(),
        "/v1/gc" => decode_body::<GcRequest>(bytes)
            .map(|gc| check_network(&gc.network))
            .is_ok(),
        "/v1/status" => decode_body::<StatusRequest>(bytes)
            .map(|req| {
                if check_network(&req.network).is_ok() {
                    let _ = answer_empty(&Op::Status(req.range_sets), "boot");
                }
            })
            .is_ok(),
        // The client names its store in a header; the daemon parses it for every request.
        "header" => crate::api::parse_data_dir_header(bytes).is_some(),
        _ => false,
    }
}

/// A body sent to `/v1/ext/<SERVICE>.<op>`: decoded as the server does before the
/// service's permission check.
#[doc(hidden)]
pub fn service_request<S: Service>(op: &str, bytes: &[u8]) {
    let _ = crate::service::decode::<S>(op, bytes);
}

/// Range sets from a request, through what the store does with them on an empty network.
fn range_sets(sets: &[crate::config::RangeSet], requested: &[std::net::IpAddr]) {
    let Ok(sets) = canonicalize_range_sets(sets) else {
        return;
    };
    for set in &sets {
        let pool = Pool::new(set);
        let _ = pool.capacity();
        if let Some((ip, idx)) = pool.next_free(None, 0, |_| false) {
            assert_eq!(pool.range_for(ip), Some(idx), "{ip} in {set:?}");
        }
        for &ip in requested {
            if pool.in_bounds(ip) {
                let _ = (pool.range_for(ip), pool.is_gateway(ip));
            }
        }
    }
}

/// Replay's promise: every address has one holder, and the index says which.
fn check_state(state: &State) {
    for (key, h) in &state.holders {
        for l in &h.leases {
            assert_eq!(state.by_addr.get(&l.addr.addr()), Some(key), "{state:?}");
        }
    }
    for (addr, key) in &state.by_addr {
        let held = state.holders.get(key).map(|h| &h.leases);
        assert!(
            held.is_some_and(|l| l.iter().any(|l| l.addr.addr() == *addr)),
            "{state:?}"
        );
    }
}

/// `bytes` as an anonymous in-memory file (memfd), positioned anywhere: the journal's
/// readers seek.
fn memfd(bytes: &[u8]) -> Option<File> {
    // SAFETY: a NUL-terminated name and plain flags; the fd returned is new and ours.
    let fd = unsafe { libc::memfd_create(c"ipamd-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a valid descriptor nothing else owns; the File closes it.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes).ok()?;
    Some(file)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::journal::{read_from, read_header, HEADER_LEN};

    /// The committed seeds of a fuzz target (`fuzz/corpus/<target>`): name and bytes.
    fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/corpus")
            .join(target);
        let mut out: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| {
                let path = e.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).unwrap())
            })
            .collect();
        out.sort();
        assert!(!out.is_empty(), "no seeds in {}", dir.display());
        out
    }

    /// Every `cargo test` runs the seeds through the entry points, so these keep compiling
    /// and their properties hold at least for the seeds without cargo-fuzz. The seeds are
    /// also checked to be what their names say (valid where meant to be), so fuzzing starts
    /// from inputs that get past decoding into replay and the store's checks.
    #[test]
    fn seeds_pass_and_are_what_they_say() {
        for (name, bytes) in seeds("journal") {
            super::journal_input(&bytes);
            if name == "records-lines" {
                continue; // framed by `journal_input`
            }
            let f = super::memfd(&bytes).unwrap();
            read_header(&f, Path::new(&name)).unwrap();
            let out = read_from(&f, Path::new(&name), HEADER_LEN).unwrap();
            let damaged = name.starts_with("damage");
            assert_eq!(out.torn_bytes > 0, damaged || name == "torn-tail", "{name}");
            assert_eq!(out.damage.is_some(), damaged, "{name}");
        }
        for (name, bytes) in seeds("snapshot") {
            super::snapshot_input(&bytes);
            let loads = ["v1-plain", "v2", "v2-empty"].contains(&name.as_str());
            assert_eq!(crate::snapshot::decode(&bytes).is_ok(), loads, "{name}");
        }
        for (name, bytes) in seeds("daemon_request") {
            let nl = bytes.iter().position(|b| *b == b'\n').unwrap();
            let path = std::str::from_utf8(&bytes[..nl]).unwrap();
            if !path.starts_with("/v1/ext/") {
                assert!(super::request_body(path, &bytes[nl + 1..]), "{name}");
            }
        }
    }
}
