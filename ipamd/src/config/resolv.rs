//! `resolvConf`: host-local reads a resolv.conf-format file into the result's `dns`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, ErrorKind};

/// The CNI result's `dns` object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// Parse a resolv.conf file (`nameserver`, `domain`, `search`, `options`; `#`/`;` comments).
pub fn parse_resolv_conf(path: &Path) -> Result<Dns, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound {
            ErrorKind::InvalidConfig
        } else {
            ErrorKind::Io
        };
        Error::new(kind, format!("ipam.resolvConf {}: {e}", path.display()))
    })?;
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
            "domain" => dns.domain = words.next().map(str::to_string),
            // As in glibc, the last `search` line wins.
            "search" => dns.search = words.map(str::to_string).collect(),
            "options" => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}
