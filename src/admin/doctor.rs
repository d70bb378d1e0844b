//! `cnikit doctor`: checks a node the way an operator would by hand, one line
//! per check (ok / warn / fail, and for anything not ok, the fix). It only
//! reads: links, configuration files, the daemon's `/healthz` and `/metrics`
//! (cluster pools), cnikit's nftables tables (over netlink) and the lease store.

mod host;
mod leases;
mod pools;

use host::{daemon, nftables};

use crate::plugins;
use crate::runtime::{self, ConfList};
use serde::Serialize;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// The CNI bin directory whose plugin links are checked.
    #[arg(long, value_name = "DIR", default_value = "/opt/cni/bin")]
    pub bin_dir: PathBuf,
    /// The directory of network configuration lists.
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    pub conf_dir: PathBuf,
    /// The ipamd daemon's socket (none there: in-process mode).
    #[arg(long, value_name = "PATH", default_value = ipamd::config::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// The ipamd lease store.
    #[arg(long, value_name = "DIR", default_value = ipamd::config::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// One JSON document instead of lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub check: String,
    pub status: Status,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(check: impl Into<String>, message: impl Into<String>) -> Check {
        Check {
            check: check.into(),
            status: Status::Ok,
            message: message.into(),
            fix: None,
        }
    }
    fn warn(check: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            status: Status::Warn,
            fix: Some(fix.into()),
            ..Check::ok(check, message)
        }
    }
    fn fail(check: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            status: Status::Fail,
            fix: Some(fix.into()),
            ..Check::ok(check, message)
        }
    }

    fn line(&self) -> String {
        let status = match self.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        };
        let mut line = format!("{status:<4}  {}: {}", self.check, self.message);
        if let Some(fix) = &self.fix {
            line.push_str(&format!("\n      fix: {fix}"));
        }
        line
    }
}

/// Run every check and print the report; an error (exit status 1) when any
/// check failed.
pub fn run(args: DoctorArgs) -> Result<(), String> {
    let mut checks = links(&args.bin_dir);
    let (conf_checks, lists) = conf_dir(&args.conf_dir, &args.bin_dir);
    checks.extend(conf_checks);
    let (daemon_check, answered) = daemon(&args.socket);
    checks.push(daemon_check);
    if answered {
        checks.extend(pools::pools(&args.socket));
    }
    let (lease_checks, live) = leases::leases(&args, answered);
    checks.push(nftables(&lists, &live, crate::firewall::inspect::tables));
    checks.extend(lease_checks);

    let count = |s| checks.iter().filter(|c| c.status == s).count();
    let (warned, failed) = (count(Status::Warn), count(Status::Fail));
    if args.json {
        let doc = serde_json::json!({
            "checks": checks,
            "ok": count(Status::Ok),
            "warn": warned,
            "fail": failed,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?
        );
    } else {
        for c in &checks {
            println!("{}", c.line());
        }
        println!(
            "{} checks: {} ok, {warned} warning(s), {failed} failed",
            checks.len(),
            count(Status::Ok)
        );
    }
    if failed > 0 {
        return Err(format!("{failed} check(s) failed; see the fixes above"));
    }
    Ok(())
}

/// Every plugin name in `bin` must be this binary: a link resolving to it,
/// a hard link, or a copy (`install --copy`).
pub fn links(bin: &Path) -> Vec<Check> {
    let me = match std::env::current_exe().and_then(|p| p.canonicalize()) {
        Ok(me) => me,
        Err(e) => {
            return vec![Check::fail(
                "links",
                format!("cannot find the running binary: {e}"),
                "run doctor as the installed cnikit (e.g. /opt/cni/bin/cnikit doctor)",
            )]
        }
    };
    links_to(bin, &me)
}

pub fn links_to(bin: &Path, me: &Path) -> Vec<Check> {
    let install = format!("cnikit install --dir {}", bin.display());
    if !bin.is_dir() {
        return vec![Check::fail(
            "links",
            format!("{} is not a directory", bin.display()),
            install,
        )];
    }
    plugins::NAMES
        .iter()
        .map(|name| {
            let check = format!("link {name}");
            let path = bin.join(name);
            let replace = format!("{install} --force (replaces it)");
            match std::fs::symlink_metadata(&path) {
                Err(_) => Check::fail(
                    check,
                    format!("{} is missing", path.display()),
                    install.clone(),
                ),
                Ok(m) if m.file_type().is_symlink() => match path.canonicalize() {
                    Ok(t) if t == me => {
                        Check::ok(check, format!("{} -> {}", path.display(), me.display()))
                    }
                    Ok(t) => Check::fail(
                        check,
                        format!(
                            "{} points at {}, not at this binary ({})",
                            path.display(),
                            t.display(),
                            me.display()
                        ),
                        replace,
                    ),
                    Err(e) => Check::fail(
                        check,
                        format!("{} is a dangling link: {e}", path.display()),
                        replace,
                    ),
                },
                Ok(m) if m.is_file() => {
                    if is_same_program(&path, &m, me) {
                        Check::ok(check, format!("{} is this binary", path.display()))
                    } else {
                        Check::fail(
                            check,
                            format!(
                                "{} is another program, not this binary ({})",
                                path.display(),
                                me.display()
                            ),
                            format!(
                                "{replace}; add --copy if {} is on another filesystem",
                                bin.display()
                            ),
                        )
                    }
                }
                Ok(_) => Check::fail(
                    check,
                    format!("{} is neither a file nor a link", path.display()),
                    format!("remove it, then {install}"),
                ),
            }
        })
        .collect()
}

/// A hard link of `me`, or a copy of it (`install --copy`).
fn is_same_program(path: &Path, meta: &std::fs::Metadata, me: &Path) -> bool {
    let Ok(mine) = std::fs::metadata(me) else {
        return false;
    };
    if (meta.dev(), meta.ino()) == (mine.dev(), mine.ino()) {
        return true;
    }
    meta.len() == mine.len()
        && matches!((std::fs::read(path), std::fs::read(me)), (Ok(a), Ok(b)) if a == b)
}

/// Each configuration file must parse, and every plugin type it names (and
/// each `ipam.type`) must be an executable in `bin`. Returns the lists that
/// parsed, for the checks after this one.
pub fn conf_dir(dir: &Path, bin: &Path) -> (Vec<Check>, Vec<ConfList>) {
    let examples = "/usr/share/doc/cnikit/examples/";
    let files = match runtime::load_all(dir) {
        Ok(f) => f,
        Err(e) => {
            let fix = format!(
                "create {} with a network list (examples: {examples})",
                dir.display()
            );
            return (
                vec![Check::fail("conf dir", e.to_string(), fix)],
                Vec::new(),
            );
        }
    };
    if files.is_empty() {
        let check = Check::warn(
            "conf dir",
            format!(
                "no network configuration in {}: runtimes report the network as not ready",
                dir.display()
            ),
            format!("add a .conflist (examples: {examples})"),
        );
        return (vec![check], Vec::new());
    }
    let mut checks = Vec::new();
    let mut lists: Vec<ConfList> = Vec::new();
    for (path, parsed) in files {
        let file = path.file_name().unwrap_or_default().to_string_lossy();
        let check = format!("conf {file}");
        let list = match parsed {
            Ok(list) => list,
            Err(e) => {
                checks.push(Check::fail(
                    check,
                    e.to_string(),
                    "correct the file; runtimes skip it",
                ));
                continue;
            }
        };
        if let Some(first) = lists.iter().find(|l| l.name == list.name) {
            checks.push(Check::warn(
                check,
                format!(
                    "network {:?} is also defined by {}, which runtimes use; this file is ignored",
                    list.name,
                    first.source.display()
                ),
                "remove this file or rename its network",
            ));
            continue;
        }
        checks.push(plugins_present(check, &list, bin));
        lists.push(list);
    }
    (checks, lists)
}

fn plugins_present(check: String, list: &ConfList, bin: &Path) -> Check {
    let types = plugin_types(list);
    let missing: Vec<&str> = types
        .iter()
        .map(String::as_str)
        .filter(|t| !is_executable(&bin.join(t)))
        .collect();
    if missing.is_empty() {
        return Check::ok(
            check,
            format!(
                "network {:?}: {} all in {}",
                list.name,
                types.join(", "),
                bin.display()
            ),
        );
    }
    let (ours, others): (Vec<&str>, Vec<&str>) = missing
        .iter()
        .copied()
        .partition(|t| plugins::NAMES.contains(t));
    let mut fixes = Vec::new();
    if !ours.is_empty() {
        fixes.push(format!(
            "cnikit install --dir {} (gives {})",
            bin.display(),
            ours.join(", ")
        ));
    }
    if !others.is_empty() {
        fixes.push(format!(
            "install {} into {} (not part of cnikit) or change the \"type\" in the file",
            others.join(", "),
            bin.display()
        ));
    }
    let fix = fixes.join("; ");
    Check::fail(
        check,
        format!(
            "network {:?} names plugin(s) missing from {}: {}",
            list.name,
            bin.display(),
            missing.join(", ")
        ),
        fix,
    )
}

/// The `type` of every plugin of the list and of every `ipam` object in it
/// (keys matched as Go does), each once, in order.
pub fn plugin_types(list: &ConfList) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for plugin in canonical_plugins(list) {
        let ipam = plugin.get("ipam").and_then(|i| i.get("type"));
        for t in [plugin.get("type"), ipam].into_iter().flatten() {
            if let Some(t) = t.as_str().filter(|t| !t.is_empty() && !t.contains('/')) {
                if !out.iter().any(|o| o == t) {
                    out.push(t.to_string());
                }
            }
        }
    }
    out
}

pub(super) fn canonical_plugins(list: &ConfList) -> impl Iterator<Item = Value> + '_ {
    list.plugins.iter().map(|p| {
        let mut v = Value::Object(p.clone());
        crate::cni::gojson::canonicalize(&mut v);
        v
    })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests;
