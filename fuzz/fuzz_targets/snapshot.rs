//! A snapshot file (v2 header + JSON, or v1 plain JSON) as a store loads it. See
//! `ipamd::fuzzing::snapshot_input` for how input without a header is also read, and
//! `snapshot_load` for what is checked.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: ipamd::fuzzing::quiet_log(), |data: &[u8]| {
    ipamd::fuzzing::snapshot_input(data)
});
