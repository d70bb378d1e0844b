//! Runs one plugin call: read stdin and the environment, check the version
//! allows the verb, call the plugin, print the result or the error object.

use super::args::CniArgs;
use super::call_report::CallFacts;
use super::config::NetConf;
use super::env::{Command, Env};
use super::error::{Code, Error};
use super::log_file::CallLog;
use super::result::CniResult;
use super::version::Version;
use std::fmt;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

/// The plugins built into this binary, as the process running the call made
/// them.
pub trait Builtins: Send + Sync {
    /// The plugin of type `name`, if it is one of them.
    fn by_name(&self, name: &str) -> Option<&dyn Plugin>;
}

/// What a plugin call gets besides its input: where delegates are found and
/// where the daemon listens.
#[derive(Clone)]
pub struct Context {
    /// Built-in plugins by type name, run in-process when CNI_PATH resolves
    /// a delegate to this very binary.
    pub builtins: Arc<dyn Builtins>,
    /// The ipamd daemon's socket when the configuration names none.
    pub daemon_socket: PathBuf,
}

impl Context {
    pub fn new(builtins: Arc<dyn Builtins>) -> Context {
        Context {
            builtins,
            daemon_socket: ipamd::config::DEFAULT_SOCKET.into(),
        }
    }

    /// A context where no delegate runs in-process (unit tests).
    #[cfg(test)]
    pub fn without_builtins() -> Context {
        struct NoBuiltins;
        impl Builtins for NoBuiltins {
            fn by_name(&self, _: &str) -> Option<&dyn Plugin> {
                None
            }
        }
        Context::new(Arc::new(NoBuiltins))
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("daemon_socket", &self.daemon_socket)
            .finish_non_exhaustive()
    }
}

/// One plugin call, validated.
#[derive(Debug, Clone)]
pub struct Request {
    pub env: Env,
    pub conf: NetConf,
    pub args: CniArgs,
    pub ctx: Context,
}

impl Request {
    /// This call's attachment: the configuration's network name,
    /// CNI_CONTAINERID and CNI_IFNAME.
    pub fn attachment(&self) -> super::Attachment {
        super::Attachment::new(&self.conf.name, self.container_id(), self.ifname())
    }
    pub fn container_id(&self) -> &str {
        &self.env.container_id
    }
    pub fn ifname(&self) -> &str {
        &self.env.ifname
    }
    pub fn netns(&self) -> &str {
        &self.env.netns
    }
    /// The plugin's configuration as `load` reads it; on DEL, a configuration
    /// `load` refuses is reported on stderr and `fallback` used instead, so
    /// that DEL still removes what the attachment may have (see
    /// [`NetConf::parse_for_del`]).
    pub fn conf_or_del_fallback<T>(
        &self,
        load: impl FnOnce(&Request) -> Result<T, Error>,
        fallback: impl FnOnce(&Request) -> T,
    ) -> Result<T, Error> {
        match load(self) {
            Err(e) if self.env.command == Command::Del => {
                eprintln!(
                    "DEL: ignoring a configuration that cannot be used ({}); removing whatever this attachment may have",
                    e.msg
                );
                Ok(fallback(self))
            }
            other => other,
        }
    }

    /// The same request for another verb (delegation, cleanup after a failed ADD).
    pub fn with_command(&self, command: Command) -> Request {
        let mut r = self.clone();
        r.env.command = command;
        r
    }

    /// The request built-in `plugin` gets for `command` when run in-process as
    /// a delegate: `CNI_ARGS` read by its rules, as its own process would read
    /// them (ipvlan takes any key, its host-local does not).
    pub fn for_delegate(&self, plugin: &dyn Plugin, command: Command) -> Result<Request, Error> {
        let mut r = self.with_command(command);
        r.args = CniArgs::for_call(&self.env.args, plugin.reads_cni_args(), command)?;
        Ok(r)
    }
}

/// A CNI plugin: each file under `plugins/` implements these five verbs.
pub trait Plugin: Sync {
    fn add(&self, req: &Request) -> Result<CniResult, Error>;
    fn check(&self, req: &Request) -> Result<(), Error>;
    fn del(&self, req: &Request) -> Result<(), Error>;
    fn status(&self, req: &Request) -> Result<(), Error>;
    fn gc(&self, req: &Request) -> Result<(), Error>;

    /// Whether the plugin holds `CNI_ARGS` to the keys it knows on ADD and CHECK
    /// (unless `IgnoreUnknown`), as the reference plugins that decode them do
    /// (bridge, macvlan, tuning, host-local, static). Those that never read them
    /// (loopback, ipvlan, dummy, portmap, firewall, bandwidth) take anything, since
    /// runtimes send them `K8S_POD_NAME=…` without `IgnoreUnknown`.
    fn reads_cni_args(&self) -> bool {
        false
    }

    /// The method `req`'s command names, with ADD's result; for the runner, delegation
    /// and tests alike. VERSION needs no plugin: the runner answers it, and here it is
    /// None.
    fn call(&self, req: &Request) -> Result<Option<CniResult>, Error> {
        match req.env.command {
            Command::Add => self.add(req).map(Some),
            Command::Check => self.check(req).map(|()| None),
            Command::Del => self.del(req).map(|()| None),
            Command::Status => self.status(req).map(|()| None),
            Command::Gc => self.gc(req).map(|()| None),
            Command::Version => Ok(None),
        }
    }
}

/// Entry point for a plugin process (`name` is the plugin's name, for the
/// log); returns the exit code. `after_reply` runs once the reply is written
/// and flushed and the log finished: the caller's work that must not keep
/// the runtime waiting for the reply. Then the call's report goes to the ipamd daemon
/// (`call_report.rs`), which never waits either.
pub fn main(name: &str, plugin: &dyn Plugin, ctx: Context, after_reply: impl FnOnce()) -> i32 {
    let started = std::time::Instant::now();
    install_panic_hook(None);
    let stdin = read_stdin();
    // Known only once stdin is read; nothing is written to stderr before.
    let log = stdin
        .as_ref()
        .ok()
        .and_then(|bytes| CallLog::start(name, bytes));
    if log.is_some() {
        install_panic_hook(log.clone());
    }
    let (outcome, version, facts) = run(plugin, ctx, stdin);
    let mut stdout = std::io::stdout().lock();
    let (code, failure) = match outcome {
        Ok(Some(text)) => {
            let _ = writeln!(stdout, "{text}");
            (0, None)
        }
        Ok(None) => (0, None),
        Err(e) => {
            eprintln!("{e}");
            let _ = writeln!(stdout, "{}", e.to_json(version.as_str()));
            (1, Some(e))
        }
    };
    let _ = stdout.flush();
    if let Some(log) = log {
        log.finish(failure.as_ref().map_or(Ok(()), Err));
    }
    after_reply();
    let cni_code = failure.as_ref().map_or(0, |e| e.code);
    facts.send(name, cni_code, started.elapsed());
    code
}

/// Returns what to print, the version to label an error with, and what the call's
/// report says of it.
fn run(
    plugin: &dyn Plugin,
    ctx: Context,
    stdin: Result<Vec<u8>, Error>,
) -> (Result<Option<String>, Error>, Version, CallFacts) {
    let no_conf = CallFacts::without_conf(&ctx.daemon_socket);
    // The command decides how strict we are with stdin, so peek at it first.
    let command = std::env::var("CNI_COMMAND").ok();
    if command.as_deref() == Some("VERSION") {
        return (
            Ok(Some(version_answer(&stdin.unwrap_or_default()))),
            Version::LATEST,
            no_conf,
        );
    }
    let bytes = match stdin {
        Ok(b) => b,
        Err(e) => return (Err(e), Version::LATEST, no_conf),
    };
    // An error about the configuration is still labelled with the version it
    // declares, when it declares one cnikit knows.
    let declared = declared_version(&bytes);
    let parsed = if command.as_deref() == Some("DEL") {
        NetConf::parse_for_del(bytes)
    } else {
        NetConf::parse(bytes)
    };
    let conf = match parsed {
        Ok(c) => c,
        Err(e) => return (Err(e), declared.unwrap_or(Version::LATEST), no_conf),
    };
    let version = conf.version;
    let facts = CallFacts::of(&conf, &ctx.daemon_socket);
    (dispatch(plugin, conf, ctx), version, facts)
}

fn dispatch(plugin: &dyn Plugin, conf: NetConf, ctx: Context) -> Result<Option<String>, Error> {
    let env = Env::from_process()?;
    require_version(env.command, conf.version)?;
    let strict = plugin.reads_cni_args();
    let args = CniArgs::for_call(&env.args, strict, env.command)?;
    if env.command == Command::Del && strict {
        if let Err(e) = CniArgs::parse(&env.args) {
            eprintln!("DEL: {}; using the well-formed CNI_ARGS only", e.msg);
        }
    }
    let version = conf.version;
    let req = Request {
        env,
        conf,
        args,
        ctx,
    };
    match req.env.command {
        Command::Version => Ok(Some(version_answer(&req.conf.bytes))),
        _ => Ok(plugin
            .call(&req)?
            .map(|result| result.to_value(version).to_string())),
    }
}

/// CHECK exists from 0.4.0, STATUS and GC from 1.1.0 (error 1 below that).
fn require_version(command: Command, version: Version) -> Result<(), Error> {
    let minimum = match command {
        Command::Check => Version::V040,
        Command::Status | Command::Gc => Version::V110,
        _ => return Ok(()),
    };
    if version < minimum {
        return Err(Error::new(
            Code::IncompatibleVersion,
            format!(
                "{} needs cniVersion {minimum} or later, the configuration says {version}",
                command.as_str()
            ),
        ));
    }
    Ok(())
}

/// VERSION is answered even for an empty or unreadable stdin: runtimes probe
/// plugins with it, and the answer does not depend on the config.
fn version_answer(stdin: &[u8]) -> String {
    let asked = declared_version(stdin).unwrap_or(Version::LATEST);
    serde_json::json!({
        "cniVersion": asked.as_str(),
        "supportedVersions": Version::ALL.map(Version::as_str),
    })
    .to_string()
}

/// The `cniVersion` a configuration declares (its key matched as Go does;
/// none means 0.2.0), read without decoding the rest, so that even a
/// configuration that is otherwise wrong gets its errors in its own version.
fn declared_version(stdin: &[u8]) -> Option<Version> {
    let value: serde_json::Value = serde_json::from_slice(stdin).ok()?;
    let object = value.as_object()?;
    let field = object.get("cniVersion").or_else(|| {
        object
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("cniVersion"))
            .map(|(_, v)| v)
    });
    match field {
        None => Some(Version::DEFAULT),
        Some(v) => Version::parse(v.as_str()?),
    }
}

/// Configs are small; a runtime sending more than this is broken or hostile.
const MAX_STDIN: u64 = 16 << 20;

fn read_stdin() -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_STDIN + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            Error::new(
                Code::Io,
                format!("cannot read the configuration from stdin: {e}"),
            )
        })?;
    if bytes.len() as u64 > MAX_STDIN {
        return Err(Error::new(
            Code::Io,
            format!("configuration on stdin is larger than {MAX_STDIN} bytes"),
        ));
    }
    Ok(bytes)
}

/// A panic is a bug, but the runtime must still get an error object rather
/// than an empty stdout (release builds abort right after the hook), and the
/// call's log its line: the hook ends the log itself, as nothing runs after.
fn install_panic_hook(log: Option<CallLog>) {
    std::panic::set_hook(Box::new(move |info| {
        let err = Error::new(
            Code::Internal,
            format!("internal error (bug in cnikit): {info}"),
        );
        eprintln!("{err}");
        println!("{}", err.to_json(Version::LATEST.as_str()));
        if let Some(log) = &log {
            log.finish(Err(&err));
        }
    }));
}

/// A request as the runner builds it, for unit tests: the container `c1` on `eth0` in
/// netns `/run/netns/x`, `conf` on stdin, `cni_args` in `CNI_ARGS` (read leniently).
#[cfg(test)]
impl Request {
    pub fn for_test(command: Command, conf: &str, cni_args: &str) -> Request {
        Request {
            env: Env {
                command,
                container_id: "c1".into(),
                netns: "/run/netns/x".into(),
                ifname: "eth0".into(),
                args: cni_args.into(),
                path: Vec::new(),
            },
            conf: NetConf::parse(conf.as_bytes().to_vec()).expect("test config"),
            args: CniArgs::for_call(cni_args, false, command).expect("lenient CNI_ARGS"),
            ctx: Context::without_builtins(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin that does nothing, strict about `CNI_ARGS` or not.
    struct Stub(bool);

    impl Plugin for Stub {
        fn add(&self, _: &Request) -> Result<CniResult, Error> {
            Ok(CniResult::default())
        }
        fn check(&self, _: &Request) -> Result<(), Error> {
            Ok(())
        }
        fn del(&self, _: &Request) -> Result<(), Error> {
            Ok(())
        }
        fn status(&self, _: &Request) -> Result<(), Error> {
            Ok(())
        }
        fn gc(&self, _: &Request) -> Result<(), Error> {
            Ok(())
        }
        fn reads_cni_args(&self) -> bool {
            self.0
        }
    }

    const STRICT: Stub = Stub(true);
    const LENIENT: Stub = Stub(false);

    /// A request as a plugin that reads no `CNI_ARGS` (ipvlan, say) got it.
    fn request(command: Command, cni_args: &str) -> Request {
        Request::for_test(command, r#"{"cniVersion":"1.0.0","name":"n"}"#, cni_args)
    }

    #[test]
    fn an_in_process_delegate_reads_cni_args_by_its_own_rules() {
        let k8s = "K8S_POD_NAME=x;IP=10.0.0.5";
        // ipvlan takes them; its IPAM (strict), in-process as in its own process, does not.
        let e = request(Command::Add, k8s)
            .for_delegate(&STRICT, Command::Add)
            .unwrap_err();
        assert_eq!(e.code, 4);
        for delegate in [&LENIENT, &STRICT] {
            let del = request(Command::Add, k8s)
                .for_delegate(delegate, Command::Del)
                .unwrap();
            assert_eq!(del.env.command, Command::Del);
            assert_eq!(del.args.get("IP"), Some("10.0.0.5"));
        }
        let ok = request(Command::Add, "IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.0.0.5")
            .for_delegate(&STRICT, Command::Add)
            .unwrap();
        assert_eq!(ok.args.get("IP"), Some("10.0.0.5"));
    }
}
