//! Request and response types shared by the daemon and the client. They are the JSON bodies
//! of the daemon's HTTP API (documented in the README), so field names are camelCase like the
//! rest of CNI.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use crate::attachment::Attachment;
use crate::config::RangeSet;
use crate::{Error, ErrorKind};

/// A lease is held by one attachment; its JSON is `{"network", "containerId", "ifname"}`.
pub type LeaseKey = Attachment;

/// Allocate one address per range set for `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocateRequest {
    pub key: LeaseKey,
    pub range_sets: Vec<RangeSet>,
    /// Explicitly requested addresses (CNI_ARGS `IP=`, `args.cni.ips`, `runtimeConfig.ips`):
    /// at most one per range set, each inside one of the range sets.
    #[serde(default)]
    pub requested: Vec<IpAddr>,
    /// Cluster pools (`ipam.pool`/`ipam.pools`) instead of range sets: one address from
    /// each, out of this node's blocks; only the daemon serves these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
}

/// One allocated address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// The address with its subnet's prefix length.
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

/// A lease as listed by `leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseInfo {
    pub network: String,
    pub address: IpAddr,
    pub container_id: String,
    pub ifname: String,
    pub boot_id: String,
    pub created_unix: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocateResponse {
    pub allocations: Vec<Allocation>,
}

/// Free the leases of `network` whose attachment is not in `valid`. On the wire the valid
/// entries leave out the network they share: `{"network", "valid": [{"containerId",
/// "ifname"}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "GcWire", into = "GcWire")]
pub struct GcRequest {
    pub network: String,
    pub valid: Vec<Attachment>,
}

#[derive(Serialize, Deserialize)]
struct GcWire {
    network: String,
    valid: Vec<GcWireEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GcWireEntry {
    container_id: String,
    ifname: String,
}

impl From<GcWire> for GcRequest {
    fn from(w: GcWire) -> GcRequest {
        let valid = w
            .valid
            .into_iter()
            .map(|e| Attachment::new(&w.network, &e.container_id, &e.ifname))
            .collect();
        GcRequest {
            network: w.network,
            valid,
        }
    }
}

impl From<GcRequest> for GcWire {
    fn from(r: GcRequest) -> GcWire {
        GcWire {
            network: r.network,
            valid: r
                .valid
                .into_iter()
                .map(|a| GcWireEntry {
                    container_id: a.container_id,
                    ifname: a.ifname,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcResponse {
    pub freed: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusRequest {
    pub network: String,
    pub range_sets: Vec<RangeSet>,
    /// Cluster pools, as in [`AllocateRequest::pools`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeasesResponse {
    pub leases: Vec<LeaseInfo>,
}

/// The body of every non-2xx answer: the client rebuilds the same [`Error`] from it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub kind: ErrorKind,
    pub message: String,
}

impl From<&Error> for ErrorBody {
    fn from(e: &Error) -> Self {
        ErrorBody {
            kind: e.kind(),
            message: e.message().to_string(),
        }
    }
}

impl From<ErrorBody> for Error {
    fn from(b: ErrorBody) -> Self {
        Error::new(b.kind, b.message)
    }
}

/// Request header with which the client names the store it would fall back to: `DEV:INO PATH`
/// (the directory's device and inode, `none` if it does not exist, then its path
/// percent-encoded, for messages). The daemon refuses requests for another directory, so that
/// the daemon and the in-process fallback never allocate from two different stores.
pub const DATA_DIR_HEADER: &str = "ipamd-data-dir";

/// The [`DATA_DIR_HEADER`] value for `dir`.
pub fn data_dir_header(dir: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let mut value = match std::fs::metadata(dir) {
        Ok(meta) => format!("{}:{} ", meta.dev(), meta.ino()),
        Err(_) => "none ".to_string(),
    };
    for &b in dir.as_os_str().as_bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            value.push(char::from(b));
        } else {
            value.push_str(&format!("%{b:02X}"));
        }
    }
    value
}

/// Parse a [`DATA_DIR_HEADER`] value into ((device, inode) or None, path for messages).
pub fn parse_data_dir_header(value: &[u8]) -> Option<(Option<(u64, u64)>, String)> {
    let text = std::str::from_utf8(value).ok()?;
    let (id, path) = text.split_once(' ').unwrap_or((text, ""));
    let id = match id {
        "none" => None,
        _ => {
            let (dev, ino) = id.split_once(':')?;
            Some((dev.parse().ok()?, ino.parse().ok()?))
        }
    };
    let mut raw = Vec::with_capacity(path.len());
    let bytes = path.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            raw.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            raw.push(bytes[i]);
            i += 1;
        }
    }
    Some((id, String::from_utf8_lossy(&raw).into_owned()))
}
