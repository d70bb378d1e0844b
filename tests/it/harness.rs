//! Self-tests of the shared harness (`support`): its checks must be able
//! to fail, and its cleanup must run when a test panics. Without these, a
//! green suite could be green because a check is vacuous.

use crate::support::*;

/// Proves: `ping` reports failure for an address nobody has (so the
/// connectivity asserts of the other tests are not vacuous).
#[test]
fn ping_fails_for_unreachable_address() {
    let (_env, ns) = TestEnv::with_netns("ping_fails_for_unreachable_address");
    assert!(
        ping(&ns.name, "127.0.0.1"),
        "loopback answers inside the netns"
    );
    assert!(
        !ping(&ns.name, "10.255.255.254"),
        "no route: ping must fail"
    );
}

/// Proves: the error-object validator rejects everything but exactly one
/// {cniVersion, code, msg[, details]} object.
#[test]
fn error_object_validator() {
    let _env = TestEnv::new("error_object_validator");
    assert!(parse_error_object(r#"{"cniVersion":"1.0.0","code":7,"msg":"bad"}"#, false).is_ok());
    assert!(parse_error_object(
        r#"{"cniVersion":"1.0.0","code":7,"msg":"bad","details":"more"}"#,
        false
    )
    .is_ok());
    for bad in [
        "",
        "garbage",
        r#"{"code":7,"msg":"no version"}"#,
        r#"{"cniVersion":"1.0.0","msg":"no code"}"#,
        r#"{"cniVersion":"1.0.0","code":"7","msg":"string code"}"#,
        r#"{"cniVersion":"1.0.0","code":7}"#,
        r#"{"cniVersion":"1.0.0","code":7,"msg":""}"#,
        r#"{"cniVersion":"1.0.0","code":7,"msg":"x","extra":1}"#,
        r#"{"cniVersion":"1.0.0","code":7,"msg":"x"}{"cniVersion":"1.0.0","code":7,"msg":"x"}"#,
        r#"[{"cniVersion":"1.0.0","code":7,"msg":"x"}]"#,
    ] {
        assert!(parse_error_object(bad, false).is_err(), "accepted {bad:?}");
    }
}

/// Proves: a panicking test still removes its netns, links and temp dir
/// (TestEnv's Drop runs during unwinding).
#[test]
fn cleanup_runs_when_a_test_panics() {
    let probe = TestEnv::new("cleanup_probe");
    let mut made = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (env, ns) = TestEnv::with_netns("cleanup_runs_when_a_test_panics");
        let (a, b) = env.veth_pair();
        made = Some((ns.name.clone(), a, b, env.tmp.clone()));
        panic!("simulated test failure");
    }));
    assert!(outcome.is_err());
    let (ns, a, b, tmp) = made.expect("resources were made");
    let (_, netns_list, _) = sh("ip", &["netns", "list"]);
    assert!(
        !netns_list.contains(&ns),
        "netns {ns} survived: {netns_list}"
    );
    assert!(
        link(None, &a).is_none() && link(None, &b).is_none(),
        "veth survived"
    );
    assert!(!tmp.exists(), "temp dir {} survived", tmp.display());
    drop(probe);
}
