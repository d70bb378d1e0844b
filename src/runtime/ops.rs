//! ADD, CHECK, DEL, GC and STATUS of a whole list (spec section 3, with
//! libcni's choices where the spec leaves room).

use super::cache::{Cache, Entry};
use super::conf::ConfList;
use super::derive::{request_config, Inject};
use super::exec::{self, CallEnv};
use super::{Error, PluginFailure};
use crate::cni::env::{validate_container_id, validate_ifname};
use crate::cni::{Attachment as Key, CniResult, Version};
use serde_json::{json, Map, Value};
use std::ffi::OsString;
use std::path::PathBuf;

/// How plugins are found and results kept.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub cni_path: Vec<PathBuf>,
    pub cache: Cache,
    /// Copy plugins' stderr to ours (the CLI) or drop it (the benchmark).
    pub forward_stderr: bool,
    /// Decode every plugin's result in its own version, refusing garbage (the
    /// CLI); the benchmark passes results on as plugins print them.
    pub check_results: bool,
    /// CNI_PATH as plugins get it, joined once.
    path_env: OsString,
}

/// The per-attachment parameters (spec "Attachment Parameters"): the
/// attachment's [`key`](Attachment::key) without its network, which is the
/// list's, and what the runtime passes on to plugins.
#[derive(Debug, Clone, Default)]
pub struct Attachment {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// Generic arguments, passed as CNI_ARGS `K=V;K=V`.
    pub args: Vec<(String, String)>,
    /// Capability arguments, offered to plugins through `runtimeConfig`.
    pub cap_args: Map<String, Value>,
}

/// What the runtime chose to do besides calling plugins (skips, removals),
/// for the caller to tell the user.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub notes: Vec<String>,
}

/// A GC request to forget an attachment whose container is gone: its
/// container ID and, optionally, only one of its interfaces.
#[derive(Debug, Clone)]
pub struct Gone {
    pub container_id: String,
    pub ifname: Option<String>,
}

impl Attachment {
    /// The key of this attachment to `network` (the result cache's, the plugins').
    pub fn key(&self, network: &str) -> Key {
        Key::new(network, &self.container_id, &self.ifname)
    }

    fn validate(&self, needs_netns: bool) -> Result<(), Error> {
        validate_container_id(&self.container_id)
            .map_err(|why| invalid(format!("container ID {:?} {why}", self.container_id)))?;
        validate_ifname(&self.ifname)
            .map_err(|why| invalid(format!("interface name {:?} {why}", self.ifname)))?;
        if needs_netns && self.netns.is_empty() {
            return Err(invalid("a network namespace is required".into()));
        }
        Ok(())
    }

    fn args_env(&self) -> String {
        let pairs: Vec<String> = self.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.join(";")
    }

    fn from_cache(e: &Entry) -> Attachment {
        Attachment {
            container_id: e.container_id.clone(),
            netns: e.netns.clone(),
            ifname: e.if_name.clone(),
            args: e.cni_args.clone(),
            cap_args: e.capability_args.clone(),
        }
    }
}

fn invalid(msg: String) -> Error {
    Error::Runtime(msg)
}

impl Runtime {
    pub fn new(cni_path: Vec<PathBuf>, cache_dir: PathBuf) -> Runtime {
        let path_env = std::env::join_paths(&cni_path).unwrap_or_default();
        Runtime {
            cni_path,
            cache: Cache { dir: cache_dir },
            forward_stderr: true,
            check_results: false,
            path_env,
        }
    }

    // ------------------------------------------------------------ ADD

    /// Run ADD through the list and cache the final result. When a plugin
    /// fails midway, DEL runs for the whole list (spec: "a delete must still
    /// be executed even if the add fails"), so nothing half-built remains.
    pub fn add(&self, list: &ConfList, att: &Attachment) -> Result<Value, Error> {
        att.validate(true)?;
        match self
            .add_chain(list, att)
            .and_then(|r| self.save(list, att, r))
        {
            Ok(result) => Ok(result),
            Err(e) => Err(self.roll_back(list, att, e)),
        }
    }

    fn add_chain(&self, list: &ConfList, att: &Attachment) -> Result<Value, Error> {
        let mut prev: Option<Value> = None;
        for i in 0..list.plugins.len() {
            let inject = inject(list, Some(att), prev.as_ref());
            let stdout = self.call(list, i, "ADD", Some(att), &inject)?;
            prev = Some(self.parse_result(list, i, &stdout)?);
        }
        prev.ok_or_else(|| Error::Runtime(format!("network {:?} has no plugins", list.name)))
    }

    fn save(&self, list: &ConfList, att: &Attachment, result: Value) -> Result<Value, Error> {
        let mut entry = Entry::new(&att.key(&list.name));
        entry.config = list.bytes.clone();
        entry.netns = att.netns.clone();
        entry.cni_args = att.args.clone();
        entry.capability_args = att.cap_args.clone();
        entry.result = Some(result);
        self.cache.save(&entry).map_err(|e| {
            Error::Io(format!(
                "failed to cache the result of network {:?}: {e}",
                list.name
            ))
        })?;
        Ok(entry.result.unwrap_or_default())
    }

    fn roll_back(&self, list: &ConfList, att: &Attachment, err: Error) -> Error {
        let cleanup = self.del_chain(list, att, None);
        let _ = self.cache.remove(&att.key(&list.name));
        match cleanup {
            Ok(()) => err.with_note("the whole list was deleted again (DEL)".into()),
            Err(e) => err.with_note(format!("the cleanup DEL failed too: {e}")),
        }
    }

    /// A result must be a JSON object; one without `cniVersion` is read as the
    /// list's version (libcni does the same for old plugins).
    fn parse_result(&self, list: &ConfList, i: usize, stdout: &[u8]) -> Result<Value, Error> {
        let mut value = match serde_json::from_slice::<Value>(stdout) {
            Ok(Value::Object(map)) => Value::Object(map),
            Ok(_) | Err(_) => return Err(self.bad_result(list, i, "not a JSON object", stdout)),
        };
        if value
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            value["cniVersion"] = Value::String(list.version.clone());
        }
        if self.check_results {
            let own = value["cniVersion"].as_str().unwrap_or("").to_string();
            convert(&value, &own).map_err(|why| self.bad_result(list, i, &why, stdout))?;
        }
        Ok(value)
    }

    fn bad_result(&self, list: &ConfList, i: usize, why: &str, stdout: &[u8]) -> Error {
        failure(
            list,
            i,
            "ADD",
            json!({
                "code": 999,
                "msg": format!("the plugin printed an invalid result: {why}"),
                "details": String::from_utf8_lossy(stdout).trim(),
            }),
        )
    }

    // ------------------------------------------------------------ DEL

    /// DEL in reverse order with the cached ADD result as `prevResult` (from
    /// 0.4.0 on), then forget the cache entry. A missing or unreadable entry
    /// is not an error: DEL must work after a failed ADD or a lost cache.
    pub fn del(&self, list: &ConfList, att: &Attachment) -> Result<(), Error> {
        att.validate(false)?;
        let prev = if list.ver() >= Version::V040 {
            self.cached_result(list, att).unwrap_or(None)
        } else {
            None
        };
        self.del_chain(list, att, prev.as_ref())?;
        self.cache.remove(&att.key(&list.name)).map_err(Error::Io)
    }

    fn del_chain(
        &self,
        list: &ConfList,
        att: &Attachment,
        prev: Option<&Value>,
    ) -> Result<(), Error> {
        for i in (0..list.plugins.len()).rev() {
            let inject = inject(list, Some(att), prev);
            self.call(list, i, "DEL", Some(att), &inject)?;
        }
        Ok(())
    }

    /// The cached result in the list's version (libcni converts too: the list
    /// may have been upgraded while the container ran).
    fn cached_result(&self, list: &ConfList, att: &Attachment) -> Result<Option<Value>, Error> {
        let entry = self.cache.load(&att.key(&list.name)).map_err(Error::Io)?;
        let Some(result) = entry.and_then(|e| e.result) else {
            return Ok(None);
        };
        let cached = result
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if cached == list.version || list.version.is_empty() {
            return Ok(Some(result));
        }
        convert(&result, &list.version)
            .map(Some)
            .map_err(|e| Error::Runtime(format!("cached result: {e}")))
    }

    // ------------------------------------------------------------ CHECK

    /// CHECK every plugin in order against the cached ADD result.
    pub fn check(&self, list: &ConfList, att: &Attachment) -> Result<Outcome, Error> {
        att.validate(true)?;
        if list.ver() < Version::V040 {
            return Err(Error::Runtime(format!(
                "network {:?} is at cniVersion {:?}; CHECK needs 0.4.0 or later",
                list.name, list.version
            )));
        }
        if list.disable_check {
            return Ok(note("disableCheck is set: CHECK skipped"));
        }
        let prev = self.cached_result(list, att)?.ok_or_else(|| {
            Error::Runtime(format!(
                "no cached result for network {:?}, container {:?}, interface {:?} in {}: was it added?",
                list.name,
                att.container_id,
                att.ifname,
                self.cache.dir.display()
            ))
        })?;
        for i in 0..list.plugins.len() {
            let inject = inject(list, Some(att), Some(&prev));
            self.call(list, i, "CHECK", Some(att), &inject)?;
        }
        Ok(Outcome::default())
    }

    // ------------------------------------------------------------ STATUS

    /// STATUS every plugin (spec 1.1); the first that is not ready answers.
    pub fn status(&self, list: &ConfList) -> Result<Outcome, Error> {
        if list.ver() < Version::V110 {
            return Ok(note(&format!(
                "network {:?} is at cniVersion {:?}; STATUS needs 1.1.0: nothing asked",
                list.name, list.version
            )));
        }
        for i in 0..list.plugins.len() {
            let inject = inject(list, None, None);
            self.call(list, i, "STATUS", None, &inject)?;
        }
        Ok(Outcome::default())
    }

    // ------------------------------------------------------------ GC

    /// Forget the attachments the caller says are gone (DEL them, like libcni
    /// does with stale cache entries), then GC every plugin with the cached
    /// attachments that remain as `cni.dev/valid-attachments`. Goes on past
    /// failures and reports them all.
    pub fn gc(&self, list: &ConfList, gone: &[Gone]) -> Result<Outcome, Error> {
        if list.disable_gc {
            return Ok(note("disableGC is set: GC skipped"));
        }
        let mut errors = Vec::new();
        let mut out = self.forget_gone(list, gone, &mut errors)?;
        if list.ver() < Version::V110 {
            out.notes.push(format!(
                "network {:?} is at cniVersion {:?}; plugin GC needs 1.1.0: not called",
                list.name, list.version
            ));
        } else {
            let valid = self.valid_attachments(list)?;
            for i in 0..list.plugins.len() {
                let mut inject = inject(list, None, None);
                inject.valid_attachments = Some(&valid);
                if let Err(e) = self.call(list, i, "GC", None, &inject) {
                    errors.push(e);
                }
            }
        }
        match errors.len() {
            0 => Ok(out),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
        }
    }

    fn forget_gone(
        &self,
        list: &ConfList,
        gone: &[Gone],
        errors: &mut Vec<Error>,
    ) -> Result<Outcome, Error> {
        let mut out = Outcome::default();
        let cached = self.cache.list(&list.name).map_err(Error::Io)?;
        for g in gone {
            let hits: Vec<&Entry> = cached.iter().filter(|e| g.matches(e)).collect();
            if hits.is_empty() {
                out.notes.push(format!(
                    "no cached attachment of {} in network {:?}",
                    g, list.name
                ));
            }
            for e in hits {
                let att = Attachment::from_cache(e);
                if let Err(err) = self.del(list, &att) {
                    errors.push(err);
                }
                // The caller says it is gone: forget it even if its DEL failed;
                // the plugin GC below then no longer counts it as valid.
                let _ = self.cache.remove(&e.key());
                out.notes
                    .push(format!("removed {}/{}", e.container_id, e.if_name));
            }
        }
        Ok(out)
    }

    fn valid_attachments(&self, list: &ConfList) -> Result<Value, Error> {
        let entries = self.cache.list(&list.name).map_err(Error::Io)?;
        Ok(Value::Array(
            entries
                .iter()
                .map(|e| json!({"containerID": e.container_id, "ifname": e.if_name}))
                .collect(),
        ))
    }

    // ------------------------------------------------------------ one plugin

    /// Derive plugin `i`'s request and execute it; stdout on success.
    fn call(
        &self,
        list: &ConfList,
        i: usize,
        command: &'static str,
        att: Option<&Attachment>,
        inject: &Inject,
    ) -> Result<Vec<u8>, Error> {
        let ty = list.plugin_type(i);
        let path = exec::find(ty, &self.cni_path).map_err(|e| {
            Error::Runtime(format!(
                "plugin {ty:?} ({} of {}) for {command}: {e}",
                i + 1,
                list.plugins.len()
            ))
        })?;
        let request = Value::Object(request_config(&list.plugins[i], inject));
        let stdin = serde_json::to_vec(&request).unwrap_or_default();
        let args = att.map(Attachment::args_env).unwrap_or_default();
        let env = CallEnv {
            command,
            container_id: att.map_or("", |a| a.container_id.as_str()),
            netns: att.map_or("", |a| a.netns.as_str()),
            ifname: att.map_or("", |a| a.ifname.as_str()),
            args: &args,
            path: &self.path_env,
        };
        exec::run(&path, &env, &stdin, self.forward_stderr)
            .map_err(|f| failure(list, i, command, f.object))
    }
}

fn inject<'a>(
    list: &'a ConfList,
    att: Option<&'a Attachment>,
    prev: Option<&'a Value>,
) -> Inject<'a> {
    Inject {
        name: &list.name,
        version: &list.version,
        cap_args: att.map(|a| &a.cap_args),
        prev_result: prev,
        valid_attachments: None,
    }
}

fn failure(list: &ConfList, i: usize, command: &'static str, object: Value) -> Error {
    Error::Plugin(Box::new(PluginFailure {
        plugin_type: list.plugin_type(i).to_string(),
        index: i,
        count: list.plugins.len(),
        command,
        object,
        notes: Vec::new(),
    }))
}

fn note(text: &str) -> Outcome {
    Outcome {
        notes: vec![text.to_string()],
    }
}

impl Gone {
    /// `ID` or `ID/IFNAME`.
    pub fn parse(s: &str) -> Gone {
        match s.split_once('/') {
            Some((id, ifname)) => Gone {
                container_id: id.into(),
                ifname: Some(ifname.into()),
            },
            None => Gone {
                container_id: s.into(),
                ifname: None,
            },
        }
    }

    fn matches(&self, e: &Entry) -> bool {
        e.container_id == self.container_id && self.ifname.as_ref().is_none_or(|i| *i == e.if_name)
    }
}

impl std::fmt::Display for Gone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.ifname {
            Some(i) => write!(f, "{}/{i}", self.container_id),
            None => f.write_str(&self.container_id),
        }
    }
}

/// A result (any layout) in the layout of version `to`.
fn convert(value: &Value, to: &str) -> Result<Value, String> {
    let version =
        Version::parse(to).ok_or_else(|| format!("{to:?} is not a CNI version cnikit speaks"))?;
    CniResult::from_value(value)
        .map(|r| r.to_value(version))
        .map_err(|e| e.to_string())
}
