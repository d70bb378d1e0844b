//! Plugins report each call to the daemon after answering (`ipamd::plugin_calls`): the
//! daemon's /metrics gains a duration histogram per plugin and verb, error counts by CNI
//! code and calls per network; a daemon told not to listen, or none, changes nothing for
//! the plugin.

use super::*;
use crate::support::{ipamd_get, metric};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

/// Until the /metrics series `series` reaches `want` (reports arrive a moment after the
/// plugin exits), at most 5 s.
fn wait_series(sock: &Path, series: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(sock, series) != want {
        assert!(
            Instant::now() < deadline,
            "{series} is {}, not {want}",
            metric(sock, series)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_daemon_counts_and_times_every_plugin_call() {
    let fix = Fix::new("plugin_calls", Mode::Daemon);
    let conf = fix.conf_24();
    fix.add("c1", &conf).ok();
    fix.add("c2", &conf).ok();
    fix.del("c1", &conf).ok();
    let bad = fix.conf_v4("10.0.0.0/33");
    let code = fix.add("c3", &bad).err().code;
    let reports = plugin_calls_socket(&fix);
    let mode = std::fs::metadata(&reports)
        .expect("the report socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "only root reports");

    let series = |verb: &str| {
        format!("ipamd_plugin_duration_seconds_count{{plugin=\"ipamd\",verb=\"{verb}\"}} ")
    };
    wait_series(&fix.sock, &series("ADD"), 3);
    wait_series(&fix.sock, &series("DEL"), 1);
    let errors =
        format!("ipamd_plugin_errors_total{{plugin=\"ipamd\",verb=\"ADD\",code=\"{code}\"}} ");
    wait_series(&fix.sock, &errors, 1);
    let per_net = format!("ipamd_plugin_network_calls_total{{network=\"{NET}\",verb=\"ADD\"}} ");
    wait_series(&fix.sock, &per_net, 3);
    // Every ADD took longer than 0 and less than the histogram's last bound.
    wait_series(
        &fix.sock,
        "ipamd_plugin_duration_seconds_bucket{plugin=\"ipamd\",verb=\"ADD\",le=\"10\"} ",
        3,
    );
}

#[test]
fn a_daemon_without_reports_costs_the_plugin_nothing() {
    let mut fix = Fix::new("plugin_calls_off", Mode::InProcess);
    fix.start_daemon(&["--no-plugin-metrics"], &[]);
    assert!(!plugin_calls_socket(&fix).exists());
    let conf = fix.conf_24();
    fix.add("c1", &conf).ok();
    fix.del("c1", &conf).ok();
    let text = ipamd_get(&fix.sock, "/metrics").expect("/metrics");
    assert!(
        !text.contains("ipamd_plugin_duration_seconds_count"),
        "{text}"
    );
    fix.stop_daemon();
    // No daemon at all: the report goes nowhere, the call is the same.
    fix.add("c2", &conf).ok();
}

fn plugin_calls_socket(fix: &Fix) -> PathBuf {
    fix.sock.with_file_name("plugin-calls.sock")
}
