//! A journal file (header, then checksummed frames) replayed into a network's state, as a
//! store loads it. See `ipamd::fuzzing::journal_replay` for what is checked.
//!
//! Input that is not a journal (no `IPAMDJ1` header) is also read as one record payload a
//! line, framed with valid lengths and checksums: random bytes almost never pass a CRC, and
//! this way the fuzzer's mutations reach record decoding and replay.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    // Replaying hand-edited files warns about every moved lease: noise at fuzzing speed.
    init: ipamd::log::set_level(ipamd::log::Level::Error),
    |data: &[u8]| {
        ipamd::fuzzing::journal_replay(data);
        if !data.starts_with(b"IPAMDJ1\n") {
            ipamd::fuzzing::journal_replay(&framed(data));
        }
    }
);

/// A generation-0 journal whose frames hold the lines of `data`.
fn framed(data: &[u8]) -> Vec<u8> {
    let mut out = b"IPAMDJ1\n".to_vec();
    out.extend_from_slice(&0u64.to_le_bytes());
    for payload in data.split(|b| *b == b'\n') {
        let len = (payload.len() as u32).to_le_bytes();
        let mut h = crc32fast::Hasher::new();
        h.update(&len);
        h.update(payload);
        out.extend_from_slice(&len);
        out.extend_from_slice(&h.finalize().to_le_bytes());
        out.extend_from_slice(payload);
    }
    out
}
