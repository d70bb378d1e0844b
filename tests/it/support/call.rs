//! One plugin execution built like a runtime builds it ([`Call`]), and what
//! it produced ([`Outcome`]), checked against the protocol's invariants.

use super::process::{cnikit_exe, Netns};
use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long one plugin call may take before the harness kills it.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One plugin execution, built like a runtime builds it.
#[derive(Debug, Clone)]
pub struct Call {
    exe: PathBuf,
    args: Vec<String>,
    env: Vec<(String, std::ffi::OsString)>,
    stdin: Vec<u8>,
    reference: bool,
    /// Run through `ip netns exec NAME` (the plugin then sees that netns's ruleset).
    exec_in: Option<String>,
}

/// What a plugin call produced. Construction already checked the protocol
/// invariants: no signal, no panic, and on failure exactly one error object.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// stdout parsed, when it is JSON.
    pub json: Option<Value>,
}

/// A CNI error object.
#[derive(Debug, Clone)]
pub struct CniError {
    pub cni_version: String,
    pub code: u64,
    pub msg: String,
    pub details: String,
}

impl Call {
    pub fn new(exe: PathBuf) -> Call {
        Call {
            exe,
            args: Vec::new(),
            env: Vec::new(),
            stdin: Vec::new(),
            reference: false,
            exec_in: None,
        }
    }

    /// Run `cnikit ARGS…` (multicall by subcommand instead of by link name).
    pub fn cnikit(args: &[&str]) -> Call {
        let mut c = Call::new(cnikit_exe());
        c.args = args.iter().map(|s| s.to_string()).collect();
        c
    }

    pub(super) fn reference(mut self) -> Call {
        self.reference = true;
        self
    }

    /// Run the plugin inside netns `ns` (`ip netns exec`), not just point
    /// CNI_NETNS at it: it then works on that namespace's own ruleset.
    pub fn exec_in(mut self, ns: &Netns) -> Call {
        self.exec_in = Some(ns.name.clone());
        self
    }

    /// Set (or replace) an environment variable.
    pub fn env(self, k: &str, v: &str) -> Call {
        self.env_os(k, v.into())
    }

    /// Set a variable to arbitrary bytes (not necessarily UTF-8).
    pub fn env_os(mut self, k: &str, v: std::ffi::OsString) -> Call {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.to_string(), v));
        self
    }

    /// Remove an environment variable set earlier.
    pub fn unset(mut self, k: &str) -> Call {
        self.env.retain(|(key, _)| key != k);
        self
    }

    pub fn command(self, c: &str) -> Call {
        self.env("CNI_COMMAND", c)
    }
    pub fn container(self, id: &str) -> Call {
        self.env("CNI_CONTAINERID", id)
    }
    pub fn netns(self, ns: &Netns) -> Call {
        self.env("CNI_NETNS", &ns.path)
    }
    pub fn netns_path(self, p: &str) -> Call {
        self.env("CNI_NETNS", p)
    }
    pub fn ifname(self, i: &str) -> Call {
        self.env("CNI_IFNAME", i)
    }
    pub fn cni_args(self, a: &str) -> Call {
        self.env("CNI_ARGS", a)
    }

    /// The usual ADD/CHECK/DEL environment for one attachment.
    pub fn attach(self, command: &str, id: &str, ns: &Netns, ifname: &str) -> Call {
        self.command(command).container(id).netns(ns).ifname(ifname)
    }

    /// The attachment environment with a CNI_NETNS path that need not exist.
    pub fn attach_at(self, command: &str, id: &str, netns: &str) -> Call {
        self.command(command)
            .container(id)
            .netns_path(netns)
            .ifname("eth0")
    }

    pub fn conf(mut self, conf: &Value) -> Call {
        self.stdin = serde_json::to_vec(conf).expect("serialize config");
        self
    }

    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Call {
        self.stdin = bytes.into();
        self
    }

    /// Execute with a cleared environment (PATH kept), check the invariants.
    pub fn run(self) -> Outcome {
        let what = format!(
            "{} {} [{}]",
            self.exe.display(),
            self.args.join(" "),
            self.env
                .iter()
                .map(|(k, v)| format!("{k}={}", v.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut cmd = match &self.exec_in {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        cmd.args(&self.args)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child =
            spawn_when_not_busy(&mut cmd).unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        let mut stdin = child.stdin.take().expect("stdin");
        let input = self.stdin.clone();
        // The plugin may exit without reading everything (huge input): ignore EPIPE.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let reader_out = read_all(child.stdout.take().expect("stdout"));
        let reader_err = read_all(child.stderr.take().expect("stderr"));
        let status = wait_for(&mut child, CALL_TIMEOUT)
            .unwrap_or_else(|| panic!("{what} did not finish within {CALL_TIMEOUT:?}"));
        let _ = writer.join();
        let stdout = String::from_utf8_lossy(&reader_out.join().unwrap_or_default()).into_owned();
        let stderr = String::from_utf8_lossy(&reader_err.join().unwrap_or_default()).into_owned();
        let json = serde_json::from_str::<Value>(stdout.trim()).ok();
        let o = Outcome {
            what,
            status,
            stdout,
            stderr,
            json,
        };
        o.check_invariants(self.reference);
        o
    }
}

/// Wait up to `timeout` for `child` to exit; past it, kill and reap it: None.
pub fn wait_for(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait().expect("wait for a child process") {
            Some(status) => return Some(status),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Read a pipe to its end in a thread of its own.
fn read_all(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = pipe.read_to_end(&mut b);
        b
    })
}

impl Outcome {
    fn context(&self) -> String {
        format!(
            "{}\n  exit: {:?}\n  stdout: {}\n  stderr: {}",
            self.what,
            self.status,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }

    /// No signal, no panic; a failure prints exactly one error object.
    fn check_invariants(&self, reference: bool) {
        if let Some(sig) = self.status.signal() {
            panic!(
                "plugin was killed by signal {sig} (panic/abort?):\n{}",
                self.context()
            );
        }
        if !reference {
            assert!(
                !self.stderr.contains("panicked at") && self.status.code() != Some(101),
                "plugin panicked:\n{}",
                self.context()
            );
            assert!(
                !self.stdout.contains("internal error (bug in cnikit)"),
                "plugin reported an internal error (a bug):\n{}",
                self.context()
            );
        }
        if !self.status.success() {
            if let Err(why) = parse_error_object(&self.stdout, reference) {
                panic!(
                    "failure without a valid CNI error object on stdout ({why}):\n{}",
                    self.context()
                );
            }
        }
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Assert success and return self.
    pub fn ok(&self) -> &Outcome {
        assert!(
            self.status.success(),
            "plugin call failed:\n{}",
            self.context()
        );
        self
    }

    /// Assert success with an empty stdout (DEL, CHECK).
    pub fn ok_silent(&self) -> &Outcome {
        self.ok();
        assert!(
            self.stdout.trim().is_empty(),
            "expected no output:\n{}",
            self.context()
        );
        self
    }

    /// Assert success and return the printed result.
    pub fn result(&self) -> Value {
        self.ok();
        self.json
            .clone()
            .unwrap_or_else(|| panic!("plugin printed no JSON result:\n{}", self.context()))
    }

    /// Assert failure and return the error object.
    pub fn err(&self) -> CniError {
        assert!(
            !self.status.success(),
            "plugin call unexpectedly succeeded:\n{}",
            self.context()
        );
        assert_eq!(
            self.status.code(),
            Some(1),
            "error exit code should be 1:\n{}",
            self.context()
        );
        parse_error_object(&self.stdout, false).expect("checked in run()")
    }

    /// Assert failure with `code` and a message containing every needle.
    pub fn expect_err(&self, code: u64, needles: &[&str]) -> CniError {
        let e = self.err();
        assert_eq!(e.code, code, "wrong error code:\n{}", self.context());
        for n in needles {
            assert!(
                e.msg.contains(n) || e.details.contains(n),
                "error message should mention {n:?}:\n{}",
                self.context()
            );
        }
        e
    }
}

/// stdout must be exactly one JSON object {cniVersion, code, msg[, details]}.
pub fn parse_error_object(stdout: &str, lenient: bool) -> Result<CniError, String> {
    let mut stream = serde_json::Deserializer::from_str(stdout).into_iter::<Value>();
    let first = match stream.next() {
        None => return Err("stdout is empty".into()),
        Some(Err(e)) => return Err(format!("stdout is not JSON: {e}")),
        Some(Ok(v)) => v,
    };
    if stream.next().is_some() {
        return Err("stdout holds more than one JSON value".into());
    }
    let obj = first.as_object().ok_or("the error is not a JSON object")?;
    let code = obj
        .get("code")
        .and_then(Value::as_u64)
        .ok_or("no unsigned integer `code`")?;
    let msg = obj
        .get("msg")
        .and_then(Value::as_str)
        .ok_or("no string `msg`")?;
    let cni_version = match obj.get("cniVersion").and_then(Value::as_str) {
        Some(v) => v.to_string(),
        None if lenient => String::new(),
        None => return Err("no string `cniVersion`".into()),
    };
    let details = match obj.get("details") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("`details` is not a string: {other}")),
    };
    if !lenient {
        if let Some(k) = obj
            .keys()
            .find(|k| !["cniVersion", "code", "msg", "details"].contains(&k.as_str()))
        {
            return Err(format!("unexpected key {k:?} in the error object"));
        }
        if msg.trim().is_empty() {
            return Err("empty `msg`".into());
        }
    }
    Ok(CniError {
        cni_version,
        code,
        msg: msg.to_string(),
        details,
    })
}

/// Spawns `cmd`, retrying (bounded) while its program is "text file busy": a
/// test that has just written a script or a copy of the binary can find
/// another test thread's fork still holding the write descriptor until that
/// child's exec closes it.
fn spawn_when_not_busy(cmd: &mut Command) -> std::io::Result<Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}
