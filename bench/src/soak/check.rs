//! The end-of-soak accounting: after the last DEL nothing of any pod may be
//! left. Each check reads the state back from where the product keeps it
//! (the daemon, the store files, the kernel, nftables, /run); anything found
//! is a leak, and a check that could not run counts as one, since it proves
//! nothing.

use crate::daemon;
use crate::sandbox::{NETNS_DIR, STATE};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub what: &'static str,
    /// Leftover items; None when the check could not be made.
    pub found: Option<usize>,
    /// The first leftovers, or why the check failed.
    pub detail: String,
}

impl Check {
    pub fn clean(&self) -> bool {
        self.found == Some(0)
    }
}

pub(crate) fn check(what: &'static str, r: Result<Vec<String>, String>) -> Check {
    match r {
        Ok(items) => Check {
            what,
            found: Some(items.len()),
            detail: items.into_iter().take(10).collect::<Vec<_>>().join(", "),
        },
        Err(e) => Check {
            what,
            found: None,
            detail: e,
        },
    }
}

/// Leases of `network` as the daemon serves them: called while it runs.
pub fn leases_from_daemon(cnikit: &Path, network: &str) -> Check {
    check("leases (daemon)", leases(cnikit, network))
}

/// The rest, after the daemon was stopped: the lease list now comes from
/// the store files (in-process, as with no daemon), which must agree.
pub fn after_stop(cnikit: &Path, network: &str, bridge: &str) -> Vec<Check> {
    vec![
        check("leases (store files)", leases(cnikit, network)),
        check("store fsck", fsck(cnikit, network)),
        check("host links", links(bridge)),
        check("pod netns", dir_entries(Path::new(NETNS_DIR))),
        check("nft elements", nft_elements()),
        check(
            "portmap markers",
            dir_entries(Path::new("/run/cnikit/portmap")),
        ),
        check("firewall records", firewall_records()),
        // The runtime's (libcni-equivalent) result cache; DEL removes entries.
        check(
            "runtime cache",
            dir_entries(&Path::new(STATE).join("cache-cnikit-daemon")),
        ),
    ]
}

fn run(cnikit: &Path, args: &[&str]) -> Result<(bool, String, String), String> {
    let out = Command::new(cnikit)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", cnikit.display()))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn leases(cnikit: &Path, network: &str) -> Result<Vec<String>, String> {
    leases_at(cnikit, network, daemon::SOCKET, daemon::DATA_DIR)
}

/// Leases of `network` from the daemon on `socket`, or from the store files
/// in `data_dir` when nothing answers there.
pub(crate) fn leases_at(
    cnikit: &Path,
    network: &str,
    socket: &str,
    data_dir: &str,
) -> Result<Vec<String>, String> {
    let (ok, stdout, stderr) = run(
        cnikit,
        &[
            "ipamd",
            "leases",
            "--json",
            "--network",
            network,
            "--socket",
            socket,
            "--data-dir",
            data_dir,
        ],
    )?;
    if !ok {
        return Err(format!("cnikit ipamd leases: {}", stderr.trim()));
    }
    let v: Value = serde_json::from_str(&stdout).map_err(|e| format!("leases JSON: {e}"))?;
    let list = v.as_array().ok_or("leases JSON: not a list")?;
    Ok(list
        .iter()
        .map(|l| format!("{} {}", str_of(&l["address"]), str_of(&l["containerId"])))
        .collect())
}

/// The store's own consistency check; a damaged file is one item.
fn fsck(cnikit: &Path, network: &str) -> Result<Vec<String>, String> {
    let args = [
        "ipamd",
        "fsck",
        "--data-dir",
        daemon::DATA_DIR,
        "--network",
        network,
    ];
    let (ok, stdout, stderr) = run(cnikit, &args)?;
    if ok {
        Ok(Vec::new())
    } else {
        Ok(vec![format!("{} {}", stdout.trim(), stderr.trim())])
    }
}

/// Every host link but lo and the bridge: a veth left by a pod, mostly.
/// Read with `ip` (the library lists links only in its tests).
pub(crate) fn links(bridge: &str) -> Result<Vec<String>, String> {
    let out = stdout_of("ip", &["-j", "-d", "link", "show"])?;
    let v: Value = serde_json::from_slice(&out).map_err(|e| format!("ip JSON: {e}"))?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            let name = l["ifname"].as_str()?;
            let kind = l["linkinfo"]["info_kind"].as_str().unwrap_or("?");
            (name != "lo" && name != bridge).then(|| format!("{name} ({kind})"))
        })
        .collect())
}

pub(crate) fn dir_entries(dir: &Path) -> Result<Vec<String>, String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => Ok(rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        // Never made: nothing in it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// The attachments' firewall records (`/run/cnikit/firewall/<netns>/<network>/<owner>.<feature>`):
/// DEL and GC remove them with the attachment's entries.
pub(crate) fn firewall_records() -> Result<Vec<String>, String> {
    let root = Path::new("/run/cnikit/firewall");
    let mut records = Vec::new();
    for netns in dir_entries(root)? {
        let netns_dir = root.join(&netns);
        for network in dir_entries(&netns_dir)? {
            let network_dir = netns_dir.join(&network);
            if network_dir.is_dir() {
                records.extend(
                    dir_entries(&network_dir)?
                        .into_iter()
                        .map(|r| format!("{netns}/{network}/{r}")),
                );
            }
        }
    }
    Ok(records)
}

/// The whole ruleset as nft's JSON (the product itself never execs nft;
/// reading state back in the bench is fine).
fn nft_ruleset() -> Result<Value, String> {
    let out = stdout_of("nft", &["-j", "list", "ruleset"])?;
    serde_json::from_slice(&out).map_err(|e| format!("nft JSON: {e}"))
}

/// What a state-reading tool printed; its stderr as the error when it fails.
pub(crate) fn stdout_of(program: &str, args: &[&str]) -> Result<Vec<u8>, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// Elements of every set and map in cnikit's tables.
pub(crate) fn nft_elements() -> Result<Vec<String>, String> {
    Ok(elements_of_cnikit(&nft_ruleset()?))
}

/// Rules with a comment in the named tables: the upstream plugins' nftables
/// backends add one such rule per attachment (the comment names it).
pub(crate) fn nft_commented_rules(tables: &[&str]) -> Result<Vec<String>, String> {
    let v = nft_ruleset()?;
    let objects = v["nftables"].as_array().cloned().unwrap_or_default();
    Ok(objects
        .iter()
        .map(|o| &o["rule"])
        .filter(|r| tables.iter().any(|t| r["table"] == *t))
        .filter_map(|r| {
            let comment = r["comment"].as_str()?;
            Some(format!(
                "{} {} ({comment})",
                str_of(&r["table"]),
                str_of(&r["chain"])
            ))
        })
        .collect())
}

fn elements_of_cnikit(ruleset: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let objects = ruleset["nftables"].as_array().cloned().unwrap_or_default();
    for obj in &objects {
        for kind in ["set", "map"] {
            let s = &obj[kind];
            if s["table"] != "cnikit" {
                continue;
            }
            for e in s["elem"].as_array().into_iter().flatten() {
                // A set element is {"elem": {...}}, a map's [key, value];
                // the comment names the attachment that owns it.
                let key = if e.is_array() { &e[0] } else { e };
                let owner = key["elem"]["comment"].as_str().unwrap_or("?");
                let (family, name) = (&s["family"], &s["name"]);
                found.push(format!("{} {} ({owner})", str_of(family), str_of(name)));
            }
        }
    }
    found
}

/// Rules in cnikit's tables: not a leak check (the skeleton's rules stay),
/// but it shows that the rule count did not grow with the pods.
pub fn nft_rules() -> Option<usize> {
    let v = nft_ruleset().ok()?;
    let objects = v["nftables"].as_array()?;
    Some(
        objects
            .iter()
            .filter(|o| o["rule"]["table"] == "cnikit")
            .count(),
    )
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}
