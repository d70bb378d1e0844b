//! `cnikit net add|check|del|gc|status NETWORK [NETNS]`: the runtime on the
//! command line, with cnitool's environment variables as defaults.

use super::{load_by_name, Attachment, ConfList, Error, Gone, Outcome, Runtime};
use crate::cni::Attachment as Key;
use serde_json::{Map, Value};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Verb {
    Add,
    Check,
    Del,
    Gc,
    Status,
}

#[derive(Debug, clap::Args)]
pub struct NetArgs {
    /// What to do with the attachment (gc and status act on the network).
    #[arg(value_enum)]
    pub command: Verb,
    /// The network: the "name" of a .conflist (or legacy .conf/.json) in the conf dir.
    pub network: String,
    /// The network namespace: a path (/run/netns/x, /proc/PID/ns/net) or a
    /// name under /run/netns. Not used by gc and status; del can do without
    /// it when --container-id is given (the cached one is used).
    pub netns: Option<String>,
    /// Where the network configurations are [env: NETCONFPATH] [default: /etc/cni/net.d]
    #[arg(long, value_name = "DIR")]
    pub conf_dir: Option<PathBuf>,
    /// Where the plugins are, ':'-separated [env: CNI_PATH] [default: /opt/cni/bin]
    #[arg(long, value_name = "DIRS")]
    pub cni_path: Option<OsString>,
    /// The container ID [default: derived from the netns path, stable]
    #[arg(long, value_name = "ID")]
    pub container_id: Option<String>,
    /// The interface name inside the namespace.
    #[arg(long, default_value = "eth0")]
    pub ifname: String,
    /// Capability arguments as a JSON object, e.g. '{"portMappings":[…]}' [env: CAP_ARGS]
    #[arg(long, value_name = "JSON")]
    pub cap_args: Option<String>,
    /// Generic arguments `K=V;K=V`, passed as CNI_ARGS [env: CNI_ARGS]
    #[arg(long, value_name = "K=V;…")]
    pub args: Option<String>,
    /// The result cache (one file per network, container and interface).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/cni/results")]
    pub cache_dir: PathBuf,
    /// gc: an attachment whose container is gone (DEL it and forget it);
    /// repeatable. All other cached attachments are passed as valid.
    #[arg(long, value_name = "ID[/IFNAME]")]
    pub gone: Vec<String>,
}

/// Run one command. Results go to stdout (ADD: the result JSON; a plugin
/// failure: the plugin's error object); the returned error is the one-line
/// story for stderr.
pub fn run(args: NetArgs) -> Result<(), String> {
    let conf_dir = flag_or_env(args.conf_dir.clone(), "NETCONFPATH", "/etc/cni/net.d");
    let list = match load_by_name(&conf_dir, &args.network) {
        Ok(list) => list,
        Err(e) => return report(Err(e), args.command, LATEST),
    };
    let mut runtime = Runtime::new(cni_path(&args), args.cache_dir.clone());
    runtime.check_results = true;
    let outcome = dispatch(&runtime, &list, &args);
    let version = if list.version.is_empty() {
        LATEST
    } else {
        &list.version
    };
    report(outcome, args.command, version)
}

/// Labels error objects when no list version is known.
const LATEST: &str = "1.1.0";

fn dispatch(rt: &Runtime, list: &ConfList, args: &NetArgs) -> Result<Outcome, Error> {
    if matches!(args.command, Verb::Gc | Verb::Status) {
        if let Some(ns) = &args.netns {
            return Err(Error::Runtime(format!(
                "{:?} takes no network namespace (got {ns:?})",
                args.command
            )));
        }
    }
    match args.command {
        Verb::Add => {
            let result = rt.add(list, &attachment(args, rt, list)?)?;
            print_json(&result);
            Ok(Outcome::default())
        }
        Verb::Check => rt.check(list, &attachment(args, rt, list)?),
        Verb::Del => rt
            .del(list, &attachment(args, rt, list)?)
            .map(|()| Outcome::default()),
        Verb::Gc => {
            let gone: Vec<Gone> = args.gone.iter().map(|g| Gone::parse(g)).collect();
            rt.gc(list, &gone)
        }
        Verb::Status => rt.status(list),
    }
}

fn report(outcome: Result<Outcome, Error>, verb: Verb, version: &str) -> Result<(), String> {
    match outcome {
        Ok(o) => {
            for n in o.notes {
                eprintln!("cnikit net: {n}");
            }
            Ok(())
        }
        Err(e) => {
            print_json(&error_object(&e, version));
            Err(format!("net {}: {e}", verb_name(verb)))
        }
    }
}

/// Exactly one CNI error object on stdout, like a plugin prints, so scripts
/// handle `cnikit net` and plugins alike. A plugin's failure keeps its code
/// and details, and its message says which plugin it was; the runtime's own
/// refusals (configuration, arguments) are code 7, cache I/O is 5.
pub fn error_object(e: &Error, version: &str) -> Value {
    let (code, msg, details) = match e {
        Error::Plugin(p) => {
            let mut details = p
                .object
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            for n in &p.notes {
                if !details.is_empty() {
                    details.push_str("; ");
                }
                details.push_str(n);
            }
            let msg = p.object.get("msg").and_then(Value::as_str).unwrap_or("");
            (
                p.object.get("code").and_then(Value::as_u64).unwrap_or(999),
                format!(
                    "plugin {:?} ({} of {}) failed {}: {msg}",
                    p.plugin_type,
                    p.index + 1,
                    p.count,
                    p.command
                ),
                details,
            )
        }
        Error::Runtime(msg) => (7, msg.clone(), String::new()),
        Error::Io(msg) => (5, msg.clone(), String::new()),
        Error::Multiple(all) => {
            let first = all
                .first()
                .map(|f| error_object(f, version))
                .unwrap_or_default();
            let lines: Vec<String> = all.iter().map(Error::to_string).collect();
            (
                first.get("code").and_then(Value::as_u64).unwrap_or(999),
                format!("{} failures", all.len()),
                lines.join("\n"),
            )
        }
    };
    let mut obj = serde_json::json!({"cniVersion": version, "code": code, "msg": msg});
    if !details.is_empty() {
        obj["details"] = Value::String(details);
    }
    obj
}

fn verb_name(v: Verb) -> &'static str {
    match v {
        Verb::Add => "add",
        Verb::Check => "check",
        Verb::Del => "del",
        Verb::Gc => "gc",
        Verb::Status => "status",
    }
}

fn print_json(v: &Value) {
    match serde_json::to_string_pretty(v) {
        Ok(text) => println!("{text}"),
        Err(_) => println!("{v}"),
    }
}

fn flag_or_env(flag: Option<PathBuf>, var: &str, default: &str) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| PathBuf::from(default))
}

fn cni_path(args: &NetArgs) -> Vec<PathBuf> {
    let raw = args
        .cni_path
        .clone()
        .or_else(|| std::env::var_os("CNI_PATH").filter(|v| !v.is_empty()))
        .unwrap_or_else(|| OsString::from("/opt/cni/bin"));
    std::env::split_paths(&raw)
        .filter(|p| !p.as_os_str().is_empty())
        .collect()
}

/// The attachment parameters from flags and environment. CHECK and DEL must
/// use the same parameters as the ADD (spec), so what the caller leaves out
/// (netns for DEL, CNI_ARGS, capability args) comes from the cache entry.
fn attachment(args: &NetArgs, rt: &Runtime, list: &ConfList) -> Result<Attachment, Error> {
    let netns = args.netns.as_deref().map(netns_path);
    let container_id = match (&args.container_id, &netns) {
        (Some(id), _) => id.clone(),
        (None, Some(ns)) => container_id_for(ns),
        (None, None) => {
            return Err(Error::Runtime(
                "give the network namespace, or --container-id (del only)".into(),
            ))
        }
    };
    let cached = match args.command {
        Verb::Check | Verb::Del => rt
            .cache
            .load(&Key::new(&list.name, &container_id, &args.ifname))
            .ok()
            .flatten(),
        _ => None,
    };
    let netns = match (netns, &cached) {
        (Some(ns), _) => ns,
        (None, Some(entry)) if args.command == Verb::Del => entry.netns.clone(),
        (None, None) if args.command == Verb::Del => String::new(),
        (None, _) => {
            return Err(Error::Runtime(
                "this command needs the network namespace".into(),
            ))
        }
    };
    Ok(Attachment {
        container_id,
        netns,
        ifname: args.ifname.clone(),
        args: match cni_args(args)? {
            Some(given) => given,
            None => cached
                .as_ref()
                .map(|e| e.cni_args.clone())
                .unwrap_or_default(),
        },
        cap_args: match cap_args(args)? {
            Some(given) => given,
            None => cached.map(|e| e.capability_args).unwrap_or_default(),
        },
    })
}

/// A bare name means a namespace made by `ip netns add`.
fn netns_path(arg: &str) -> String {
    if arg.contains('/') {
        arg.to_string()
    } else {
        Path::new("/run/netns").join(arg).display().to_string()
    }
}

/// Stable across runs and machines (FNV-1a, not the std hasher, whose seed
/// is random), so a later `del` with the same netns finds the same entry.
pub fn container_id_for(netns: &str) -> String {
    let hash = netns.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("cnikit-{hash:016x}")
}

/// `None` when neither the flag nor CNI_ARGS is set.
fn cni_args(args: &NetArgs) -> Result<Option<Vec<(String, String)>>, Error> {
    let Some(raw) = args.args.clone().or_else(|| std::env::var("CNI_ARGS").ok()) else {
        return Ok(None);
    };
    raw.split(';')
        .filter(|s| !s.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(Error::Runtime(format!(
                "--args / CNI_ARGS: {kv:?} is not KEY=VALUE"
            ))),
        })
        .collect::<Result<Vec<_>, Error>>()
        .map(Some)
}

/// `None` when neither the flag nor CAP_ARGS is set.
fn cap_args(args: &NetArgs) -> Result<Option<Map<String, Value>>, Error> {
    let Some(raw) = args
        .cap_args
        .clone()
        .or_else(|| std::env::var("CAP_ARGS").ok())
    else {
        return Ok(None);
    };
    if raw.trim().is_empty() {
        return Ok(Some(Map::new()));
    }
    match serde_json::from_str(&raw) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(Error::Runtime(
            "--cap-args / CAP_ARGS must be a JSON object".into(),
        )),
        Err(e) => Err(Error::Runtime(format!(
            "--cap-args / CAP_ARGS is not valid JSON: {e}"
        ))),
    }
}
