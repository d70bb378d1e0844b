//! `cnikit-bench leases`: what one IPAM call costs as the store fills up. The real plugin
//! binary, exec'd as `ipamd` the way an interface plugin or a runtime execs it, with no
//! daemon (its socket names nothing), so every call does its work in-process on the
//! store's files; ADD then DEL of a new attachment, timed from spawn to exit.
//!
//! Each store is prefilled with N leases by the first binary itself (N ADDs, through the
//! product's own code path), then copied for every binary measured, so each binary has a
//! store of its own with the same leases. Binaries and lease counts take turns in rounds,
//! so drift on a noisy machine hits them alike.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::report::{summarize, Summary};
use crate::sandbox;

#[derive(clap::Args, Debug, serde::Serialize)]
pub struct LeasesArgs {
    /// Leases in the store while the calls are timed (one store per count).
    #[arg(
        long = "prefill-leases",
        value_delimiter = ',',
        default_value = "10,10000"
    )]
    pub prefill: Vec<u32>,
    /// Timed ADD+DEL pairs per binary and lease count.
    #[arg(long, default_value_t = 400)]
    pub calls: usize,
    /// Rounds the calls are split into, taken in turns.
    #[arg(long, default_value_t = 8)]
    pub rounds: usize,
    /// The cnikit binary [default: `cnikit` next to this program]; it also prefills.
    #[arg(long)]
    pub cnikit: Option<PathBuf>,
    /// Another cnikit binary measured beside it, as LABEL=PATH (e.g. `before=/tmp/cnikit`).
    #[arg(long)]
    pub compare: Option<String>,
    /// Where the stores live [default: the sandbox's tmpfs]; a directory on the node's
    /// disk measures its fsyncs too. A fresh subdirectory is made and removed.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Where table.txt and leases.json go.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

/// One binary at one lease count.
#[derive(Debug, serde::Serialize)]
struct Cell {
    binary: String,
    leases: u32,
    add_ms: Vec<f64>,
    del_ms: Vec<f64>,
}

struct Binary {
    label: String,
    /// A directory with `ipamd` linking to the binary (CNI_PATH).
    links: PathBuf,
}

pub fn run(args: &LeasesArgs, cnikit: &Path, out: &Path) -> Result<(), String> {
    let mut bins = vec![("cnikit".to_string(), cnikit.to_path_buf())];
    if let Some(spec) = &args.compare {
        let (label, path) = spec.split_once('=').ok_or("--compare wants LABEL=PATH")?;
        let path = Path::new(path)
            .canonicalize()
            .map_err(|e| format!("--compare {path}: {e}"))?;
        bins.push((label.to_string(), path));
    }
    sandbox::enter()?;
    let root = match &args.data_dir {
        Some(d) => d.join(format!("cnikit-bench-leases-{}", std::process::id())),
        None => Path::new(sandbox::STATE).join("leases"),
    };
    mkdir(&root)?;
    let res = measure(args, &bins, &root);
    // Ours alone: made fresh above.
    let _ = std::fs::remove_dir_all(&root);
    let cells = res?;
    let table = text(&cells);
    println!("{table}");
    let json = serde_json::json!({"args": args, "cells": cells});
    std::fs::write(out.join("table.txt"), &table).map_err(|e| format!("table.txt: {e}"))?;
    std::fs::write(out.join("leases.json"), json.to_string())
        .map_err(|e| format!("leases.json: {e}"))?;
    println!("wrote {}/{{table.txt,leases.json}}", out.display());
    Ok(())
}

fn mkdir(d: &Path) -> Result<(), String> {
    std::fs::create_dir_all(d).map_err(|e| format!("mkdir {}: {e}", d.display()))
}

fn measure(
    args: &LeasesArgs,
    bins: &[(String, PathBuf)],
    root: &Path,
) -> Result<Vec<Cell>, String> {
    let mut binaries = Vec::new();
    for (label, path) in bins {
        let links = root.join(format!("bin-{label}"));
        mkdir(&links)?;
        std::os::unix::fs::symlink(path, links.join("ipamd"))
            .map_err(|e| format!("linking {}: {e}", path.display()))?;
        binaries.push(Binary {
            label: label.clone(),
            links,
        });
    }
    let mut cells = Vec::new();
    for &n in &args.prefill {
        let seed = root.join(format!("seed-{n}"));
        eprintln!("prefilling a store with {n} leases ({})", binaries[0].label);
        for i in 0..n {
            call(&binaries[0], &seed, "ADD", &format!("prefill-{i}"))?;
        }
        for b in &binaries {
            let copy = store_of(root, b, n);
            let status = Command::new("cp").arg("-a").arg(&seed).arg(&copy).status();
            if !status.is_ok_and(|s| s.success()) {
                return Err(format!("copying {} to {}", seed.display(), copy.display()));
            }
            cells.push(Cell {
                binary: b.label.clone(),
                leases: n,
                add_ms: Vec::new(),
                del_ms: Vec::new(),
            });
        }
    }
    let per_round = args.calls.div_ceil(args.rounds.max(1));
    for round in 0..args.rounds.max(1) {
        for cell in cells.iter_mut() {
            let b = binaries
                .iter()
                .find(|b| b.label == cell.binary)
                .ok_or("unknown binary")?;
            let dir = store_of(root, b, cell.leases);
            for i in 0..per_round {
                let cid = format!("timed-{round}-{i}");
                cell.add_ms.push(call(b, &dir, "ADD", &cid)?);
                cell.del_ms.push(call(b, &dir, "DEL", &cid)?);
            }
        }
        eprintln!("round {}/{} done", round + 1, args.rounds.max(1));
    }
    Ok(cells)
}

fn store_of(root: &Path, b: &Binary, leases: u32) -> PathBuf {
    root.join(format!("store-{}-{leases}", b.label))
}

/// One plugin exec; its wall time in ms. The socket names nothing, so no daemon serves it.
fn call(b: &Binary, data_dir: &Path, verb: &str, cid: &str) -> Result<f64, String> {
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "leasebench",
        "type": "ipamd",
        "ipam": {
            "type": "ipamd",
            "subnet": "10.200.0.0/16",
            "dataDir": data_dir,
            "socket": data_dir.with_extension("no-daemon.sock"),
        }
    })
    .to_string();
    let start = Instant::now();
    let mut child = Command::new(b.links.join("ipamd"))
        .env_clear()
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &b.links)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("exec {}: {e}", b.label))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(conf.as_bytes())
            .map_err(|e| format!("writing to {}: {e}", b.label))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {}: {e}", b.label))?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        return Err(format!(
            "{} {verb} {cid} failed ({}): {}{}",
            b.label,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(ms)
}

fn text(cells: &[Cell]) -> String {
    let mut s = String::from(
        "binary     leases  calls |  ADD p50    p95    p99 |  DEL p50    p95    p99\n",
    );
    let fig = |v: &[f64]| summarize(v).unwrap_or_default();
    for c in cells {
        let (a, d): (Summary, Summary) = (fig(&c.add_ms), fig(&c.del_ms));
        s.push_str(&format!(
            "{:<10} {:>6} {:>6} | {:>8.2} {:>6.2} {:>6.2} | {:>8.2} {:>6.2} {:>6.2}\n",
            c.binary,
            c.leases,
            c.add_ms.len(),
            a.p50,
            a.p95,
            a.p99,
            d.p50,
            d.p95,
            d.p99
        ));
    }
    // Growth per binary: the largest count's ADD p50 over the smallest's.
    let mut labels: Vec<&str> = Vec::new();
    for c in cells {
        if !labels.contains(&c.binary.as_str()) {
            labels.push(&c.binary);
        }
    }
    for label in labels {
        let mine: Vec<&Cell> = cells.iter().filter(|c| c.binary == label).collect();
        let lo = mine.iter().min_by_key(|c| c.leases);
        let hi = mine.iter().max_by_key(|c| c.leases);
        if let (Some(lo), Some(hi)) = (lo, hi) {
            let (l, h) = (fig(&lo.add_ms).p50, fig(&hi.add_ms).p50);
            s.push_str(&format!(
                "{label}: ADD p50 with {} leases / with {}: {:.2}x\n",
                hi.leases,
                lo.leases,
                h / l
            ));
        }
    }
    s
}
