//! Admin commands (clap): install, version, net, doctor, man, completions,
//! ipamd daemon/leases/fsck/pool. Never on the plugin path.

mod docs;
mod doctor;
mod firewall;
mod pool;

use crate::cni::Version;
use crate::plugins;
use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
    Daemon {
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
        /// Cluster pools in etcd (--etcd-endpoints, --node, …).
        #[command(flatten)]
        cluster: pool::DaemonClusterArgs,
    },
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
        Some(Cmd::Install { dir, force, copy }) => install(&dir, force, copy),
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
        IpamdCmd::Daemon {
            socket,
            data_dir,
            reclaim_previous_boot,
            log_level,
            allowed_gid,
            cluster,
        } => {
            // Puts back what others remove of the pods' firewall state, for
            // as long as the daemon runs (`firewall/watch.rs`).
            crate::firewall::watch::start()
                .map_err(|e| format!("cannot start the firewall watch: {e}"))?;
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
            })
            .map_err(|e| e.to_string())
        }
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

/// Make DIR/<plugin> → this binary for every plugin. Idempotent: what an
/// earlier install made is left alone or redone; anything else needs --force.
///
/// With `copy`, the binary is copied once, as DIR/cnikit, and every plugin
/// name is a hard link to that copy: one copy of the binary on the host, not
/// one per plugin, and all the names in one directory share its filesystem.
fn install(dir: &Path, force: bool, copy: bool) -> Result<(), String> {
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| format!("cannot find the running binary: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if copy {
        let main = dir.join("cnikit");
        install_copy(&me, &main, force)?;
        println!("{} = copy of {}", main.display(), me.display());
        for name in plugins::NAMES {
            let target = dir.join(name);
            install_hard_link(&me, &main, &target, force)?;
            println!("{} = hard link of {}", target.display(), main.display());
        }
        return Ok(());
    }
    for name in plugins::NAMES {
        let target = dir.join(name);
        install_one(&me, &target, force)?;
        println!("{} -> {}", target.display(), me.display());
    }
    Ok(())
}

fn install_one(me: &Path, target: &Path, force: bool) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(target) {
        if meta.file_type().is_symlink() && links_to(target, me) {
            return Ok(());
        }
        refuse_unless(force, target)?;
        std::fs::remove_file(target)
            .map_err(|e| format!("cannot remove {}: {e}", target.display()))?;
    }
    std::os::unix::fs::symlink(me, target)
        .map_err(|e| format!("cannot create {}: {e}", target.display()))
}

/// DIR/cnikit: a regular file with our contents (it may be the running binary
/// itself). A symlink to us is ours too, and becomes a copy.
fn install_copy(me: &Path, main: &Path, force: bool) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(main) {
        if meta.is_file() && same_contents(me, main) {
            return Ok(());
        }
        if !(meta.file_type().is_symlink() && links_to(main, me)) {
            refuse_unless(force, main)?;
        }
    }
    put_in_place(main, |tmp| std::fs::copy(me, tmp).map(drop))
        .map_err(|e| format!("cannot create {}: {e}", main.display()))
}

/// DIR/<plugin>: a hard link of DIR/cnikit. What is ours in another form (a
/// symlink to us, or a separate copy of us) is replaced without --force.
fn install_hard_link(me: &Path, main: &Path, target: &Path, force: bool) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(target) {
        let main_meta =
            std::fs::metadata(main).map_err(|e| format!("cannot read {}: {e}", main.display()))?;
        if meta.is_file() && (meta.dev(), meta.ino()) == (main_meta.dev(), main_meta.ino()) {
            return Ok(());
        }
        let ours = if meta.file_type().is_symlink() {
            links_to(target, me)
        } else {
            meta.is_file() && same_contents(me, target)
        };
        if !ours {
            refuse_unless(force, target)?;
        }
    }
    put_in_place(target, |tmp| std::fs::hard_link(main, tmp)).map_err(|e| {
        format!(
            "cannot link {} to {}: {e}",
            target.display(),
            main.display()
        )
    })
}

fn refuse_unless(force: bool, target: &Path) -> Result<(), String> {
    if force {
        return Ok(());
    }
    Err(format!(
        "{} already exists and is not a cnikit link; move it away or pass --force to replace it",
        target.display()
    ))
}

fn links_to(link: &Path, me: &Path) -> bool {
    link.canonicalize().ok().as_deref() == Some(me)
}

fn same_contents(a: &Path, b: &Path) -> bool {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len());
    matches!((len(a), len(b)), (Ok(x), Ok(y)) if x == y)
        && matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
}

/// Makes `target` with `make`, under a temporary name beside it that is then
/// renamed over it: a runtime never execs a half-written file, nor finds the
/// name missing. Nothing is left behind on failure.
fn put_in_place(
    target: &Path,
    make: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = target.with_extension("cnikit-tmp");
    let _ = std::fs::remove_file(&tmp);
    make(&tmp)
        .and_then(|()| std::fs::rename(&tmp, target))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}
