//! tuning's `sysctl` keys: which ones may be written, and where they live. Only the pod's
//! own network sysctls: keys under `net.` (a dotted or `/` path), `IFNAME` standing for
//! `CNI_IFNAME`, written from inside the pod's netns, where `/proc/sys/net` is that
//! namespace's. Global keys that a child netns does not show (or shows read-only) fail there.

use crate::cni::gojson::known_key;
use crate::cni::Error;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::Deserializer;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;

/// The reference's allowlist: when this file exists, every configured key must match one
/// of its lines (regular expressions, unanchored, as Go's `regexp.MatchString`).
pub(super) const ALLOWLIST: &str = "/etc/cni/tuning/allowlist.conf";
/// The allowlist is an admin's short list; a larger file is a mistake.
const MAX_ALLOWLIST: u64 = 64 << 10;

/// The `/`-separated key under `/proc/sys` for `key` (`net.ipv4.conf.IFNAME.arp_notify` or
/// `net/ipv4/conf/IFNAME/arp_notify`): dots become separators first, then the first
/// `IFNAME` becomes `ifname`, so an interface name with a dot (`eth0.100`) stays one
/// component, as in the reference. Anything outside `net/`, empty components, `.` and `..`
/// are refused.
pub(super) fn proc_key(key: &str, ifname: &str) -> Result<String, Error> {
    let path = key.replace('.', "/").replacen("IFNAME", ifname, 1);
    let parts: Vec<&str> = path.split('/').collect();
    let bad = parts.len() < 2
        || parts[0] != "net"
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains('\0'));
    if bad {
        return Err(Error::invalid_config(format!(
            "sysctl {key:?} is not a network sysctl of the pod: keys must be under net. (like net.ipv4.conf.IFNAME.arp_notify), without empty, . or .. parts"
        )));
    }
    Ok(path)
}

/// Refuse keys the allowlist at `path` (when it exists) does not match.
pub(super) fn check_allowlist(path: &Path, keys: &[&str]) -> Result<(), Error> {
    let text = match read_allowlist(path)? {
        Some(t) => t,
        None => return Ok(()),
    };
    let mut patterns = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let re = regex::Regex::new(line).map_err(|e| {
            Error::invalid_config(format!(
                "{}: {line:?} is not a regular expression: {e}",
                path.display()
            ))
        })?;
        patterns.push(re);
    }
    if let Some(key) = keys
        .iter()
        .find(|k| !patterns.iter().any(|p| p.is_match(k)))
    {
        let list: Vec<&str> = patterns.iter().map(regex::Regex::as_str).collect();
        return Err(Error::invalid_config(format!(
            "sysctl {key:?} is not allowed by {}; allowed: {}",
            path.display(),
            list.join(", ")
        )));
    }
    Ok(())
}

fn read_allowlist(path: &Path) -> Result<Option<String>, Error> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let what = |e: &dyn fmt::Display| {
        Error::invalid_config(format!(
            "cannot read the sysctl allowlist {}: {e}",
            path.display()
        ))
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(what(&e)),
    };
    if !file.metadata().map_err(|e| what(&e))?.is_file() {
        return Err(what(&"not a regular file"));
    }
    let mut text = String::new();
    file.take(MAX_ALLOWLIST + 1)
        .read_to_string(&mut text)
        .map_err(|e| what(&e))?;
    if text.len() as u64 > MAX_ALLOWLIST {
        return Err(what(&format_args!("larger than {MAX_ALLOWLIST} bytes")));
    }
    Ok(Some(text))
}

/// A `sysctl` object naming one key twice is refused, as in the reference: a JSON
/// decoder keeps only one of the values, and which one the user meant is unknown.
/// Reads the raw configuration, since the parsed one has already lost the duplicate.
pub(super) fn refuse_duplicate_keys(raw: &[u8]) -> Result<(), Error> {
    let mut de = serde_json::Deserializer::from_slice(raw);
    match de.deserialize_map(TopLevel) {
        Ok(()) => Ok(()),
        Err(e) if e.is_data() => Err(Error::invalid_config(e.to_string())),
        // Syntax errors were reported when the configuration was parsed.
        Err(_) => Ok(()),
    }
}

/// The configuration's top level: only `sysctl` (matched as Go matches keys) is read.
struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a network configuration object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if known_key(&key) == Some("sysctl") {
                map.next_value_seed(NoDuplicates(&mut seen))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// One `sysctl` object; `seen` spans every spelling of `sysctl` at the top level, as the
/// reference's check decodes them all into one map.
struct NoDuplicates<'a>(&'a mut HashSet<String>);

impl<'de> de::DeserializeSeed<'de> for NoDuplicates<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NoDuplicates<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the sysctl object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if !self.0.insert(key.clone()) {
                return Err(de::Error::custom(format!(
                    "sysctl {key:?} is given twice; give each key once"
                )));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }

    // Anything else is reported by the typed decoding, with its path.
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_proc_paths_under_net_only() {
        let k = |key: &str| proc_key(key, "eth0.100");
        assert_eq!(
            k("net.ipv4.conf.IFNAME.arp_notify").unwrap(),
            "net/ipv4/conf/eth0.100/arp_notify"
        );
        assert_eq!(
            k("net/ipv6/conf/IFNAME/accept_ra").unwrap(),
            "net/ipv6/conf/eth0.100/accept_ra"
        );
        assert_eq!(k("net.core.somaxconn").unwrap(), "net/core/somaxconn");
        // Only the first IFNAME is replaced, as in the reference.
        assert_eq!(k("net.IFNAME.IFNAME").unwrap(), "net/eth0.100/IFNAME");
        for bad in [
            "kernel.shmmax",
            "net",
            "net..ipv4",
            "net/../kernel/shmmax",
            "/net/ipv4/ip_forward",
            "net.ipv4.",
            "vm.overcommit_memory",
            "",
        ] {
            let e = k(bad).unwrap_err();
            assert_eq!(e.code, 7, "{bad}");
            assert!(e.msg.contains("net."), "{bad}: {}", e.msg);
        }
    }

    #[test]
    fn duplicate_keys_are_refused_in_any_spelling_of_sysctl() {
        let ok = br#"{"name":"n","sysctl":{"net.a":"1","net.b":"2"},"args":{"x":[1,{"y":2}]}}"#;
        refuse_duplicate_keys(ok).unwrap();
        let dup = br#"{"sysctl":{"net.a":"1","net.a":"2"}}"#;
        let e = refuse_duplicate_keys(dup).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("net.a"), "{}", e.msg);
        let across = br#"{"sysctl":{"net.a":"1"},"SysCtl":{"net.a":"2"}}"#;
        refuse_duplicate_keys(across).unwrap_err();
        // Not an object: left to the typed decoding.
        refuse_duplicate_keys(br#"{"sysctl":"x"}"#).unwrap();
    }

    #[test]
    fn allowlist_matches_like_go_regexp() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("allowlist.conf");
        check_allowlist(&path, &["net.anything"]).unwrap();
        std::fs::write(
            &path,
            "^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]*$\n\n  net.core.somaxconn \n",
        )
        .unwrap();
        check_allowlist(
            &path,
            &["net.ipv4.conf.IFNAME.arp_notify", "net.core.somaxconn"],
        )
        .unwrap();
        let e = check_allowlist(&path, &["net.ipv4.ip_forward"]).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("net.ipv4.ip_forward"), "{}", e.msg);
        std::fs::write(&path, "net.(\n").unwrap();
        assert_eq!(check_allowlist(&path, &["net.a"]).unwrap_err().code, 7);
    }
}
