//! Failures of the firewall layer, in terms a plugin can act on. The mapping
//! to CNI error codes lives in `cni/error.rs`, like every other mapping.

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// A host port (or another keyed entry) belongs to another attachment;
    /// nothing was changed.
    Conflict,
    /// CHECK: an entry of this attachment is missing or points elsewhere.
    Mismatch,
    /// The kernel lacks nf_tables or a part of it (EOPNOTSUPP and friends).
    Unsupported,
    /// Any other kernel, socket or decoding failure.
    Other,
}

pub type Error = crate::failure::Failure<ErrorKind>;

/// A kernel or socket failure (the operation is already named in the
/// message); only "the kernel lacks it" matters to a plugin.
impl From<crate::netlink::Error> for Error {
    fn from(e: crate::netlink::Error) -> Error {
        let kind = match e.kind {
            crate::netlink::ErrorKind::Unsupported => ErrorKind::Unsupported,
            _ => ErrorKind::Other,
        };
        Error::new(kind, e.message)
    }
}
