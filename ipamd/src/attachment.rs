//! One attachment of a container to a network: (network name, container ID, interface
//! name), the CNI key of everything cnikit keeps per attachment (IPAM leases, firewall
//! ownership tags, GC's valid list, the runtime's result cache), and the one set of rules
//! for its three names.
//!
//! The serde form is the lease API's (`network`, `containerId`, `ifname`); wire formats
//! that spell the fields differently convert at their edge.

use serde::{Deserialize, Serialize};

use crate::Error;

/// The CNI key of one attachment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

/// Longer parts are replaced by a hash in [`Attachment::tag`], so a tag always fits
/// nftables' 255-byte comment (container IDs have no length limit in the spec).
const TAG_MAX_NETWORK: usize = 64;
const TAG_MAX_CONTAINER: usize = 128;

impl Attachment {
    pub fn new(network: &str, container_id: &str, ifname: &str) -> Attachment {
        Attachment {
            network: network.to_string(),
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
        }
    }

    /// Refuse keys that cannot name a lease (checked by the store before any change):
    /// the network name becomes a directory, the other two only need to be present.
    pub fn validate(&self) -> Result<(), Error> {
        check_network(&self.network)?;
        if self.container_id.is_empty() {
            return Err(Error::invalid("container ID is empty (CNI_CONTAINERID)"));
        }
        if self.ifname.is_empty() {
            return Err(Error::invalid("interface name is empty (CNI_IFNAME)"));
        }
        Ok(())
    }

    /// `network/containerID/ifname`, at most 64 + 128 + 15 bytes plus separators: a stable
    /// text form for places with a length limit (nftables element comments). Parts that are
    /// too long become `#` and their FNV-1a hash; none of the three contains a `/`.
    pub fn tag(&self) -> String {
        format!(
            "{}{}/{}",
            Attachment::tag_prefix(&self.network),
            tag_part(&self.container_id, TAG_MAX_CONTAINER),
            self.ifname
        )
    }

    /// The [`tag`](Attachment::tag) prefix shared by every attachment of `network`.
    pub fn tag_prefix(network: &str) -> String {
        format!("{}/", tag_part(network, TAG_MAX_NETWORK))
    }
}

fn tag_part(s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        format!("#{:016x}", fnv1a(s.as_bytes()))
    }
}

/// FNV-1a 64: stable across builds and versions (unlike std's hasher), as tags (and the
/// firewall's chain names) are kept in the kernel across upgrades.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The network name as the lease store takes it: [`validate_network_name`], and at most 200
/// characters, as it becomes a directory name under `dataDir`.
pub(crate) fn check_network(name: &str) -> Result<(), Error> {
    if validate_network_name(name).is_ok() && name.len() <= 200 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "network name {name:?} is invalid: it must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$ (at most 200 characters)"
        )))
    }
}

/// CNI spec: non-empty, starts alphanumeric, then alphanumerics, `_`, `.`, `-`.
pub fn validate_container_id(id: &str) -> Result<(), &'static str> {
    validate_identifier(id)
}

/// Network names follow the same charset as container IDs (`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`),
/// which also keeps `../` and absolute paths out where a name becomes a directory.
pub fn validate_network_name(name: &str) -> Result<(), &'static str> {
    validate_identifier(name)
}

fn validate_identifier(s: &str) -> Result<(), &'static str> {
    let mut chars = s.chars();
    match chars.next() {
        None => return Err("must not be empty"),
        Some(c) if !c.is_ascii_alphanumeric() => return Err("must start with a letter or digit"),
        _ => {}
    }
    if chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(())
    } else {
        Err("may only contain letters, digits, '_', '.' and '-'")
    }
}

/// The kernel's rules for a link name (`dev_valid_name`): non-empty, not `.`/`..`, at most
/// 15 bytes, no `/`, `:` or whitespace; and no `%` (the kernel would treat `eth%d` as a
/// template and pick a free name itself) or NUL (it would cut the name short).
pub fn validate_ifname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if name == "." || name == ".." {
        return Err("must not be '.' or '..'");
    }
    if name.len() >= 16 {
        return Err("must be shorter than 16 bytes");
    }
    if name
        .chars()
        .any(|c| matches!(c, '/' | ':' | '%' | '\0') || c.is_whitespace())
    {
        return Err("must not contain '/', ':', '%', whitespace or NUL");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifname_follows_the_kernel() {
        for ok in ["eth0", "123456789012345", "veth.1-a_b", "ä"] {
            assert!(validate_ifname(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "1234567890123456",
            "a/b",
            "a:b",
            "eth%d",
            "a\0b",
            "a b",
            "a\tb",
            "a\nb",
        ] {
            assert!(validate_ifname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn identifiers() {
        assert!(validate_container_id("a1_b.c-d").is_ok());
        assert!(validate_network_name("net-1.x_y").is_ok());
        for bad in ["", "_a", ".a", "a/b", "a b", "é", "../x"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?}");
            assert!(validate_network_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lease_api_spelling() {
        let a = Attachment::new("n", "c1", "eth0");
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(
            text,
            r#"{"network":"n","containerId":"c1","ifname":"eth0"}"#
        );
        assert_eq!(serde_json::from_str::<Attachment>(&text).unwrap(), a);
    }

    #[test]
    fn tags_are_bounded_and_prefixed_by_network() {
        let a = Attachment::new("net", "c1", "eth0");
        assert_eq!(a.tag(), "net/c1/eth0");
        assert!(a.tag().starts_with(&Attachment::tag_prefix("net")));
        let long = Attachment::new(&"n".repeat(300), &"c".repeat(300), "eth0");
        assert!(long.tag().len() < 255, "{}", long.tag());
        assert!(long
            .tag()
            .starts_with(&Attachment::tag_prefix(&"n".repeat(300))));
    }
}
