//! A journal file (header, then checksummed frames) replayed into a network's state, as a
//! store loads it. See `ipamd::fuzzing::journal_input` for how input that is not a journal
//! is also read, and `journal_replay` for what is checked.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: ipamd::fuzzing::quiet_log(), |data: &[u8]| {
    ipamd::fuzzing::journal_input(data)
});
