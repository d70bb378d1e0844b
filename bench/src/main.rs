//! cnikit-bench: the pod churn benchmark. W parallel workers attach and
//! detach pods (create netns → ADD the list → DEL → delete netns) through the
//! same runtime code as `cnikit net`, for cnikit, the reference plugins and
//! the kernel floor, interleaved. Runs inside its own network and mount
//! namespaces; see docs/performance.md. `cnikit-bench soak` is the long run
//! with daemon restarts and leak checks (soak/); `cnikit-bench repair` the
//! time until a flushed node's firewall is back (repair/); `cnikit-bench leases`
//! one IPAM call's cost with few and with many leases in the store (leases.rs).

mod churn;
mod daemon;
mod hosts;
mod leases;
mod plot;
mod podns;
mod repair;
mod report;
mod resident;
mod sandbox;
mod setup;
mod soak;

use clap::Parser;
use hosts::Hosts;
use indicatif::{ProgressBar, ProgressStyle};
use setup::{Impl, Plugins, Setup, Variant};
use std::path::{Path, PathBuf};

#[derive(Parser, Debug, serde::Serialize)]
#[command(
    name = "cnikit-bench",
    about = "Pod churn benchmark: cnikit vs the reference CNI plugins"
)]
struct Args {
    #[command(subcommand)]
    #[serde(skip)]
    mode: Option<Mode>,
    /// Worker counts, each run in turn.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    workers: Vec<usize>,
    /// Pods per worker [default: enough for about --total pods per worker count]
    #[arg(long)]
    pods: Option<usize>,
    /// Pods per worker count and implementation when --pods is not given.
    #[arg(long, default_value_t = 64)]
    total: usize,
    /// Implementations to compare.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "reference,cnikit,floor"
    )]
    impls: Vec<Impl>,
    /// Variants: full = bridge(ipMasq) + IPAM + portmap; bare = bridge + IPAM.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "full,bare")]
    variants: Vec<Variant>,
    /// Rounds each implementation's pods are split into, taken in turns (ABAB…).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Where results.json, table.txt and latency.svg go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// The cnikit binary [default: `cnikit` next to this program]
    #[arg(long)]
    cnikit: Option<PathBuf>,
    /// The reference plugins (Debian's containernetworking-plugins).
    #[arg(long, default_value = "/usr/lib/cni")]
    reference_dir: PathBuf,
    /// The newest upstream reference plugins (e.g. a release tarball of
    /// containernetworking/plugins unpacked), for `--impls upstream`.
    #[arg(long)]
    upstream_dir: Option<PathBuf>,
    /// A flag for the cnikit-daemon set's `cnikit ipamd daemon` (repeat for several),
    /// e.g. `--daemon-arg=--no-plugin-metrics` to measure the plugins' call reports.
    #[arg(long = "daemon-arg", allow_hyphen_values = true)]
    daemon_args: Vec<String>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Pods attached to every setup (2 host ports each) for half its
    /// rounds: each round runs without and with them, so the table shows
    /// the growth. Each setup then runs on a host netns of its own and in
    /// turn, with no other setup's residents on the machine.
    #[arg(long, default_value_t = 0)]
    #[serde(skip_serializing_if = "is_zero")]
    resident: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(clap::Subcommand, Debug)]
enum Mode {
    /// ADD/DEL cycles of the full chain with the daemon, restarted every N
    /// cycles (SIGTERM, SIGKILL in turn); samples RSS, fds and the store
    /// files, then checks that nothing leaked. Exits 1 unless clean.
    Soak(soak::SoakArgs),
    /// N resident pods with host ports on a node, `nft flush ruleset`, and
    /// the time until cnikit put the firewall back: the daemon's watch, and
    /// `cnikit firewall restore` beside `nft -f` of the same ruleset.
    Repair(repair::RepairArgs),
    /// The ipamd IPAM plugin exec'd with no daemon: ADD and DEL p50/p95/p99 with the
    /// store prefilled with N leases (`--prefill-leases 10,10000`), beside another
    /// binary (`--compare before=PATH`), taking turns.
    Leases(leases::LeasesArgs),
}

fn main() {
    let args = Args::parse();
    let outcome = match &args.mode {
        Some(Mode::Soak(soak)) => run_soak(soak),
        Some(Mode::Repair(repair)) => run_repair(repair),
        Some(Mode::Leases(l)) => run_leases(l),
        None => run(&args),
    };
    if let Err(e) = outcome {
        eprintln!("cnikit-bench: {e}");
        std::process::exit(1);
    }
    if sandbox::stopping() {
        std::process::exit(130);
    }
}

fn run_soak(args: &soak::SoakArgs) -> Result<(), String> {
    let plugins = locate_plugins(args.cnikit.as_deref(), None, None)?;
    let out = prepare_out_dir(&args.out)?;
    sandbox::enter()?;
    sandbox::loopback_up()?;
    if soak::run(args, &plugins, &out)? {
        Ok(())
    } else {
        Err("soak not clean (failures or leaks; see above)".into())
    }
}

fn run_leases(args: &leases::LeasesArgs) -> Result<(), String> {
    let plugins = locate_plugins(args.cnikit.as_deref(), None, None)?;
    let out = prepare_out_dir(&args.out)?;
    leases::run(args, &plugins.cnikit_bin, &out)
}

fn run_repair(args: &repair::RepairArgs) -> Result<(), String> {
    repair::check(args)?;
    let plugins = locate_plugins(args.cnikit.as_deref(), None, None)?;
    let out = prepare_out_dir(&args.out)?;
    sandbox::enter()?;
    sandbox::loopback_up()?;
    let summary = repair::run(args, &plugins, &out)?;
    let table = repair::text(&summary);
    println!("{table}");
    let json = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    let write = |name: &str, text: &str| {
        std::fs::write(out.join(name), text).map_err(|e| format!("writing {name}: {e}"))
    };
    write("table.txt", &table)?;
    write("repair.json", &json)?;
    println!(
        "wrote {}/{{table.txt,repair.json,daemon.log}}",
        out.display()
    );
    Ok(())
}

fn run(args: &Args) -> Result<(), String> {
    let reference = args.impls.contains(&Impl::Reference);
    let upstream = match (args.impls.contains(&Impl::Upstream), &args.upstream_dir) {
        (false, _) => None,
        (true, Some(dir)) => Some(dir.as_path()),
        (true, None) => return Err("--impls upstream needs --upstream-dir DIR".into()),
    };
    let mut plugins = locate_plugins(
        args.cnikit.as_deref(),
        reference.then_some(args.reference_dir.as_path()),
        upstream,
    )?;
    plugins.daemon_args.clone_from(&args.daemon_args);
    let plan = plan(args);
    check_resident(args.resident, &plan)?;
    let out = prepare_out_dir(&args.out)?;
    sandbox::enter()?;
    sandbox::loopback_up()?;
    let mut keys = Vec::new();
    for &v in &plan.variants {
        keys.extend(plan.impls_for(v).into_iter().map(|imp| (v, imp)));
    }
    let hosts = if args.resident > 0 {
        // The one daemon starts with the first cnikit-daemon setup, in its
        // host: the full variant's, whose firewall requests it serves (it
        // serves only its own namespace; bare has no firewall work).
        keys.sort_by_key(|(v, _)| *v != Variant::Full);
        Hosts::isolated(&keys)?
    } else {
        Hosts::shared()?
    };
    let mut setups = churn::Setups::new();
    for &(v, imp) in &keys {
        let _in = hosts.enter((v, imp))?;
        setups.insert((v, imp), Setup::new(v, imp, &plugins));
    }
    // With residents every pod is churned twice: without them and with them.
    let passes = if args.resident > 0 { 2 } else { 1 };
    let pb = progress(passes * plan.total_pods(), args.quiet, "pods");
    pb.set_message("warming up");
    churn::warm_up(&mut setups, &hosts)?;
    let (runs, summary) = match args.resident {
        0 => (churn::run_all(&plan, &setups, &hosts, &pb)?, None),
        n => {
            let (runs, summary) =
                resident::run(n, &plan, &mut setups, &hosts, &plugins, &pb, args.quiet)?;
            (runs, Some(summary))
        }
    };
    pb.finish_and_clear();
    daemon::stop();
    write_outputs(&out, &runs, summary.as_ref(), args)
}

/// Residents and the churn's pods in flight share one bridge per setup; a
/// resident's host ports come from a block of their own.
fn check_resident(n: u32, plan: &churn::Plan) -> Result<(), String> {
    if n == 0 {
        return Ok(());
    }
    if n > setup::MAX_RESIDENTS {
        return Err(format!(
            "--resident {n}: at most {} (2 host ports each from {}-65535)",
            setup::MAX_RESIDENTS,
            setup::RESIDENT_PORT
        ));
    }
    let w = plan.workers.iter().copied().max().unwrap_or(0);
    if n as usize + w > setup::BRIDGE_MAX_PORTS {
        return Err(format!(
            "--resident {n} with {w} workers needs {} ports on one bridge; a bridge takes at most {}",
            n as usize + w,
            setup::BRIDGE_MAX_PORTS
        ));
    }
    Ok(())
}

fn plan(args: &Args) -> churn::Plan {
    let fixed = args.pods;
    let total = args.total.max(1);
    churn::Plan {
        workers: args.workers.iter().copied().filter(|w| *w > 0).collect(),
        pods_per_worker: Box::new(move |w| fixed.unwrap_or_else(|| total.div_ceil(w)).max(1)),
        rounds: args.rounds,
        variants: args.variants.clone(),
        impls: args.impls.clone(),
    }
}

/// The cnikit binary, and the reference plugin sets that are compared.
fn locate_plugins(
    cnikit: Option<&Path>,
    reference_dir: Option<&Path>,
    upstream_dir: Option<&Path>,
) -> Result<Plugins, String> {
    let cnikit = match cnikit {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("cnikit"),
    };
    let cnikit_bin = cnikit.canonicalize().map_err(|e| {
        format!(
            "cnikit binary {}: {e} (build it: cargo build --release, or pass --cnikit)",
            cnikit.display()
        )
    })?;
    let hints = [
        (reference_dir, "apt-get install containernetworking-plugins"),
        (
            upstream_dir,
            "unpack a containernetworking/plugins release there",
        ),
    ];
    for (dir, hint) in hints {
        if let Some(dir) = dir.filter(|d| !d.join("bridge").is_file()) {
            return Err(format!("no plugins in {} ({hint})", dir.display()));
        }
    }
    let dir_or_none = |d: Option<&Path>| d.map_or_else(PathBuf::new, Path::to_path_buf);
    Ok(Plugins {
        cnikit_bin,
        reference_dir: dir_or_none(reference_dir),
        upstream_dir: dir_or_none(upstream_dir),
        daemon_args: Vec::new(),
    })
}

/// Made before entering the sandbox; it must not be under /run, which the
/// sandbox covers with its own tmpfs.
fn prepare_out_dir(out: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let abs = out.canonicalize().map_err(|e| e.to_string())?;
    if abs.starts_with("/run") {
        return Err("the output directory must not be under /run".into());
    }
    Ok(abs)
}

fn progress(total: u64, quiet: bool, unit: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    let style = ProgressStyle::with_template(&format!(
        "{{spinner}} [{{elapsed_precise}}] {{bar:40.cyan/blue}} {{pos}}/{{len}} {unit}  {{msg}}"
    ));
    if let Ok(style) = style {
        pb.set_style(style);
    }
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

fn write_outputs(
    out: &Path,
    runs: &[churn::Run],
    residents: Option<&resident::Summary>,
    args: &Args,
) -> Result<(), String> {
    let table = match residents {
        Some(r) => resident::growth::tables(runs, r.residents) + &resident::text(r),
        None => report::table(runs),
    };
    println!("{table}");
    // With residents, the plot shows the rounds with them.
    let plotted: Vec<churn::Run> = runs
        .iter()
        .filter(|r| residents.is_none() || r.residents > 0)
        .cloned()
        .collect();
    let settings = serde_json::to_value(args).map_err(|e| e.to_string())?;
    let residents_json = residents
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| e.to_string())?;
    let files = [
        (
            "table.txt",
            std::fs::write(out.join("table.txt"), &table).map_err(|e| e.to_string()),
        ),
        (
            "results.json",
            report::write_json(
                &out.join("results.json"),
                runs,
                &settings,
                residents_json.as_ref(),
            ),
        ),
        (
            "latency.svg",
            plot::write_svg(&out.join("latency.svg"), &plotted, &args.workers),
        ),
    ];
    for (name, result) in files {
        result.map_err(|e| format!("writing {name}: {e}"))?;
    }
    println!(
        "wrote {}/{{table.txt,results.json,latency.svg}}",
        out.display()
    );
    Ok(())
}
