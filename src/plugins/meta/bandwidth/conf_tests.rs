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
        // The reference's own limit: burst / 8 >= MaxUint32.
        (Some(8000), Some(8 * u64::from(u32::MAX)), "more than 4 GB"),
        (Some(8000), Some(u64::MAX), "more than 4 GB"),
    ] {
        let e = direction("ingress", rate, burst).unwrap_err();
        assert_eq!(e.code, 7, "{e}");
        assert!(e.msg.contains(needle), "{}: want {needle:?}", e.msg);
    }
}

/// containerd's CRI (`toCNIBandWidth`) sends `IngressBurst`/`EgressBurst` =
/// `math.MaxUint32` bits for the `kubernetes.io/{ingress,egress}-bandwidth`
/// annotations, through go-cni's `BandWidth`, whose fields have no JSON tags
/// (so the Go names, and the unset direction as zeros).
const CONTAINERD_BURST: u64 = 4_294_967_295;
/// CRI-O (`newPodNetwork`) sends `math.MaxUint32*8 - 1` bits, through
/// ocicni's lower-case keys.
const CRIO_BURST: u64 = 34_359_738_359;

/// What the runtimes send for the Kubernetes bandwidth annotations is
/// accepted: a bucket longer than the kernel's 32-bit buffer (in 64 ns
/// ticks) or a limit over 4 GB is held at `u32::MAX`; the rest is the
/// reference's arithmetic. Each Kubernetes quantity here ("1k" is the
/// smallest the API allows, up to "10G").
#[test]
fn runtime_bursts_are_accepted_and_saturate() {
    let max = u32::MAX;
    // (rate, burst, limit, buffer)
    for (rate, burst, limit, buffer) in [
        // containerd: 536,870,911 bytes of burst.
        (1_000, CONTAINERD_BURST, 536_870_914, max),
        (1_000_000, CONTAINERD_BURST, 536_874_036, max),
        (10_000_000, CONTAINERD_BURST, 536_902_161, max),
        (100_000_000, CONTAINERD_BURST, 537_183_411, 671_088_625),
        (1_000_000_000, CONTAINERD_BURST, 539_995_911, 67_108_859),
        // CRI-O: 4,294,967,294 bytes, so from 640 bit/s burst + 25 ms is over 4 GB.
        (1_000, CRIO_BURST, max, max),
        (10_000_000, CRIO_BURST, max, max),
        (1_000_000_000, CRIO_BURST, max, 536_870_906),
        (10_000_000_000, CRIO_BURST, max, 53_687_078),
    ] {
        let tbf = direction("egress", Some(rate), Some(burst))
            .unwrap_or_else(|e| panic!("rate {rate} burst {burst}: {e}"))
            .unwrap();
        assert_eq!(
            tbf,
            Tbf {
                rate: rate / 8,
                limit,
                buffer
            },
            "rate {rate} burst {burst}"
        );
    }
}

/// The capability exactly as each runtime writes it for a pod with only
/// `kubernetes.io/ingress-bandwidth: 10M`: the other direction's zeros mean
/// no limit.
#[test]
fn runtime_capabilities_as_sent() {
    let containerd = json!({"IngressRate": 10_000_000u64, "IngressBurst": CONTAINERD_BURST,
        "EgressRate": 0, "EgressBurst": 0});
    let crio = json!({"ingressRate": 10_000_000u64, "ingressBurst": CRIO_BURST,
        "egressRate": 0, "egressBurst": 0});
    for (cap, limit) in [(containerd, 536_902_161), (crio, u32::MAX)] {
        let s = shaping(json!({"runtimeConfig": {"bandwidth": cap}})).unwrap();
        assert_eq!(s.egress, None, "{cap}");
        let tbf = s.ingress.unwrap_or_else(|| panic!("{cap}: no ingress"));
        assert_eq!(
            (tbf.rate, tbf.limit, tbf.buffer),
            (1_250_000, limit, u32::MAX)
        );
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
