//! `cnikit ipamd daemon`: its flags (which `cnikit node-agent` takes too, flattened) and
//! its start.

use super::pool;
use clap::Args;
use std::path::PathBuf;

/// The lease daemon's flags.
#[derive(Args)]
pub(crate) struct DaemonArgs {
    #[arg(long, default_value = "/run/cnikit/ipamd.sock")]
    socket: PathBuf,
    #[arg(long, default_value = "/var/lib/cni/ipamd")]
    data_dir: PathBuf,
    /// Free leases recorded under a previous boot ID at start.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    reclaim_previous_boot: bool,
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Also accept clients of this group id (root is always accepted).
    #[arg(long)]
    allowed_gid: Option<u32>,
    /// Do not receive the plugins' reports of their calls (no `ipamd_plugin_*` series;
    /// the plugins then send to a socket that is not there, which costs them nothing).
    #[arg(long)]
    no_plugin_metrics: bool,
    /// Cluster pools in etcd (--etcd-endpoints, --node, …).
    #[command(flatten)]
    cluster: pool::DaemonClusterArgs,
}

/// Runs the daemon until SIGTERM or SIGINT.
pub(crate) fn run(args: DaemonArgs) -> Result<(), String> {
    let DaemonArgs {
        socket,
        data_dir,
        reclaim_previous_boot,
        log_level,
        allowed_gid,
        no_plugin_metrics,
        cluster,
    } = args;
    // Puts back what others remove of the pods' firewall state, for
    // as long as the daemon runs (`firewall/watch.rs`).
    crate::firewall::watch::start().map_err(|e| format!("cannot start the firewall watch: {e}"))?;
    ipamd::daemon::run(ipamd::daemon::DaemonOptions {
        socket,
        data_dir,
        reclaim_previous_boot,
        log_level,
        allowed_gid,
        // The daemon also applies the plugins' firewall changes: its
        // netfilter socket never closes (see firewall/service.rs).
        services: ipamd::service::Services::new()
            .with(crate::firewall::service::Firewall::default()),
        cluster: cluster.options()?,
        block_routes: cluster.block_routes(),
        plugin_calls: !no_plugin_metrics,
    })
    .map_err(|e| e.to_string())
}
