//! The lease check of `cnikit doctor`: per network, leases recorded under an
//! earlier boot. Their pods died with that boot; they are freed when the
//! daemon starts and when a range fills up, so they are a warning, not a
//! failure — unless nothing will ever free them, which the fix says.

use super::{Check, DoctorArgs};
use ipamd::api::LeaseInfo;
use std::collections::BTreeMap;
use std::time::Duration;

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The checks, and per network the number of leases of this boot (pods that
/// should be running), for the nftables check.
pub fn leases(args: &DoctorArgs, daemon_answered: bool) -> (Vec<Check>, BTreeMap<String, usize>) {
    let client = ipamd::client::Client::new(&args.socket, &args.data_dir)
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(10));
    let all = match client.leases(None) {
        Ok(l) => l,
        Err(e) => {
            let fix = format!("cnikit ipamd fsck --data-dir {}", args.data_dir.display());
            return (
                vec![Check::fail(
                    "leases",
                    format!("cannot read the leases: {e}"),
                    fix,
                )],
                BTreeMap::new(),
            );
        }
    };
    let boot = match std::fs::read_to_string(BOOT_ID) {
        Ok(b) => b.trim().to_string(),
        Err(e) => {
            let check = Check::warn(
                "leases",
                format!(
                    "cannot read {BOOT_ID} ({e}): leases of earlier boots cannot be told apart"
                ),
                "run doctor on the node itself, with /proc mounted",
            );
            return (vec![check], BTreeMap::new());
        }
    };
    judge(
        &all,
        &boot,
        daemon_answered,
        &args.data_dir.display().to_string(),
    )
}

/// The pure part: group `all` by network and compare each lease's boot ID
/// with `boot` (a lease without one is never counted as stale, as the store
/// never reclaims it).
pub fn judge(
    all: &[LeaseInfo],
    boot: &str,
    daemon_answered: bool,
    data_dir: &str,
) -> (Vec<Check>, BTreeMap<String, usize>) {
    let mut by_network: BTreeMap<&str, Vec<&LeaseInfo>> = BTreeMap::new();
    for l in all {
        by_network.entry(&l.network).or_default().push(l);
    }
    let mut live = BTreeMap::new();
    if by_network.is_empty() {
        return (
            vec![Check::ok("leases", format!("no leases in {data_dir}"))],
            live,
        );
    }
    let mut checks = Vec::new();
    for (network, leases) in by_network {
        let check = format!("leases {network}");
        let stale: Vec<&&LeaseInfo> = leases
            .iter()
            .filter(|l| !l.boot_id.is_empty() && l.boot_id != boot)
            .collect();
        live.insert(network.to_string(), leases.len() - stale.len());
        if stale.is_empty() {
            checks.push(Check::ok(
                check,
                format!("{} lease(s), all of this boot", leases.len()),
            ));
            continue;
        }
        let mut shown: Vec<String> = stale
            .iter()
            .take(5)
            .map(|l| l.address.to_string())
            .collect();
        if stale.len() > shown.len() {
            shown.push("…".into());
        }
        let fix = if daemon_answered {
            "the daemon frees them when it starts, unless it runs with \
             --reclaim-previous-boot=false: check its flags, then systemctl restart ipamd.service"
        } else {
            "start the daemon (systemctl start ipamd.service), which frees leases of earlier \
             boots at start; without it they are freed when a range fills up"
        };
        checks.push(Check::warn(
            check,
            format!(
                "{} of {} lease(s) are from an earlier boot ({})",
                stale.len(),
                leases.len(),
                shown.join(", ")
            ),
            fix,
        ));
    }
    (checks, live)
}
