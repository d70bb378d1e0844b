//! Delegation: run another plugin (IPAM) with our environment and our stdin.
//! When the delegate is this very binary, it runs in-process instead: same
//! code path, one exec fewer on every pod (≈0.6 ms).

use super::env::Command;
use super::error::{Code, Error};
use super::result::CniResult;
use super::runner::{Plugin, Request};
use serde::Deserialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Run the IPAM plugin named in the config for `command`; ADD returns its result.
pub fn ipam(req: &Request, command: Command) -> Result<Option<CniResult>, Error> {
    let Some(ipam_type) = req.conf.ipam_type.clone() else {
        return Err(Error::invalid_config(
            "this plugin needs an \"ipam\" section with a type",
        ));
    };
    delegate(req, &ipam_type, command)
        .map_err(|e| e.context(format_args!("IPAM plugin {ipam_type}")))
}

/// Run plugin `plugin_type` for `command` with the caller's environment and stdin.
pub fn delegate(
    req: &Request,
    plugin_type: &str,
    command: Command,
) -> Result<Option<CniResult>, Error> {
    let path = find_plugin(plugin_type, &req.env.path)?;
    if let Some(builtin) = builtin_for(req, plugin_type, &path) {
        return builtin.call(&req.for_delegate(builtin, command)?);
    }
    exec(&path, req, command)
}

/// In-process only when CNI_PATH resolves to this executable, so a user who
/// points `ipamd` at another binary gets that binary.
fn builtin_for<'r>(req: &'r Request, plugin_type: &str, path: &Path) -> Option<&'r dyn Plugin> {
    let plugin = req.ctx.builtins.by_name(plugin_type)?;
    let me = std::env::current_exe().ok()?.canonicalize().ok()?;
    (path.canonicalize().ok()? == me).then_some(plugin)
}

/// Search CNI_PATH for an executable named `plugin_type`.
pub fn find_plugin(plugin_type: &str, cni_path: &[PathBuf]) -> Result<PathBuf, Error> {
    if plugin_type.is_empty()
        || plugin_type == "."
        || plugin_type == ".."
        || plugin_type.contains('/')
    {
        return Err(Error::invalid_config(format!(
            "plugin type {plugin_type:?} is not a valid executable name"
        )));
    }
    if cni_path.is_empty() {
        return Err(Error::new(
            Code::InvalidEnv,
            format!("CNI_PATH is empty, cannot find plugin {plugin_type:?}"),
        ));
    }
    cni_path
        .iter()
        .map(|dir| dir.join(plugin_type))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::new(
                Code::Delegate,
                format!(
                    "failed to find plugin {plugin_type:?} in CNI_PATH {}",
                    std::env::join_paths(cni_path)
                        .map(|p| p.to_string_lossy().into_owned())
                        .unwrap_or_default()
                ),
            )
        })
}

fn exec(path: &Path, req: &Request, command: Command) -> Result<Option<CniResult>, Error> {
    let spawn_err = |e: std::io::Error| {
        Error::new(
            Code::Delegate,
            format!("cannot run {}: {e}", path.display()),
        )
    };
    let mut child = std::process::Command::new(path)
        .env("CNI_COMMAND", command.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(spawn_err)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A delegate that exits without reading stdin is judged by its output.
        let _ = stdin.write_all(&req.conf.bytes);
    }
    let output = child.wait_with_output().map_err(spawn_err)?;
    if !output.status.success() {
        return Err(delegate_error(&output.stdout, output.status));
    }
    if command != Command::Add {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| {
        Error::new(
            Code::Delegate,
            format!("{} printed a result that is not JSON: {e}", path.display()),
        )
    })?;
    CniResult::from_value(&value).map(Some)
}

#[derive(Deserialize)]
struct WireError {
    code: u32,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

/// Pass the delegate's own error object through; invent one if it printed none.
fn delegate_error(stdout: &[u8], status: std::process::ExitStatus) -> Error {
    match serde_json::from_slice::<WireError>(stdout) {
        Ok(w) => Error::raw(w.code, w.msg, w.details),
        Err(_) => Error::new(
            Code::Delegate,
            format!("failed ({status}) without printing a CNI error object"),
        ),
    }
}
