//! `/proc/sys` access for keys such as "net/ipv6/conf/eth0/accept_dad".
//!
//! `/proc/sys/net` shows the network namespace of the thread that *opens* the
//! file, so to change a container's settings call these inside
//! `NetNs::run`. Keys use '/' separators only: interface names may contain
//! dots ("eth0.100"), so dotted keys are not translated.
use super::{Error, ErrorKind, Result};
use std::fs;
use std::io::Write;
use std::path::PathBuf;

fn key_path(key: &str) -> Result<PathBuf> {
    let valid = !key.is_empty()
        && !key.starts_with('/')
        && key
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if !valid {
        return Err(Error::new(
            ErrorKind::Other,
            format!("invalid sysctl key {key:?} (want e.g. net/ipv4/ip_forward)"),
        ));
    }
    Ok(PathBuf::from("/proc/sys").join(key))
}

/// Writes `value` to `/proc/sys/<key>` in one write, as sysctl(8) does.
pub fn set(key: &str, value: &str) -> Result<()> {
    let path = key_path(key)?;
    let what = format!("set sysctl {key}={value}");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(&what, &e))?;
    file.write_all(value.as_bytes())
        .map_err(|e| Error::io(&what, &e))
}

/// Reads `/proc/sys/<key>`, trimmed.
pub fn get(key: &str) -> Result<String> {
    let path = key_path(key)?;
    fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::io(&format!("read sysctl {key}"), &e))
}

/// Turns on forwarding of one family in this thread's netns (as the reference's
/// `ip.EnableForward`), writing only when it is off: the write takes the RTNL lock,
/// and on a node that forwards already it would be paid for every pod.
pub fn enable_forwarding(ipv4: bool) -> Result<()> {
    let key = if ipv4 {
        "net/ipv4/ip_forward"
    } else {
        "net/ipv6/conf/all/forwarding"
    };
    if get(key).ok().as_deref() == Some("1") {
        return Ok(());
    }
    set(key, "1")
}
