//! A network configuration on stdin (ADD and DEL decoding), and the result it may carry
//! (`prevResult`, or a delegate's output) converted to every spec version's layout and read
//! back. Decoding errors are fine; panics are not, and neither is a rendered result that
//! does not read back as the same result.
#![no_main]

use cnikit::cni::config::NetConf;
use cnikit::cni::{CniResult, Version};
use ipamd::config::IpamConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for conf in [
        NetConf::parse(data.to_vec()),
        NetConf::parse_for_del(data.to_vec()),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(prev) = &conf.prev_result {
            convert(prev);
        }
        let _ = conf.valid_attachments();
        // What the ipamd plugin reads of the same configuration.
        if let Some(ipam) = conf.raw.get("ipam") {
            let _ = IpamConfig::from_json(ipam);
        }
        if let Some(ranges) = conf.runtime_config("ipRanges") {
            let _ = IpamConfig::ranges_from_json(ranges);
        }
    }
    // The same bytes as a delegate's stdout, which is read in any version's layout.
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(result) = CniResult::from_value(&value) {
            convert(&result);
        }
    }
});

/// Render `r` in every version and read it back. Older layouts drop what they cannot hold,
/// so only the newest must give back `r` itself; every layout must be stable: what was read
/// back renders the same as the first rendering.
fn convert(r: &CniResult) {
    for v in Version::ALL {
        let rendered = r.to_value(v);
        let back = CniResult::from_value(&rendered)
            .unwrap_or_else(|e| panic!("{v} layout does not read back: {e:?}: {rendered}"));
        assert_eq!(back.to_value(v), rendered, "{v} layout is not stable");
        if v == Version::LATEST {
            assert_eq!(&back, r, "{v} layout loses something");
        }
    }
}
