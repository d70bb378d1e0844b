//! The options a pod's client sends: its identifier, the `provide` options and the
//! parameter request list made of `request`, as the reference v1.9.1 makes them
//! (`prepareOptions`, `generateClientID`), so a node switching from the reference's
//! daemon keeps its pods' identities at the server.

use super::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Option codes the client itself uses.
pub const SUBNET_MASK: u8 = 1;
pub const ROUTER: u8 = 3;
pub const DNS_SERVERS: u8 = 6;
pub const DOMAIN_NAME: u8 = 15;
pub const STATIC_ROUTES: u8 = 33;
pub const CLIENT_IDENTIFIER: u8 = 61;
pub const DOMAIN_SEARCH: u8 = 119;
pub const CLASSLESS_ROUTES: u8 = 121;

/// What the pod's client sends besides the message itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientOptions {
    /// Option 61's value: type 0 and the text `containerID/network/ifname`.
    pub client_id: Vec<u8>,
    /// The `provide` options in order; a later one of the same code replaces an earlier
    /// one, and one of code 61 replaces the identifier.
    pub provide: Vec<(u8, Vec<u8>)>,
    /// Option 55 (parameter request list); not sent when empty.
    pub request: Vec<u8>,
}

/// One entry of `ipam.provide`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ProvideOption {
    pub option: String,
    pub value: String,
    #[serde(rename = "fromArg")]
    pub from_arg: String,
}

/// One entry of `ipam.request`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RequestOption {
    pub option: String,
    #[serde(rename = "skipDefault")]
    pub skip_default: bool,
}

/// The options asked for unless a `request` entry says `skipDefault`. The reference asks
/// for the router and the mask; the name servers, domain and search list are asked for
/// too, so the result can carry the LAN's DNS (they change no route).
const DEFAULT_REQUEST: [u8; 5] = [ROUTER, SUBNET_MASK, DNS_SERVERS, DOMAIN_NAME, DOMAIN_SEARCH];

/// The names the reference accepts besides numbers (dhcp-options(5) names).
const NAMES: [(&str, u8); 6] = [
    ("dhcp-client-identifier", CLIENT_IDENTIFIER),
    ("subnet-mask", SUBNET_MASK),
    ("routers", ROUTER),
    ("host-name", 12),
    ("user-class", 77),
    ("vendor-class-identifier", 60),
];

/// The identifier of one attachment: `containerID/network/ifname`, cut at 254 bytes (an
/// option holds 255, one of them the type).
pub fn client_id(container_id: &str, network: &str, ifname: &str) -> Vec<u8> {
    let mut text = format!("{container_id}/{network}/{ifname}").into_bytes();
    text.truncate(254);
    let mut value = Vec::with_capacity(text.len() + 1);
    value.push(0);
    value.extend(text);
    value
}

/// An option given by name or by number (0–255).
pub fn option_code(option: &str) -> Result<u8> {
    if let Some((_, code)) = NAMES.iter().find(|(name, _)| *name == option) {
        return Ok(*code);
    }
    option.parse::<u8>().map_err(|_| {
        let names: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
        Error::new(
            ErrorKind::Invalid,
            format!(
                "DHCP option {option:?}: neither a number from 0 to 255 nor one of {}",
                names.join(", ")
            ),
        )
    })
}

/// The client options of one attachment. `cni_args` is `CNI_ARGS` as the runtime sent it
/// (`K=V;K=V`), read for `fromArg`.
pub fn client_options(
    client_id: Vec<u8>,
    provide: &[ProvideOption],
    request: &[RequestOption],
    cni_args: &str,
) -> Result<ClientOptions> {
    let args: Vec<(&str, &str)> = cni_args
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .collect();
    let arg = |key: &str| args.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v);
    let mut provided = Vec::new();
    for p in provide {
        let code = option_code(&p.option)?;
        if !p.value.is_empty() {
            provided.push((code, bounded(&p.option, &p.value, "its value")?));
        }
        if let Some(value) = arg(&p.from_arg) {
            let source = format!("CNI_ARGS {}", p.from_arg);
            provided.push((code, bounded(&p.option, value, &source)?));
        }
    }
    let mut asked = Vec::new();
    for r in request.iter().filter(|r| !r.option.is_empty()) {
        asked.push(option_code(&r.option)?);
    }
    if !request.iter().any(|r| r.skip_default) {
        asked.extend(DEFAULT_REQUEST);
    }
    let mut seen = [false; 256];
    asked.retain(|&c| !std::mem::replace(&mut seen[usize::from(c)], true));
    Ok(ClientOptions {
        client_id,
        provide: provided,
        request: asked,
    })
}

fn bounded(option: &str, value: &str, source: &str) -> Result<Vec<u8>> {
    if value.len() > 255 {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "DHCP option {option:?}: {source} is {} bytes long; an option holds at most 255",
                value.len()
            ),
        ));
    }
    Ok(value.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_id_is_the_references_text_cut_at_254_bytes() {
        assert_eq!(client_id("c1", "net", "eth0"), b"\0c1/net/eth0".to_vec());
        let long = "x".repeat(300);
        let id = client_id(&long, "net", "eth0");
        assert_eq!(id.len(), 255);
        assert_eq!(id[0], 0);
    }

    #[test]
    fn names_and_numbers() {
        assert_eq!(option_code("host-name").unwrap(), 12);
        assert_eq!(option_code("121").unwrap(), 121);
        let e = option_code("256").unwrap_err();
        assert!(e.message.contains("0 to 255"), "{e}");
        assert!(option_code("domain-name").is_err());
    }

    #[test]
    fn provide_values_and_cni_args_in_order() {
        let provide = [
            ProvideOption {
                option: "host-name".into(),
                value: "fixed".into(),
                from_arg: "K8S_POD_NAME".into(),
            },
            ProvideOption {
                option: "60".into(),
                from_arg: "MISSING".into(),
                ..Default::default()
            },
        ];
        let o =
            client_options(vec![0], &provide, &[], "IgnoreUnknown=1;K8S_POD_NAME=web-0").unwrap();
        assert_eq!(
            o.provide,
            vec![(12, b"fixed".to_vec()), (12, b"web-0".to_vec())]
        );
        assert_eq!(o.request, DEFAULT_REQUEST.to_vec());
    }

    #[test]
    fn request_list_skip_default_and_duplicates() {
        let req = |option: &str, skip: bool| RequestOption {
            option: option.into(),
            skip_default: skip,
        };
        let o = client_options(
            vec![0],
            &[],
            &[req("121", false), req("routers", false)],
            "",
        )
        .unwrap();
        assert_eq!(o.request, vec![121, ROUTER, SUBNET_MASK, 6, 15, 119]);
        let o = client_options(vec![0], &[], &[req("", true), req("121", false)], "").unwrap();
        assert_eq!(o.request, vec![121]);
        let o = client_options(vec![0], &[], &[req("", true)], "").unwrap();
        assert!(o.request.is_empty());
    }

    #[test]
    fn an_overlong_value_is_refused() {
        let provide = [ProvideOption {
            option: "host-name".into(),
            value: "x".repeat(256),
            ..Default::default()
        }];
        let e = client_options(vec![0], &provide, &[], "").unwrap_err();
        assert!(e.message.contains("256 bytes"), "{e}");
    }
}
