//! The node's ruleset, through `nft` as an operator would touch it: what it
//! holds (counted, to tell a whole repair from a partial one), the flush,
//! and the floor's load of the same ruleset from a file. Each command runs
//! in the calling thread's network namespace (the node's).

use crate::soak::check::stdout_of;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// What cnikit's tables hold, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub tables: usize,
    pub chains: usize,
    pub sets: usize,
    pub rules: usize,
    pub elements: usize,
    /// Elements of `inet cnikit pm4-any`: one per IPv4 host port.
    pub host_ports: usize,
}

impl Counts {
    pub fn read() -> Result<Counts, String> {
        let out = stdout_of("nft", &["-j", "list", "ruleset"])?;
        let v: Value = serde_json::from_slice(&out).map_err(|e| format!("nft JSON: {e}"))?;
        Ok(Counts::of(&v))
    }

    fn of(ruleset: &Value) -> Counts {
        let mut c = Counts::default();
        let objects = ruleset["nftables"].as_array().cloned().unwrap_or_default();
        for obj in &objects {
            let Some((kind, o)) = obj.as_object().and_then(|m| m.iter().next()) else {
                continue;
            };
            let ours = o["table"] == "cnikit" || (kind == "table" && o["name"] == "cnikit");
            if !ours {
                continue;
            }
            match kind.as_str() {
                "table" => c.tables += 1,
                "chain" => c.chains += 1,
                "rule" => c.rules += 1,
                "set" | "map" => {
                    c.sets += 1;
                    let n = o["elem"].as_array().map_or(0, Vec::len);
                    c.elements += n;
                    if o["name"] == "pm4-any" && o["family"] == "inet" {
                        c.host_ports += n;
                    }
                }
                _ => {}
            }
        }
        c
    }

    pub fn text(&self) -> String {
        format!(
            "{} tables, {} chains, {} sets/maps, {} rules, {} elements ({} host ports)",
            self.tables, self.chains, self.sets, self.rules, self.elements, self.host_ports
        )
    }
}

/// One `nft` run: its pid (to find its commit), when it was started and
/// when it had exited.
pub struct Ran {
    pub pid: u32,
    pub started: Instant,
    pub exited: Instant,
}

/// `nft ARGS`, waited for; its stderr as the error when it fails.
pub fn nft(args: &[&str]) -> Result<Ran, String> {
    run("nft", args).map(|(ran, _)| ran)
}

/// Any program, timed as [`nft`] is; also what it printed.
pub fn run(program: &str, args: &[&str]) -> Result<(Ran, Vec<u8>), String> {
    let started = Instant::now();
    let child = Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let pid = child.id();
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let exited = Instant::now();
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let ran = Ran {
        pid,
        started,
        exited,
    };
    Ok((ran, out.stdout))
}

/// The whole ruleset as `nft -f` takes it back.
pub fn save(path: &Path) -> Result<(), String> {
    let text = stdout_of("nft", &["list", "ruleset"])?;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
