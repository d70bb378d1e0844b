//! `dhcp daemon`: the reference's invocation (`/opt/cni/bin/dhcp daemon -socketpath …`)
//! with its flags, Go's flag syntax and defaults. The daemon is cnikit's ipamd daemon
//! (process model, socket activation, peer checks, sd_notify, metrics) hosting the
//! `dhcp` service on the reference's socket, with its lease records in its own data dir.

use super::service::{Dhcp, DhcpOptions};
use super::{Timing, DEFAULT_SOCKET};
use std::path::PathBuf;
use std::time::Duration;

/// Where `dhcp daemon` keeps its state unless `-datadir` says otherwise.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/dhcp";
/// The lease records inside a daemon's data dir. A dot name: network names (the lease
/// API's directories beside it) cannot start with one.
pub const LEASES_SUBDIR: &str = ".dhcp-leases";

/// The daemon's flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Flags {
    pub pidfile: Option<PathBuf>,
    pub host_prefix: PathBuf,
    pub socket: PathBuf,
    pub broadcast: bool,
    pub timing: Timing,
    /// cnikit's: where the lease records (and the daemon's lock) are.
    pub data_dir: PathBuf,
    /// cnikit's: error, warn, info or debug.
    pub log_level: String,
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            pidfile: None,
            host_prefix: PathBuf::new(),
            socket: DEFAULT_SOCKET.into(),
            broadcast: false,
            timing: Timing::default(),
            data_dir: DEFAULT_DATA_DIR.into(),
            log_level: "info".into(),
        }
    }
}

pub const USAGE: &str = "Usage of daemon:
  -broadcast          ask servers to broadcast their answers
  -datadir string     where lease records are kept (default \"/var/lib/cni/dhcp\")
  -hostprefix string  optional prefix to host root
  -loglevel string    error, warn, info or debug (default \"info\")
  -pidfile string     optional path to write daemon PID to
  -resendmax duration optional dhcp client max resend delay between requests (default 1m2s)
  -resendtimeout duration  no more retries after this timeout (default 3m28s)
  -socketpath string  optional dhcp server socketpath (default \"/run/cni/dhcp.sock\")
  -timeout duration   optional dhcp client timeout duration for each request (default 10s)";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Run(Flags),
    Help,
}

/// Go's `flag` package rules: `-name`, `--name`, `-name=value`, `-name value` (not for
/// booleans), parsing ends at `--` or the first argument that is not a flag.
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut flags = Flags::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" || !arg.starts_with('-') || arg == "-" {
            break;
        }
        let body = arg.trim_start_matches('-');
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        if name == "h" || name == "help" {
            return Ok(Parsed::Help);
        }
        if name == "broadcast" {
            flags.broadcast = match inline.as_deref() {
                None | Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
                Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
                Some(v) => return Err(format!("invalid boolean value {v:?} for -broadcast")),
            };
            continue;
        }
        const VALUED: [&str; 8] = [
            "pidfile",
            "hostprefix",
            "socketpath",
            "timeout",
            "resendmax",
            "resendtimeout",
            "datadir",
            "loglevel",
        ];
        if !VALUED.contains(&name) {
            return Err(format!("flag provided but not defined: -{name}"));
        }
        let value = match inline {
            Some(v) => v,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: -{name}"))?,
        };
        let duration = |v: &str| {
            go_duration(v).map_err(|e| format!("invalid value {v:?} for flag -{name}: {e}"))
        };
        match name {
            "pidfile" => flags.pidfile = Some(value.into()),
            "hostprefix" => flags.host_prefix = value.into(),
            "socketpath" if value.is_empty() => {}
            "socketpath" => flags.socket = value.into(),
            "timeout" => flags.timing.reply = duration(&value)?,
            "resendmax" => flags.timing.resend_max = duration(&value)?,
            "resendtimeout" => flags.timing.exchange = duration(&value)?,
            "datadir" => flags.data_dir = value.into(),
            "loglevel" => flags.log_level = value,
            _ => return Err(format!("flag provided but not defined: -{name}")),
        }
    }
    Ok(Parsed::Run(flags))
}

/// A Go duration: a sequence of decimal numbers with units (`300ms`, `1m30s`, `1.5h`).
pub fn go_duration(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() || text.starts_with('-') {
        return Err("not a positive duration".into());
    }
    let mut total = 0f64;
    let mut s = text.trim_start_matches('+');
    while !s.is_empty() {
        let num_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let number: f64 = s[..num_end]
            .parse()
            .map_err(|_| format!("missing number in {text:?}"))?;
        s = &s[num_end..];
        let unit_end = s
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(s.len());
        let nanos = match &s[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("missing unit in {text:?}")),
            u => return Err(format!("unknown unit {u:?} in {text:?}")),
        };
        total += number * nanos;
        s = &s[unit_end..];
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Runs `dhcp daemon ARGS…` until SIGTERM/SIGINT; the process's exit status.
pub fn main(args: &[String]) -> i32 {
    let flags = match parse(args) {
        Ok(Parsed::Run(f)) => f,
        Ok(Parsed::Help) => {
            eprintln!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return 2;
        }
    };
    match run(&flags) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dhcp daemon: {e}");
            1
        }
    }
}

fn run(flags: &Flags) -> Result<(), String> {
    let pidfile = match &flags.pidfile {
        Some(p) if !p.is_absolute() => {
            return Err(format!(
                "error writing pidfile {}: path not absolute",
                p.display()
            ))
        }
        Some(p) => Some(write_pidfile(p)?),
        None => None,
    };
    // Before the leases are resumed, whose threads log from the start.
    let level = ipamd::log::Level::parse(&flags.log_level).ok_or_else(|| {
        format!(
            "-loglevel {:?} is not one of error, warn, info, debug",
            flags.log_level
        )
    })?;
    ipamd::log::set_level(level);
    // The data dir is the daemon's to trust before a record in it is read: one that
    // another user could change would let them swap the records under it.
    ipamd::files::create_dir(&flags.data_dir, ipamd::files::DATA_DIR_MODE)
        .and_then(|_| ipamd::files::check_owner(&flags.data_dir))
        .map_err(|e| e.to_string())?;
    let service = Dhcp::start(DhcpOptions {
        state_dir: flags.data_dir.join(LEASES_SUBDIR),
        timing: flags.timing,
        broadcast: flags.broadcast,
        host_prefix: flags.host_prefix.clone(),
    })
    .map_err(|e| e.to_string())?;
    let mut socket = flags.host_prefix.clone().into_os_string();
    socket.push(flags.socket.as_os_str());
    let out = ipamd::daemon::run(ipamd::daemon::DaemonOptions {
        socket: socket.into(),
        data_dir: flags.data_dir.clone(),
        // This daemon keeps no ipamd leases: nothing to reclaim.
        reclaim_previous_boot: false,
        log_level: flags.log_level.clone(),
        allowed_gid: None,
        services: ipamd::service::Services::new().with(service),
        cluster: None,
        block_routes: None,
        plugin_calls: false,
    })
    .map_err(|e| e.to_string());
    if let Some(p) = pidfile {
        let _ = std::fs::remove_file(p);
    }
    out
}

/// The pid, in a file made with an explicit mode and not through a link.
fn write_pidfile(path: &std::path::Path) -> Result<PathBuf, String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|mut f| {
            f.write_all(std::process::id().to_string().as_bytes())
                .map(|()| f)
        })
        .map_err(|e| format!("error writing pidfile {}: {e}", path.display()))?;
    let _ = f.flush();
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn go_flag_forms() {
        let Parsed::Run(f) = parse(&args(&[
            "-socketpath",
            "/tmp/d.sock",
            "--timeout=3s",
            "-broadcast",
            "-resendmax",
            "1m2s",
            "-resendtimeout=1.5s",
            "-hostprefix=/host",
            "-pidfile",
            "/run/d.pid",
        ]))
        .unwrap() else {
            panic!("help")
        };
        assert_eq!(f.socket, PathBuf::from("/tmp/d.sock"));
        assert_eq!(f.timing.reply, Duration::from_secs(3));
        assert_eq!(f.timing.resend_max, Duration::from_secs(62));
        assert_eq!(f.timing.exchange, Duration::from_millis(1500));
        assert!(f.broadcast);
        assert_eq!(f.host_prefix, PathBuf::from("/host"));
        assert_eq!(parse(&args(&["-h"])).unwrap(), Parsed::Help);
        assert_eq!(parse(&args(&[])).unwrap(), Parsed::Run(Flags::default()));
        assert!(parse(&args(&["-bogus"]))
            .unwrap_err()
            .contains("not defined"));
        assert!(parse(&args(&["-timeout"]))
            .unwrap_err()
            .contains("needs an argument"));
        assert!(parse(&args(&["-broadcast=maybe"])).is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(go_duration("1h2m3s").unwrap(), Duration::from_secs(3723));
        assert_eq!(go_duration("0").unwrap(), Duration::ZERO);
        assert!(go_duration("10").is_err());
        assert!(go_duration("5x").is_err());
        assert!(go_duration("-1s").is_err());
    }
}
