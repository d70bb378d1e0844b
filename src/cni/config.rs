//! The network configuration read from stdin. The raw JSON is kept whole so
//! delegation and chaining pass on every field, including ones we do not know.

use super::env::validate_network_name;
use super::error::{Code, Error};
use super::result::{CniResult, Dns};
use super::version::Version;
use ipamd::attachment::Attachment;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Clone)]
pub struct NetConf {
    /// Exactly the bytes the runtime sent; delegates receive these unchanged.
    pub bytes: Vec<u8>,
    /// The same, parsed; plugin-specific keys are read from here. Never changed
    /// after parsing: [`NetConf::typed`] reads a copy made from it once.
    pub raw: Map<String, Value>,
    pub version: Version,
    pub name: String,
    /// `ipam.type`, when an `ipam` object is present.
    pub ipam_type: Option<String>,
    /// `prevResult` converted to the current model, whatever layout it came in.
    pub prev_result: Option<CniResult>,
    /// `dns`: what the interface plugins report when it sets anything.
    pub dns: Dns,
    /// `raw` without its `null` members, made once for every [`NetConf::typed`]
    /// read of the call (a plugin reads its keys in more than one struct).
    without_nulls: std::sync::OnceLock<Value>,
}

/// One entry of `cni.dev/valid-attachments` (GC) as libcni spells it; the
/// network is the configuration's own.
#[derive(Deserialize)]
struct ValidEntry {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
}

impl NetConf {
    /// Decode stdin. Syntax errors are code 6; a bad `cniVersion` is code 1;
    /// bad values of known keys are code 7.
    pub fn parse(bytes: Vec<u8>) -> Result<NetConf, Error> {
        Self::parse_as(bytes, false)
    }

    /// Decode stdin for DEL. A DEL must not be blocked by input it cannot
    /// parse (runtimes stop at the first failing DEL and then cannot remove
    /// the pod), so an undecodable `prevResult` or `ipam` section is reported
    /// on stderr and left out; what identifies the attachment stays strict.
    pub fn parse_for_del(bytes: Vec<u8>) -> Result<NetConf, Error> {
        Self::parse_as(bytes, true)
    }

    fn parse_as(bytes: Vec<u8>, lenient: bool) -> Result<NetConf, Error> {
        let mut value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            Error::new(
                Code::Decode,
                format!("network configuration on stdin is not valid JSON: {e}"),
            )
        })?;
        super::gojson::canonicalize(&mut value);
        let Value::Object(raw) = value else {
            return Err(Error::new(
                Code::Decode,
                "network configuration on stdin must be a JSON object",
            ));
        };
        let version = parse_version(raw.get("cniVersion"))?;
        let name = optional_string(&raw, "name")?;
        if !name.is_empty() {
            validate_network_name(&name)
                .map_err(|why| Error::invalid_config(format!("network name {name:?} {why}")))?;
        }
        optional_string(&raw, "type")?;
        let ipam_type = tolerate(lenient, "ipam", ipam_type(&raw))?;
        let prev_result = match raw.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v) => tolerate(
                lenient,
                "prevResult",
                CniResult::from_canonical(v.clone())
                    .map(Some)
                    .map_err(|e| e.context("prevResult")),
            )?,
        };
        let dns = match raw.get("dns") {
            None | Some(Value::Null) => Dns::default(),
            Some(v) => tolerate(
                lenient,
                "dns",
                serde_json::from_value(without_nulls(v)).map_err(|e| {
                    Error::invalid_config(format!("dns {v} is not a DNS object: {e}"))
                }),
            )?,
        };
        Ok(NetConf {
            bytes,
            raw,
            version,
            name,
            ipam_type,
            prev_result,
            dns,
            without_nulls: std::sync::OnceLock::new(),
        })
    }

    /// Decode the plugin's own view of the config, a key whose value is `null`
    /// being one that is not there, as for Go's decoder (`raw` keeps them).
    /// Errors name the key path and the offending value, as code 7.
    pub fn typed<T: DeserializeOwned>(&self) -> Result<T, Error> {
        let value = self.without_nulls.get_or_init(|| {
            let mut value = Value::Object(self.raw.clone());
            super::gojson::drop_null_members(&mut value);
            value
        });
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            Error::invalid_config(format!(
                "invalid network configuration: key `{path}`: {}",
                e.inner()
            ))
        })
    }

    /// `runtimeConfig.<key>`, the capability arguments the runtime injected.
    pub fn runtime_config(&self, key: &str) -> Option<&Value> {
        self.raw
            .get("runtimeConfig")
            .and_then(|rc| rc.get(key))
            .filter(|v| !v.is_null())
    }

    /// `args.cni.<key>` (CONVENTIONS: per-attachment arguments in the config).
    pub fn args_cni(&self, key: &str) -> Option<&Value> {
        self.raw
            .get("args")
            .and_then(|a| a.get("cni"))
            .and_then(|c| c.get(key))
            .filter(|v| !v.is_null())
    }

    /// GC's list of this network's attachments still in use; `None` when
    /// neither key is present. A `null` list is an empty one: libcni marshals
    /// a node with no pod left (Go's nil slice) as `null`, and GC must then
    /// free everything of the network rather than nothing.
    pub fn valid_attachments(&self) -> Result<Option<Vec<Attachment>>, Error> {
        let list = self
            .raw
            .get("cni.dev/valid-attachments")
            .or_else(|| self.raw.get("cni.dev/attachments"));
        let entries: Vec<ValidEntry> = match list {
            None => return Ok(None),
            Some(Value::Null) => Vec::new(),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| Error::invalid_config(format!("cni.dev/valid-attachments: {e}")))?,
        };
        let list = entries
            .iter()
            .map(|e| Attachment::new(&self.name, &e.container_id, &e.ifname))
            .collect();
        Ok(Some(list))
    }
}

/// `ipam.type`, when an `ipam` object names one. An `ipam` with no type and
/// nothing else (`{}`, `{"type": ""}`) means no IPAM, as the reference
/// plugins read it; one with other keys but no type is a mistake worth
/// reporting rather than an L2-only attachment the user did not ask for.
fn ipam_type(raw: &Map<String, Value>) -> Result<Option<String>, Error> {
    match raw.get("ipam") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(ipam)) => match ipam.get("type") {
            Some(Value::String(t)) if !t.is_empty() => Ok(Some(t.clone())),
            None | Some(Value::String(_)) if ipam.keys().all(|k| k == "type") => Ok(None),
            other => Err(Error::invalid_config(format!(
                "ipam.type must be a non-empty string, got {}",
                other.map_or("nothing".to_string(), Value::to_string)
            ))),
        },
        Some(other) => Err(Error::invalid_config(format!(
            "ipam must be an object, got {other}"
        ))),
    }
}

/// `v` without its `null` members, to decode as Go would (see [`NetConf::typed`]).
pub fn without_nulls(v: &Value) -> Value {
    let mut v = v.clone();
    super::gojson::drop_null_members(&mut v);
    v
}

/// On DEL, a part of the input that cannot be decoded is reported and treated
/// as absent; otherwise it is the error it is.
fn tolerate<T: Default>(lenient: bool, what: &str, parsed: Result<T, Error>) -> Result<T, Error> {
    match parsed {
        Err(e) if lenient => {
            eprintln!("DEL: ignoring {what} that cannot be decoded: {}", e.msg);
            Ok(T::default())
        }
        other => other,
    }
}

fn parse_version(v: Option<&Value>) -> Result<Version, Error> {
    match v {
        None | Some(Value::Null) => Ok(Version::DEFAULT),
        Some(Value::String(s)) if s.is_empty() => Ok(Version::DEFAULT),
        Some(Value::String(s)) => Version::parse(s).ok_or_else(|| {
            Error::new(
                Code::IncompatibleVersion,
                format!(
                    "CNI version {s:?} is not supported; supported versions are {}",
                    Version::all_joined()
                ),
            )
        }),
        Some(other) => Err(Error::invalid_config(format!(
            "cniVersion must be a string, got {other}"
        ))),
    }
}

fn optional_string(raw: &Map<String, Value>, key: &str) -> Result<String, Error> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(Error::invalid_config(format!(
            "{key} must be a string, got {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<NetConf, Error> {
        NetConf::parse(s.as_bytes().to_vec())
    }

    #[test]
    fn missing_version_is_0_2_0() {
        assert_eq!(
            parse(r#"{"name":"n","type":"bridge"}"#).unwrap().version,
            Version::V020
        );
    }

    #[test]
    fn error_codes() {
        assert_eq!(parse("{").unwrap_err().code, 6);
        assert_eq!(parse("[]").unwrap_err().code, 6);
        assert_eq!(parse(r#"{"cniVersion":"9.9.9"}"#).unwrap_err().code, 1);
        assert_eq!(parse(r#"{"cniVersion":1}"#).unwrap_err().code, 7);
        assert_eq!(
            parse(r#"{"cniVersion":"1.0.0","name":"../x"}"#)
                .unwrap_err()
                .code,
            7
        );
        for no_ipam in [r#"{}"#, r#"{"type":""}"#] {
            let conf = format!(r#"{{"cniVersion":"1.0.0","ipam":{no_ipam}}}"#);
            assert_eq!(parse(&conf).unwrap().ipam_type, None, "{conf}");
        }
        assert_eq!(
            parse(r#"{"cniVersion":"1.0.0","ipam":{"subnet":"10.1.0.0/24"}}"#)
                .unwrap_err()
                .code,
            7
        );
        assert_eq!(
            parse(r#"{"cniVersion":"1.0.0","prevResult":{"ips":3}}"#)
                .unwrap_err()
                .code,
            6
        );
    }

    #[test]
    fn typed_errors_name_key_and_value() {
        #[derive(Deserialize, Debug)]
        struct C {
            mtu: Option<u32>,
        }
        let ok = parse(r#"{"cniVersion":"1.0.0","mtu":1500}"#).unwrap();
        assert_eq!(ok.typed::<C>().unwrap().mtu, Some(1500));
        let conf = parse(r#"{"cniVersion":"1.0.0","mtu":"big"}"#).unwrap();
        let e = conf.typed::<C>().unwrap_err();
        assert_eq!(e.code, 7);
        assert!(
            e.msg.contains("`mtu`") && e.msg.contains("big"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn null_is_an_absent_key_to_typed_as_to_go() {
        #[derive(Deserialize, Debug)]
        #[serde(rename_all = "camelCase")]
        struct C {
            #[serde(default = "cni0")]
            bridge: String,
            #[serde(default)]
            is_gateway: bool,
            #[serde(default)]
            vlan_trunk: Option<Vec<T>>,
            #[serde(default)]
            list: Vec<T>,
        }
        #[derive(Deserialize, Debug, PartialEq)]
        struct T {
            #[serde(default)]
            id: Option<u16>,
            #[serde(default)]
            mode: String,
        }
        fn cni0() -> String {
            "cni0".into()
        }
        let conf = parse(
            r#"{"cniVersion":"1.0.0","bridge":null,"isGateway":null,"vlanTrunk":null,
                "list":[{"id":null,"mode":null}],"dns":{"nameservers":null,"domain":"d"},
                "prevResult":{"ips":[{"address":"10.1.0.2/24","gateway":null,"interface":null}],
                              "routes":null,"dns":null}}"#,
        )
        .unwrap();
        let c: C = conf.typed().unwrap();
        assert_eq!((c.bridge.as_str(), c.is_gateway), ("cni0", false));
        assert!(c.vlan_trunk.is_none());
        assert_eq!(
            c.list,
            [T {
                id: None,
                mode: String::new()
            }]
        );
        assert_eq!(conf.dns.domain, "d");
        let prev = conf.prev_result.as_ref().unwrap();
        assert_eq!((prev.ips[0].gateway, prev.ips[0].interface), (None, None));
        // The raw view keeps what was sent.
        assert!(conf.raw["bridge"].is_null());
        // A null list element is not absent: Go makes it a zero value; here
        // it stays an error rather than an entry nobody wrote.
        let conf = parse(r#"{"cniVersion":"1.0.0","list":[null]}"#).unwrap();
        assert_eq!(conf.typed::<C>().unwrap_err().code, 7);
    }

    #[test]
    fn unknown_fields_survive() {
        let conf = parse(r#"{"cniVersion":"1.0.0","name":"n","x-vendor":{"a":1}}"#).unwrap();
        assert_eq!(conf.raw["x-vendor"]["a"], 1);
    }

    #[test]
    fn attachments_both_keys() {
        let a = parse(r#"{"cni.dev/attachments":[{"containerID":"c","ifname":"eth0"}]}"#).unwrap();
        assert_eq!(a.valid_attachments().unwrap().unwrap()[0].container_id, "c");
        let b = parse(r#"{"cni.dev/valid-attachments":[]}"#).unwrap();
        assert_eq!(b.valid_attachments().unwrap(), Some(vec![]));
        // What libcni sends for a node with no pod left.
        let null = r#"{"cni.dev/valid-attachments":null,"cni.dev/attachments":null}"#;
        assert_eq!(
            parse(null).unwrap().valid_attachments().unwrap(),
            Some(vec![])
        );
        assert_eq!(parse("{}").unwrap().valid_attachments().unwrap(), None);
    }
}
