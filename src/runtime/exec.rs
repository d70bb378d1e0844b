//! Executing one plugin the way libcni's invoke package does: looked up in
//! CNI_PATH, our environment plus the CNI_* variables, the request on stdin,
//! the result or the error object on stdout.

use serde_json::{json, Value};
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The CNI_* variables of one call.
#[derive(Debug, Clone, Copy)]
pub struct CallEnv<'a> {
    pub command: &'a str,
    pub container_id: &'a str,
    pub netns: &'a str,
    pub ifname: &'a str,
    /// Already joined as `K=V;K=V`.
    pub args: &'a str,
    pub path: &'a OsStr,
}

/// Why a call failed, already shaped as a CNI error object (the plugin's own
/// when it printed one).
#[derive(Debug, Clone)]
pub struct Failure {
    pub object: Value,
}

impl Failure {
    fn new(code: u32, msg: String, details: String) -> Failure {
        let mut object = json!({"code": code, "msg": msg});
        if !details.is_empty() {
            object["details"] = Value::String(details);
        }
        Failure { object }
    }
}

/// Spec: "Look up the executable specified in the type field. If this does
/// not exist, then this is an error."
pub fn find(plugin_type: &str, cni_path: &[PathBuf]) -> Result<PathBuf, String> {
    cni_path
        .iter()
        .map(|dir| dir.join(plugin_type))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            let dirs: Vec<String> = cni_path.iter().map(|d| d.display().to_string()).collect();
            format!(
                "failed to find plugin {plugin_type:?} in path [{}]",
                dirs.join(" ")
            )
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Run `path` and return its stdout on success.
pub fn run(
    path: &Path,
    env: &CallEnv,
    stdin: &[u8],
    forward_stderr: bool,
) -> Result<Vec<u8>, Failure> {
    let output = spawn_with_retry(path, env, stdin).map_err(|e| {
        Failure::new(
            999,
            format!("cannot execute {}: {e}", path.display()),
            String::new(),
        )
    })?;
    if forward_stderr && !output.stderr.is_empty() {
        let _ = std::io::stderr().write_all(&output.stderr);
    }
    if output.status.success() {
        return Ok(output.stdout);
    }
    Err(plugin_error(&output))
}

/// libcni retries "text file busy": a plugin binary being replaced (an
/// upgrade in progress) is not a reason to fail a pod.
fn spawn_with_retry(path: &Path, env: &CallEnv, stdin: &[u8]) -> std::io::Result<Output> {
    let mut attempt = 0;
    loop {
        match spawn(path, env, stdin) {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 5 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

fn spawn(path: &Path, env: &CallEnv, stdin: &[u8]) -> std::io::Result<Output> {
    let mut child = Command::new(path)
        .env("CNI_COMMAND", env.command)
        .env("CNI_CONTAINERID", env.container_id)
        .env("CNI_NETNS", env.netns)
        .env("CNI_IFNAME", env.ifname)
        .env("CNI_ARGS", env.args)
        .env("CNI_PATH", env.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    write_stdin(&mut child, stdin);
    child.wait_with_output()
}

/// A pipe holds 64 KiB, so a usual config is written before the plugin even
/// reads it; only a bigger one needs a writer thread (otherwise a plugin that
/// prints before reading everything could deadlock with us).
fn write_stdin(child: &mut std::process::Child, stdin: &[u8]) {
    let Some(mut pipe) = child.stdin.take() else {
        return;
    };
    if stdin.len() <= 60 * 1024 {
        // A plugin that exits without reading is judged by its output.
        let _ = pipe.write_all(stdin);
        return;
    }
    let bytes = stdin.to_vec();
    std::thread::spawn(move || {
        let _ = pipe.write_all(&bytes);
    });
}

/// The plugin's error object when it printed one; otherwise one that says
/// what it did print (libcni's `pluginErr`).
fn plugin_error(output: &Output) -> Failure {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    match serde_json::from_str::<Value>(stdout.trim()) {
        Ok(v)
            if v.get("code")
                .and_then(Value::as_u64)
                .is_some_and(|c| c != 0) =>
        {
            Failure { object: v }
        }
        _ if stdout.trim().is_empty() => Failure::new(
            999,
            format!("plugin failed ({}) without an error object", output.status),
            stderr.trim().to_string(),
        ),
        _ => Failure::new(
            999,
            format!(
                "plugin failed ({}) and printed no valid error object",
                output.status
            ),
            format!("stdout: {} stderr: {}", stdout.trim(), stderr.trim()),
        ),
    }
}
