//! bandwidth's configuration and its arithmetic against the reference's numbers.

use super::*;
use crate::cni::Command;
use crate::plugins::firewall_backend::test_request;
use serde_json::json;

fn shaping(conf: serde_json::Value) -> Result<Shaping, Error> {
    let mut c = json!({"cniVersion": "1.0.0", "name": "net1", "type": "bandwidth"});
    for (k, v) in conf.as_object().unwrap() {
        c[k] = v.clone();
    }
    Shaping::load(&test_request(Command::Add, c))
}

#[test]
fn config_keys_get_go_matching() {
    use crate::cni::gojson::{assert_known, struct_fields};
    assert_known(&[struct_fields::<Entry>()]);
}

/// The reference (Debian's 1.1.1 and v1.9.1) makes, for ingressRate 8 Mbit/s
/// and ingressBurst 800 kbit, `tbf rate 8Mbit burst 100000b lat 25ms`:
/// rate 1,000,000 B/s, limit 125,000 B, buffer 100 ms = 1,562,500 ticks.
#[test]
fn tbf_numbers_match_the_reference() {
    let tbf = direction("ingress", Some(8_000_000), Some(800_000))
        .unwrap()
        .unwrap();
    assert_eq!(
        tbf,
        Tbf {
            rate: 1_000_000,
            limit: 125_000,
            buffer: 1_562_500
        }
    );
    // Rates beyond 32 bits of bytes/s keep their full value (TCA_TBF_RATE64).
    let fast = direction("egress", Some(80_000_000_000), Some(8_000_000))
        .unwrap()
        .unwrap();
    assert_eq!(fast.rate, 10_000_000_000);
}

#[test]
fn rate_and_burst_come_together() {
    assert_eq!(direction("ingress", None, None).unwrap(), None);
    assert_eq!(direction("ingress", Some(0), Some(0)).unwrap(), None);
    for (rate, burst, needle) in [
        (Some(1000), None, "ingressBurst must be too"),
        (None, Some(1000), "ingressRate must be too"),
        (Some(7), Some(1000), "at least 8 bits"),
        (Some(8000), Some(8 * u64::from(u32::MAX)), "more than 4 GB"),
        (Some(8), Some(8 << 30), "takes too long"),
        (Some(u64::MAX), Some(8000), "queues more than 4 GB"),
    ] {
        let e = direction("ingress", rate, burst).unwrap_err();
        assert_eq!(e.code, 7, "{e}");
        assert!(e.msg.contains(needle), "{}: want {needle:?}", e.msg);
    }
}

#[test]
fn config_keys_replace_the_capability() {
    let cap = json!({"bandwidth": {"IngressRate": 8000, "IngressBurst": 8000}});
    let s = shaping(json!({"runtimeConfig": cap})).unwrap();
    assert!(s.ingress.is_some() && s.egress.is_none());
    // Go-style spellings of the top-level keys count as set, too.
    let s =
        shaping(json!({"runtimeConfig": cap, "EgressRate": 8000, "egressBurst": 8000})).unwrap();
    assert!(s.ingress.is_none() && s.egress.is_some(), "{s:?}");
    let e = shaping(json!({"runtimeConfig": {"bandwidth": {"ingressRate": -1}}})).unwrap_err();
    assert_eq!(e.code, 7);
    assert!(e.msg.contains("runtimeConfig.bandwidth"), "{}", e.msg);
    assert!(shaping(json!({})).unwrap().is_empty());
}

#[test]
fn del_with_a_broken_config_removes_everything() {
    let req = test_request(
        Command::Del,
        json!({"cniVersion": "1.0.0", "name": "n", "ingressRate": 5}),
    );
    let s = req
        .conf_or_del_fallback(Shaping::load, Shaping::everything)
        .unwrap();
    assert!(s.ingress.is_some() && s.egress.is_some());
}
