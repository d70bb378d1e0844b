//! Network configuration lists: finding one by network name in a conf dir
//! (libcni's `LoadConfList`), reading legacy single-plugin files, and picking
//! the spec version the list runs at.

use super::Error;
use crate::cni::Version;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A parsed network configuration list.
#[derive(Debug, Clone)]
pub struct ConfList {
    pub name: String,
    /// The version every plugin is called with (`""` when the list names none,
    /// which plugins read as 0.1.0/0.2.0, exactly as libcni passes it on).
    pub version: String,
    pub disable_check: bool,
    pub disable_gc: bool,
    /// Each plugin's configuration object, unchanged.
    pub plugins: Vec<Map<String, Value>>,
    /// The list as JSON (for a legacy file: the list it was converted to);
    /// the result cache keeps these bytes like libcni does.
    pub bytes: Vec<u8>,
    /// Where it was read from, for messages.
    pub source: PathBuf,
}

impl ConfList {
    /// The version as an ordered value; an absent version counts as 0.1.0
    /// (libcni's decoder does the same).
    pub fn ver(&self) -> Version {
        Version::parse(&self.version).unwrap_or(Version::V010)
    }

    /// `type` of plugin `i`, for messages and the CNI_PATH lookup.
    pub fn plugin_type(&self, i: usize) -> &str {
        self.plugins
            .get(i)
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// Parse a `.conflist` document.
    pub fn from_list_bytes(bytes: &[u8], source: &Path) -> Result<ConfList, Error> {
        let raw = parse_object(bytes, source)?;
        let plugins = match raw.get("plugins") {
            Some(Value::Array(items)) if !items.is_empty() => plugin_objects(items, source)?,
            Some(Value::Array(_)) => return Err(bad(source, "\"plugins\" is empty")),
            Some(_) => return Err(bad(source, "\"plugins\" must be a list")),
            None => return Err(bad(source, "no \"plugins\" list")),
        };
        Ok(ConfList {
            name: network_name(&raw, source)?,
            version: pick_version(&raw, source)?,
            disable_check: flag(&raw, "disableCheck", source)?,
            disable_gc: flag(&raw, "disableGC", source)?,
            plugins,
            bytes: bytes.to_vec(),
            source: source.to_path_buf(),
        })
    }

    /// Parse a legacy single-plugin `.conf`/`.json` and wrap it in a one-plugin
    /// list, as libcni's `ConfListFromConf` does.
    pub fn from_single_bytes(bytes: &[u8], source: &Path) -> Result<ConfList, Error> {
        let raw = parse_object(bytes, source)?;
        let mut list = Map::new();
        list.insert("name".into(), Value::String(network_name(&raw, source)?));
        if let Some(v) = raw.get("cniVersion") {
            list.insert("cniVersion".into(), v.clone());
        }
        list.insert("plugins".into(), Value::Array(vec![Value::Object(raw)]));
        let text = serde_json::to_vec(&Value::Object(list))
            .map_err(|e| bad(source, &format!("cannot re-encode: {e}")))?;
        ConfList::from_list_bytes(&text, source)
    }
}

fn parse_object(bytes: &[u8], source: &Path) -> Result<Map<String, Value>, Error> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad(source, "not a JSON object")),
        Err(e) => Err(bad(source, &format!("invalid JSON: {e}"))),
    }
}

fn plugin_objects(items: &[Value], source: &Path) -> Result<Vec<Map<String, Value>>, Error> {
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(obj) = item else {
            return Err(bad(source, &format!("plugins[{i}] is not an object")));
        };
        match obj.get("type") {
            Some(Value::String(t)) if valid_type(t) => out.push(obj.clone()),
            other => {
                return Err(bad(
                    source,
                    &format!(
                        "plugins[{i}] needs a \"type\" that names an executable, got {other:?}"
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// The type is looked up as a file name in CNI_PATH: no path separators.
fn valid_type(t: &str) -> bool {
    !t.is_empty() && t != "." && t != ".." && !t.contains('/')
}

fn network_name(raw: &Map<String, Value>, source: &Path) -> Result<String, Error> {
    match raw.get("name") {
        Some(Value::String(n)) => match crate::cni::env::validate_network_name(n) {
            Ok(()) => Ok(n.clone()),
            Err(why) => Err(bad(source, &format!("network name {n:?} {why}"))),
        },
        _ => Err(bad(source, "no network \"name\"")),
    }
}

/// libcni accepts the booleans also as the strings "true"/"false".
fn flag(raw: &Map<String, Value>, key: &str, source: &Path) -> Result<bool, Error> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(bad(
            source,
            &format!("{key} must be a boolean, got {other}"),
        )),
    }
}

/// The highest spec version we know among `cniVersion` and `cniVersions`
/// (spec 1.1). Versions we do not know are skipped when another is usable,
/// so a list can name a future version beside one we speak.
pub fn pick_version(raw: &Map<String, Value>, source: &Path) -> Result<String, Error> {
    let mut named: Vec<&str> = Vec::new();
    match raw.get("cniVersion") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => named.push(s),
        Some(other) => {
            return Err(bad(
                source,
                &format!("cniVersion must be a string, got {other}"),
            ))
        }
    }
    match raw.get("cniVersions") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                let Some(s) = item.as_str() else {
                    return Err(bad(source, "cniVersions must be a list of strings"));
                };
                named.push(s);
            }
        }
        Some(_) => return Err(bad(source, "cniVersions must be a list of strings")),
    }
    named.retain(|s| !s.is_empty());
    if named.is_empty() {
        return Ok(String::new());
    }
    let best = named.iter().filter_map(|s| Version::parse(s)).max();
    match best {
        Some(v) => Ok(v.as_str().to_string()),
        None => Err(Error::Runtime(format!(
            "{}: none of the CNI versions {named:?} is one this runtime speaks ({})",
            source.display(),
            Version::all_joined()
        ))),
    }
}

fn bad(source: &Path, what: &str) -> Error {
    Error::Runtime(format!(
        "invalid network configuration {}: {what}",
        source.display()
    ))
}

/// Regular files in `dir` with one of `extensions`, sorted by name (libcni's
/// `ConfFiles` + sort: the first file naming a network wins).
fn conf_files(dir: &Path, extensions: &[&str]) -> Result<Vec<PathBuf>, Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Error::Runtime(format!(
            "cannot read the configuration directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| extensions.contains(&e))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Find network `name` in `dir`: `.conflist` files first, then legacy
/// `.conf`/`.json` files (converted to a one-plugin list). Files that do not
/// parse are skipped, but named in the error when nothing matched, so a typo
/// in the wanted file does not read as "no such network".
pub fn load_by_name(dir: &Path, name: &str) -> Result<ConfList, Error> {
    let mut broken = Vec::new();
    let lists = conf_files(dir, &["conflist"])?;
    for path in &lists {
        match read(path).and_then(|b| ConfList::from_list_bytes(&b, path)) {
            Ok(list) if list.name == name => return Ok(list),
            Ok(_) => {}
            Err(e) => broken.push(e.to_string()),
        }
    }
    for path in conf_files(dir, &["conf", "json"])? {
        match read(&path).and_then(|b| ConfList::from_single_bytes(&b, &path)) {
            Ok(list) if list.name == name => return Ok(list),
            Ok(_) => {}
            Err(e) => broken.push(e.to_string()),
        }
    }
    let mut msg = format!(
        "no network configuration named {name:?} in {} (looked at *.conflist, *.conf, *.json)",
        dir.display()
    );
    for b in broken {
        msg.push_str("\n  skipped: ");
        msg.push_str(&b);
    }
    Err(Error::Runtime(msg))
}

/// One configuration file: where it is, and its list or why it does not parse.
pub type ConfFile = (PathBuf, Result<ConfList, Error>);

/// Every configuration file in `dir` in the order [`load_by_name`] reads
/// them (`.conflist`, then `.conf`/`.json`), each parsed or with the reason
/// it does not parse (`cnikit doctor`).
pub fn load_all(dir: &Path) -> Result<Vec<ConfFile>, Error> {
    let mut out = Vec::new();
    for path in conf_files(dir, &["conflist"])? {
        let list = read(&path).and_then(|b| ConfList::from_list_bytes(&b, &path));
        out.push((path, list));
    }
    for path in conf_files(dir, &["conf", "json"])? {
        let list = read(&path).and_then(|b| ConfList::from_single_bytes(&b, &path));
        out.push((path, list));
    }
    Ok(out)
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Runtime(format!("cannot read {}: {e}", path.display())))
}
