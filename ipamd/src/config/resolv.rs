//! `resolvConf`: host-local reads a resolv.conf-format file into the result's `dns`.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, ErrorKind};

/// The CNI result's `dns` object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// Sets nothing at all (`{}`).
    pub fn is_empty(&self) -> bool {
        self == &Dns::default()
    }
}

/// Largest resolv.conf read; real ones are a few hundred bytes.
pub(crate) const MAX_RESOLV_CONF: u64 = 64 << 10;

/// Parse a resolv.conf file (`nameserver`, `domain`, `search`, `options`; `#`/`;` comments).
///
/// The path comes from the network config, so it is read defensively: links are followed
/// (`/etc/resolv.conf` is often one) but the file itself must be a regular file, opened
/// non-blocking so that a FIFO cannot hang the open, and at most [`MAX_RESOLV_CONF`]
/// bytes (a device such as /dev/zero would never end).
pub fn parse_resolv_conf(path: &Path) -> Result<Dns, Error> {
    let what = |msg: String| format!("ipam.resolvConf {}: {msg}", path.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| {
            let kind = match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                    ErrorKind::InvalidConfig
                }
                _ => ErrorKind::Io,
            };
            Error::new(kind, what(e.to_string()))
        })?;
    let meta = file
        .metadata()
        .map_err(|e| Error::new(ErrorKind::Io, what(e.to_string())))?;
    if !meta.is_file() {
        return Err(Error::invalid(what(
            "is not a regular file (a FIFO, device, socket or directory); refusing to read it"
                .to_string(),
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_RESOLV_CONF + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::new(ErrorKind::Io, what(e.to_string())))?;
    if bytes.len() as u64 > MAX_RESOLV_CONF {
        return Err(Error::invalid(what(format!(
            "is larger than {MAX_RESOLV_CONF} bytes; refusing to read it"
        ))));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| Error::invalid(what("is not UTF-8 text".to_string())))?;
    Ok(parse_resolv_text(&text))
}

pub(crate) fn parse_resolv_text(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let mut words = line.split_whitespace();
        let Some(keyword) = words.next() else {
            continue;
        };
        match keyword {
            "nameserver" => dns.nameservers.extend(words.next().map(str::to_string)),
            "domain" => dns.domain = words.next().unwrap_or_default().to_string(),
            // As in glibc, the last `search` line wins.
            "search" => dns.search = words.map(str::to_string).collect(),
            "options" => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}
