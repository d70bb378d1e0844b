//! The one error type of the CNI path, and the one place where failures from
//! the layers below (netlink, IPAM store, I/O) become CNI error codes.

use serde::Serialize;
use std::fmt;

/// Well-known CNI error codes (spec "Error" section) and our plugin codes (100+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Code {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    UnknownContainer = 3,
    InvalidEnv = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    /// STATUS: the plugin cannot serve ADD now.
    NotAvailable = 50,
    /// A kernel operation failed.
    Kernel = 100,
    /// The kernel lacks a feature the configuration needs (e.g. ipvlan).
    KernelUnsupported = 101,
    /// The container interface name is already taken in the netns.
    InterfaceExists = 102,
    /// IPAM could not allocate (pool exhausted, requested address taken).
    AddressUnavailable = 103,
    /// A delegated plugin could not be run or answered garbage.
    Delegate = 104,
    /// A host port is already mapped to another attachment (portmap).
    PortInUse = 105,
    /// Any other failure inside the plugin.
    Internal = 999,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl Error {
    pub fn new(code: Code, msg: impl Into<String>) -> Self {
        Error {
            code: code as u32,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// An error passed through unchanged from a delegated plugin.
    pub fn raw(code: u32, msg: String, details: String) -> Self {
        Error { code, msg, details }
    }

    /// Prefix the message with what we were doing, keeping the code.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }

    /// The outcome of steps that all ran (DEL, GC): every failure is reported,
    /// in order, under the first one's code; a runtime shows only one error.
    pub fn all(steps: impl IntoIterator<Item = Result<(), Error>>) -> Result<(), Error> {
        let failed: Vec<Error> = steps.into_iter().filter_map(Result::err).collect();
        let mut failed = failed.into_iter();
        let Some(mut first) = failed.next() else {
            return Ok(());
        };
        for e in failed {
            first.msg = format!("{}; also: {} (code {})", first.msg, e.msg, e.code);
        }
        Err(first)
    }

    /// CHECK found the container other than the result says it is.
    pub fn check_failed(what: impl fmt::Display) -> Self {
        Error::new(Code::Kernel, format!("CHECK: {what}"))
    }

    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Error::new(Code::InvalidConfig, msg)
    }

    /// The JSON error object printed on stdout.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        let wire = Wire {
            cni_version,
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        };
        serde_json::to_string(&wire).unwrap_or_else(|_| {
            format!(r#"{{"cniVersion":"{cni_version}","code":999,"msg":"unprintable error"}}"#)
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)
    }
}

impl std::error::Error for Error {}

impl From<crate::netlink::Error> for Error {
    fn from(e: crate::netlink::Error) -> Self {
        use crate::netlink::ErrorKind;
        let code = match e.kind {
            ErrorKind::NetnsNotFound => Code::UnknownContainer,
            ErrorKind::Unsupported => Code::KernelUnsupported,
            ErrorKind::AlreadyExists => Code::InterfaceExists,
            ErrorKind::NotFound | ErrorKind::Other => Code::Kernel,
        };
        Error::new(code, e.message)
    }
}

impl From<crate::firewall::Error> for Error {
    fn from(e: crate::firewall::Error) -> Self {
        use crate::firewall::ErrorKind;
        let code = match e.kind {
            ErrorKind::Conflict => Code::PortInUse,
            ErrorKind::Unsupported => Code::KernelUnsupported,
            ErrorKind::Mismatch | ErrorKind::Other => Code::Kernel,
        };
        Error::new(code, e.message)
    }
}

impl From<crate::dhcp::Error> for Error {
    fn from(e: crate::dhcp::Error) -> Self {
        use crate::dhcp::ErrorKind;
        let code = match e.kind {
            // The LAN may answer on the next try; the runtime retries the pod.
            ErrorKind::NoAnswer => Code::TryAgainLater,
            ErrorKind::Refused => Code::AddressUnavailable,
            ErrorKind::NoInterface => Code::UnknownContainer,
            ErrorKind::Io => Code::Io,
            ErrorKind::Invalid => Code::InvalidConfig,
            ErrorKind::Forbidden => Code::Internal,
        };
        Error::new(code, e.message)
    }
}

impl From<ipamd::Error> for Error {
    fn from(e: ipamd::Error) -> Self {
        use ipamd::ErrorKind;
        let code = match e.kind() {
            ErrorKind::InvalidConfig => Code::InvalidConfig,
            ErrorKind::Exhausted | ErrorKind::Conflict => Code::AddressUnavailable,
            ErrorKind::Io => Code::Io,
            ErrorKind::Unavailable => Code::TryAgainLater,
            ErrorKind::NotFound | ErrorKind::Internal => Code::Internal,
        };
        Error::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reports_every_failed_step_under_the_first_code() {
        assert!(Error::all([Ok(()), Ok(())]).is_ok());
        let e = Error::all([
            Ok(()),
            Err(Error::new(Code::Io, "release lease: disk gone")),
            Err(Error::new(Code::Kernel, "delete veth: EBUSY")),
        ])
        .unwrap_err();
        assert_eq!(e.code, Code::Io as u32);
        assert_eq!(
            e.msg,
            "release lease: disk gone; also: delete veth: EBUSY (code 100)"
        );
    }

    #[test]
    fn netns_errors_map_by_kind() {
        use crate::netlink::{Error as NlError, ErrorKind};
        let gone = NlError::new(ErrorKind::NetnsNotFound, "open netns /run/netns/x: gone");
        assert_eq!(Error::from(gone).code, Code::UnknownContainer as u32);
        let denied = NlError::new(
            ErrorKind::Other,
            "open netns /run/netns/x: Permission denied",
        );
        assert_eq!(Error::from(denied).code, Code::Kernel as u32);
    }
}
