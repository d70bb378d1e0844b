//! The error shape of the layers the plugins build on (the firewall, the DHCP client): a
//! kind, which the plugin maps to a CNI code in one place (`cni/error.rs`), and a message
//! a person can act on. It travels between plugin and daemon as JSON.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure<K> {
    pub kind: K,
    /// What was being done and why it failed.
    pub message: String,
}

impl<K> Failure<K> {
    pub fn new(kind: K, message: impl Into<String>) -> Failure<K> {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl<K> fmt::Display for Failure<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl<K: fmt::Debug> std::error::Error for Failure<K> {}
