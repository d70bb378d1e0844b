//! Who owns an entry. Every element cnikit adds carries its attachment's tag
//! in the element userdata, encoded as the comment TLV nft itself uses, so DEL
//! and GC find exactly their entries with nothing else to go on (no netns, no
//! prevResult), and `nft list ruleset` shows whose entry it is.

pub use ipamd::attachment::Attachment;

/// NFTNL_UDATA_SET_ELEM_COMMENT: the TLV type nft prints as `comment "…"`.
const UDATA_COMMENT: u8 = 0;

/// The tag prefix shared by every attachment of `network` (for GC).
pub(crate) fn network_prefix(network: &str) -> String {
    Attachment::tag_prefix(network)
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

/// Firewall requests spell an attachment's fields in snake_case
/// (`{"network", "container_id", "ifname"}`), unlike the lease API; these keep
/// that wire format: `#[serde(with = "tag::snake")]`, and `tag::snake_list`
/// for a list.
pub(crate) mod snake {
    use super::Attachment;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(remote = "Attachment")]
    struct Snake {
        network: String,
        container_id: String,
        ifname: String,
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct Wrap(#[serde(with = "Snake")] pub(super) Attachment);

    pub fn serialize<S: Serializer>(a: &Attachment, s: S) -> Result<S::Ok, S::Error> {
        Snake::serialize(a, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Attachment, D::Error> {
        Snake::deserialize(d)
    }
}

/// [`snake`] for a list of attachments.
pub(crate) mod snake_list {
    use super::snake::Wrap;
    use super::Attachment;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(list: &[Attachment], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(list.iter().map(|a| Wrap(a.clone())))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Attachment>, D::Error> {
        let list = Vec::<Wrap>::deserialize(d)?;
        Ok(list.into_iter().map(|w| w.0).collect())
    }
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
    fn firewall_wire_spells_fields_in_snake_case() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Op {
            #[serde(with = "snake")]
            att: Attachment,
            #[serde(with = "snake_list")]
            valid: Vec<Attachment>,
        }
        let op = Op {
            att: Attachment::new("n", "c1", "eth0"),
            valid: vec![Attachment::new("n", "c2", "eth1")],
        };
        let text = serde_json::to_string(&op).unwrap();
        assert_eq!(
            text,
            r#"{"att":{"network":"n","container_id":"c1","ifname":"eth0"},"valid":[{"network":"n","container_id":"c2","ifname":"eth1"}]}"#
        );
        assert_eq!(serde_json::from_str::<Op>(&text).unwrap(), op);
    }

    #[test]
    fn describe_names_the_owner() {
        assert_eq!(describe("n/c/eth0"), "container c (eth0) of network n");
    }
}
