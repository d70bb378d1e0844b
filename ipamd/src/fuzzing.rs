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
/// them (validation, capacity, the first free address). Unknown paths do nothing.
#[doc(hidden)]
pub fn request_body(path: &str, bytes: &[u8]) {
    match path {
        "/v1/allocate" => {
            let Ok(req) = decode_body::<AllocateRequest>(bytes) else {
                return;
            };
            if req.key.validate().is_ok() {
                range_sets(&req.range_sets, &req.requested);
            }
        }
        "/v1/release" | "/v1/check" => {
            if let Ok(key) = decode_body::<LeaseKey>(bytes) {
                let _ = key.validate();
            }
        }
        "/v1/gc" => {
            if let Ok(gc) = decode_body::<GcRequest>(bytes) {
                let _ = check_network(&gc.network);
            }
        }
        "/v1/status" => {
            let Ok(req) = decode_body::<StatusRequest>(bytes) else {
                return;
            };
            if check_network(&req.network).is_ok() {
                let _ = answer_empty(&Op::Status(req.range_sets), "boot");
            }
        }
        // The client names its store in a header; the daemon parses it for every request.
        "header" => {
            let _ = crate::api::parse_data_dir_header(bytes);
        }
        _ => {}
    }
}

/// A body sent to `/v1/ext/<S::NAME>.<op>`: decoded as the server does before the
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
