//! `CNI_ARGS` (`K=V;K=V`), strict (ADD) and lenient (DEL). The environment is bytes; the
//! runtime reads it as UTF-8 first, so only valid UTF-8 reaches the parser.
#![no_main]

use cnikit::cni::args::{CniArgs, KNOWN_KEYS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let lenient = CniArgs::parse_lenient(raw);
    if let Ok(strict) = CniArgs::parse(raw) {
        // Whatever the strict parser accepts, DEL's lenient one reads the same way.
        assert_eq!(strict, lenient, "{raw:?}");
    }
    for key in KNOWN_KEYS {
        let _ = lenient.get(key);
    }
});
