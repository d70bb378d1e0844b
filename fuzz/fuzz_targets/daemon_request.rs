//! A request to the ipamd daemon: the first line is the path (`/v1/allocate`,
//! `/v1/ext/firewall.<op>`, or `header` for the data-dir header's value), the rest the body,
//! decoded and checked as the server does before any work is queued.
#![no_main]

use cnikit::firewall::service::Firewall;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (path, body) = match data.iter().position(|b| *b == b'\n') {
        Some(nl) => (&data[..nl], &data[nl + 1..]),
        None => (data, &[][..]),
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    match path.strip_prefix("/v1/ext/firewall.") {
        Some(op) => ipamd::fuzzing::service_request::<Firewall>(op, body),
        None => {
            ipamd::fuzzing::request_body(path, body);
        }
    }
});
