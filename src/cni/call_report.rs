//! After the answer, the call's report to the ipamd daemon (`ipamd::plugin_calls`): the
//! plugin, verb, network, result code and duration, for its `/metrics`. Sent once the
//! reply is written, as one non-blocking datagram: no daemon costs one failed `sendto`.

use super::config::NetConf;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the report says of the call besides its outcome, and where it goes.
pub(super) struct CallFacts {
    network: String,
    /// The daemon's API socket: the configuration's `daemonSocket`, else its ipamd
    /// `ipam.socket`, else the default.
    socket: PathBuf,
}

impl CallFacts {
    pub(super) fn of(conf: &NetConf, default_socket: &Path) -> CallFacts {
        let named = |v: Option<&serde_json::Value>| v.and_then(|s| s.as_str()).map(PathBuf::from);
        let ipam_socket = conf.raw.get("ipam").and_then(|i| i.get("socket"));
        let socket = named(conf.raw.get("daemonSocket"))
            .or_else(|| named(ipam_socket))
            .unwrap_or_else(|| default_socket.to_path_buf());
        CallFacts {
            network: conf.name.clone(),
            socket,
        }
    }

    /// A call whose configuration was not read (VERSION, or one that did not parse).
    pub(super) fn without_conf(default_socket: &Path) -> CallFacts {
        CallFacts {
            network: String::new(),
            socket: default_socket.to_path_buf(),
        }
    }

    /// Send the report of the call: `code` 0 for success.
    pub(super) fn send(&self, plugin: &str, code: u32, took: Duration) {
        let report = ipamd::plugin_calls::CallReport {
            plugin: plugin.to_string(),
            verb: std::env::var("CNI_COMMAND").unwrap_or_default(),
            network: self.network.clone(),
            code,
            micros: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        };
        ipamd::plugin_calls::send(&self.socket, &report);
    }
}
