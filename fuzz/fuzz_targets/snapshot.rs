//! A snapshot file (v2 header + JSON, or v1 plain JSON) as a store loads it. See
//! `ipamd::fuzzing::snapshot_load` for what is checked.
//!
//! Input without a header is also read as the JSON of a version 2 snapshot under a header
//! with its true length and checksum, which random bytes would almost never have.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    // Replaying hand-edited files warns about every moved lease: noise at fuzzing speed.
    init: ipamd::log::set_level(ipamd::log::Level::Error),
    |data: &[u8]| {
        ipamd::fuzzing::snapshot_load(data);
        if !data.starts_with(b"ipamd-snapshot ") {
            let mut file = format!(
                "ipamd-snapshot v2 crc32={:08x} len={}\n",
                crc32fast::hash(data),
                data.len()
            )
            .into_bytes();
            file.extend_from_slice(data);
            ipamd::fuzzing::snapshot_load(&file);
        }
    }
);
