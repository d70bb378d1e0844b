use super::*;

#[test]
fn phases_by_elapsed_time() {
    let t = Timers {
        renew: Duration::from_secs(10),
        rebind: Duration::from_secs(17),
        expire: Duration::from_secs(20),
    };
    let at = |s| phase_at(t, Duration::from_secs(s));
    assert_eq!(
        [at(0), at(10), at(17), at(20), at(99)],
        [
            Phase::Bound,
            Phase::Renewing,
            Phase::Rebinding,
            Phase::Expired,
            Phase::Expired
        ]
    );
    let forever = Timers {
        expire: Duration::from_secs(u64::from(u32::MAX)),
        ..t
    };
    assert_eq!(phase_at(forever, Duration::from_secs(99)), Phase::Bound);
}
