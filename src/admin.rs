//! Admin commands (clap): install, version, net, doctor, man, completions,
//! ipamd daemon/leases/fsck/pool. Never on the plugin path.

mod docs;
mod doctor;
mod firewall;
mod install;
mod ipamd_daemon;
mod node_agent;
mod pool;

use crate::cni::Version;
use crate::plugins;
use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "cnikit",
    version,
    about = "CNI plugins in one binary",
    after_help = after_help()
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Link every plugin name to this binary in DIR (the names: `cnikit --help`).
    Install {
        /// The CNI bin directory, e.g. /opt/cni/bin.
        #[arg(long)]
        dir: PathBuf,
        /// Replace files that are not ours (our symlinks; with --copy, our copy).
        #[arg(long)]
        force: bool,
        /// Copy the binary into DIR once, as DIR/cnikit, and hard-link every plugin
        /// name to that copy instead of symlinking (for bin dirs on another filesystem).
        #[arg(long)]
        copy: bool,
    },
    /// Print the build version.
    Version,
    /// A CNI DaemonSet's container: install the plugins into the host's bin dir, write
    /// the mounted network list into the host's conf dir, then run the ipamd daemon
    /// (docs/kubernetes.md).
    NodeAgent(node_agent::NodeAgentArgs),
    /// Run a network configuration list like a container runtime (libcni)
    /// does: ADD, CHECK, DEL, GC, STATUS.
    Net(crate::runtime::cli::NetArgs),
    /// The IPAM daemon and its lease store.
    Ipamd {
        #[command(subcommand)]
        command: IpamdCmd,
    },
    /// The DHCP lease daemon of the `dhcp` plugin, as the reference's daemon runs.
    Dhcp {
        #[command(subcommand)]
        command: DhcpCmd,
    },
    /// The firewall state of the pods: put it back after someone removed it.
    Firewall {
        #[command(subcommand)]
        command: firewall::FirewallCmd,
    },
    /// Check this node: plugin links, network lists, the daemon, nftables,
    /// leases of earlier boots. One line per check with the fix; exits 1 if
    /// any check failed.
    Doctor(doctor::DoctorArgs),
    /// Write the man pages (cnikit.1 and one per subcommand) into DIR.
    Man {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: docs::Shell,
    },
}

#[derive(Subcommand)]
enum DhcpCmd {
    /// Run the daemon (also `dhcp daemon` through the plugin's link), with the reference
    /// daemon's Go-style flags: -socketpath (/run/cni/dhcp.sock), -timeout (10s),
    /// -resendmax (62s), -resendtimeout (208s), -broadcast, -hostprefix, -pidfile, and
    /// cnikit's -datadir (/var/lib/cni/dhcp), -loglevel (info). `-h` lists them.
    Daemon {
        /// The flags, as the reference's daemon takes them.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "FLAGS"
        )]
        flags: Vec<String>,
    },
}

#[derive(Subcommand)]
enum IpamdCmd {
    /// Run the lease daemon (HTTP over a unix socket).
    Daemon(ipamd_daemon::DaemonArgs),
    /// Cluster-wide address pools in etcd: create, show, delete, release-node.
    Pool {
        #[command(subcommand)]
        command: pool::PoolCmd,
    },
    /// List leases, from the daemon or, if none runs, from the store files.
    Leases {
        #[arg(long)]
        network: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: pool::StoreArgs,
    },
    /// Check the lease store's files for damage; with --repair, keep the
    /// damaged files aside and rebuild the store from every valid record.
    /// Exits non-zero when damage was found and not repaired.
    Fsck {
        #[arg(long, default_value = "/var/lib/cni/ipamd")]
        data_dir: PathBuf,
        /// Only this network (default: all of them).
        #[arg(long)]
        network: Option<String>,
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
    },
}

fn after_help() -> String {
    format!(
        "Plugins (as symlinks to this binary, or `cnikit <plugin>` with CNI_COMMAND set): {}\n\
         CNI protocol versions supported: {}",
        plugins::NAMES.join(", "),
        Version::all_joined()
    )
}

/// The whole command line as clap defines it (man pages, completions).
pub fn command() -> clap::Command {
    Cli::command()
}

pub fn main(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let outcome = match cli.command {
        None => {
            println!(
                "cnikit {}: CNI plugins in one binary",
                env!("CARGO_PKG_VERSION")
            );
            println!("{}", after_help());
            println!("Run `cnikit --help` for the admin commands.");
            Ok(())
        }
        Some(Cmd::Version) => {
            println!("cnikit {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Some(Cmd::Install { dir, force, copy }) => install::run(&dir, force, copy),
        Some(Cmd::NodeAgent(args)) => node_agent::run(args),
        Some(Cmd::Ipamd { command }) => ipamd(command),
        Some(Cmd::Net(args)) => crate::runtime::cli::run(args),
        Some(Cmd::Dhcp {
            command: DhcpCmd::Daemon { flags },
        }) => match crate::dhcp::daemon::main(&flags) {
            0 => Ok(()),
            // The daemon printed why.
            code => std::process::exit(code),
        },
        Some(Cmd::Firewall { command }) => firewall::run(command),
        Some(Cmd::Doctor(args)) => doctor::run(args),
        Some(Cmd::Man { dir }) => docs::man(command(), &dir),
        Some(Cmd::Completions { shell }) => docs::completions(command(), shell),
    };
    match outcome {
        Ok(()) => 0,
        Err(msg) => {
            eprintln!("cnikit: {msg}");
            1
        }
    }
}

fn ipamd(command: IpamdCmd) -> Result<(), String> {
    match command {
        IpamdCmd::Daemon(args) => ipamd_daemon::run(args),
        IpamdCmd::Pool { command } => pool::run(command),
        IpamdCmd::Leases {
            network,
            json,
            store,
        } => {
            let leases = store
                .client()
                .leases(network.as_deref())
                .map_err(|e| e.to_string())?;
            print_leases(&leases, json)
        }
        IpamdCmd::Fsck {
            data_dir,
            network,
            repair,
            json,
        } => fsck(data_dir, network, repair, json),
    }
}

fn fsck(
    data_dir: PathBuf,
    network: Option<String>,
    repair: bool,
    json: bool,
) -> Result<(), String> {
    let reports = ipamd::fsck::run(&ipamd::fsck::FsckOptions {
        data_dir: data_dir.clone(),
        network,
        repair,
    })
    .map_err(|e| e.to_string())?;
    if json {
        let text = serde_json::to_string_pretty(&reports).map_err(|e| e.to_string())?;
        println!("{text}");
    } else if reports.is_empty() {
        println!("no lease store under {}", data_dir.display());
    } else {
        for r in &reports {
            print!("{}", r.render(&data_dir));
        }
    }
    let bad: Vec<&str> = reports
        .iter()
        .filter(|r| r.needs_attention())
        .map(|r| r.network.as_str())
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    Err(format!(
        "damage found and not repaired (or not checked) in network(s) {}",
        bad.join(", ")
    ))
}

fn print_leases(leases: &[ipamd::api::LeaseInfo], json: bool) -> Result<(), String> {
    if json {
        let text = serde_json::to_string_pretty(leases).map_err(|e| e.to_string())?;
        println!("{text}");
        return Ok(());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    println!(
        "{:<20} {:<40} {:<40} {:<12} AGE",
        "NETWORK", "ADDRESS", "CONTAINER", "IFNAME"
    );
    for l in leases {
        println!(
            "{:<20} {:<40} {:<40} {:<12} {}s",
            l.network,
            l.address,
            l.container_id,
            l.ifname,
            now.saturating_sub(l.created_unix)
        );
    }
    Ok(())
}
