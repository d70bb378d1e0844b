//! Who owns an entry. Every element cnikit adds carries its attachment's tag
//! in the element userdata, encoded as the comment TLV nft itself uses, so DEL
//! and GC find exactly their entries with nothing else to go on (no netns, no
//! prevResult), and `nft list ruleset` shows whose entry it is.

/// One attachment: the CNI key (network name, container ID, ifname).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

/// NFTNL_UDATA_SET_ELEM_COMMENT: the TLV type nft prints as `comment "…"`.
const UDATA_COMMENT: u8 = 0;
/// Longer names are replaced by a hash so a tag always fits nft's 255-byte
/// comment (container IDs have no length limit in the spec).
const MAX_NETWORK: usize = 64;
const MAX_CONTAINER: usize = 128;

impl Attachment {
    pub fn new(network: &str, container_id: &str, ifname: &str) -> Attachment {
        Attachment {
            network: network.to_string(),
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
        }
    }

    /// `network/containerID/ifname`: none of the three may contain a '/'.
    pub(crate) fn tag(&self) -> String {
        format!(
            "{}{}/{}",
            network_prefix(&self.network),
            part(&self.container_id, MAX_CONTAINER),
            self.ifname
        )
    }
}

/// The tag prefix shared by every attachment of `network` (for GC).
pub(crate) fn network_prefix(network: &str) -> String {
    format!("{}/", part(network, MAX_NETWORK))
}

/// Human words for a tag in error messages: "container c1 (eth0) of network n".
pub(crate) fn describe(tag: &str) -> String {
    let mut parts = tag.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(net), Some(id), Some(ifname)) => {
            format!("container {id} ({ifname}) of network {net}")
        }
        _ => format!("{tag:?}"),
    }
}

fn part(s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        format!("#{:016x}", fnv1a(s.as_bytes()))
    }
}

/// FNV-1a 64: stable across builds and versions (unlike std's hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The element userdata carrying `tag`: one comment TLV, NUL-terminated.
pub(crate) fn userdata(tag: &str) -> Vec<u8> {
    let len = u8::try_from(tag.len() + 1).unwrap_or(u8::MAX);
    let mut out = vec![UDATA_COMMENT, len];
    out.extend_from_slice(&tag.as_bytes()[..usize::from(len) - 1]);
    out.push(0);
    out
}

/// The tag in an element's userdata, if it has a comment TLV.
pub(crate) fn from_userdata(mut data: &[u8]) -> Option<String> {
    while let [kind, len, rest @ ..] = data {
        let value = rest.get(..usize::from(*len))?;
        if *kind == UDATA_COMMENT {
            let text = value.split(|b| *b == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        data = &rest[usize::from(*len)..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_round_trips_through_userdata() {
        let a = Attachment::new("net", "c1", "eth0");
        assert_eq!(a.tag(), "net/c1/eth0");
        assert_eq!(
            from_userdata(&userdata(&a.tag())).as_deref(),
            Some("net/c1/eth0")
        );
        assert!(a.tag().starts_with(&network_prefix("net")));
    }

    #[test]
    fn long_names_are_hashed_to_fit() {
        let a = Attachment::new(&"n".repeat(300), &"c".repeat(300), "eth0");
        assert!(a.tag().len() < 255, "{}", a.tag());
        assert!(a.tag().starts_with(&network_prefix(&"n".repeat(300))));
        assert_ne!(
            a.tag(),
            Attachment::new(&"n".repeat(300), "c", "eth0").tag()
        );
    }

    #[test]
    fn unknown_tlvs_are_skipped() {
        let mut ud = vec![7, 2, 1, 2];
        ud.extend(userdata("x/y/z"));
        assert_eq!(from_userdata(&ud).as_deref(), Some("x/y/z"));
        assert_eq!(from_userdata(&[0, 9, 1]), None);
    }

    #[test]
    fn describe_names_the_owner() {
        assert_eq!(describe("n/c/eth0"), "container c (eth0) of network n");
    }
}
