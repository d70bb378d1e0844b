//! JSON object keys matched the way Go's `encoding/json` matches them.
//!
//! Runtimes and the reference plugins are written in Go, whose decoder binds an
//! object key to a struct field case-insensitively, preferring an exact match.
//! Runtimes rely on that: containerd's go-cni has no JSON tags on its capability
//! structs, so `runtimeConfig.portMappings` arrives as `{"HostPort": 8080, …}`.
//!
//! Everything cnikit decodes from a runtime (the network configuration with its
//! `args`, `runtimeConfig` and `prevResult`, delegates' results, conflists) is
//! passed through [`canonicalize`] once, before any field is read: every object
//! key that case-insensitively equals a key cnikit knows is rewritten to the
//! known spelling. Plugins, the IPAM parser and the serde structs then read exact
//! keys only. The raw bytes handed on to delegates are never rewritten.

use serde_json::{Map, Value};

/// Every object key cnikit reads, at any depth, spelled as the CNI spec and the
/// reference plugins spell them. Sorted (checked by a test) for binary search.
/// A plugin's config struct whose fields are missing here would silently lose
/// Go's matching; `tests::*_fields_are_known` in each plugin guard that.
pub const KEYS: &[&str] = &[
    "address",
    "addresses",
    "advmss",
    "aliases",
    "allmulti",
    "args",
    "backend",
    "bandwidth",
    "bcqueuelen",
    "bridge",
    "capabilities",
    "cni",
    "cniVersion",
    "cniVersions",
    "conditionsV4",
    "conditionsV6",
    "containerID",
    "containerPort",
    "daemonSocket",
    "daemonSocketPath",
    "dataDir",
    "device",
    "deviceID",
    "disableCheck",
    "disableContainerInterface",
    "disableGC",
    "dns",
    "domain",
    "dst",
    "egressBurst",
    "egressRate",
    "enabledad",
    "externalSetMarkChain",
    "firewalldZone",
    "forceAddress",
    "fromArg",
    "gateway",
    "group",
    "gw",
    "hairpinMode",
    "hostIP",
    "hostPort",
    "hwaddr",
    "id",
    "ifname",
    "ingressBurst",
    "ingressPolicy",
    "ingressRate",
    "interface",
    "interfaces",
    "ip",
    "ip4",
    "ip6",
    "ipMasq",
    "ipMasqBackend",
    "ipMasqExclude",
    "ipRanges",
    "ipam",
    "ips",
    "iptablesAdminChainName",
    "ipv4",
    "ipv6",
    "isDefaultGateway",
    "isGateway",
    "kernelpath",
    "linkInContainer",
    "logFile",
    "mac",
    "macspoofchk",
    "markMasqBit",
    "masqAll",
    "master",
    "maxID",
    "minID",
    "mode",
    "mtu",
    "multiQueue",
    "name",
    "nameservers",
    "option",
    "options",
    "owner",
    "pciBusID",
    "pciID",
    "plugins",
    "pool",
    "pools",
    "portIsolation",
    "portMappings",
    "preserveDefaultVlan",
    "prevResult",
    "priority",
    "promisc",
    "promiscMode",
    "protocol",
    "provide",
    "rangeEnd",
    "rangeStart",
    "ranges",
    "request",
    "resolvConf",
    "routes",
    "runtimeConfig",
    "sandbox",
    "scope",
    "search",
    "selinuxContext",
    "skipDefault",
    "snat",
    "socket",
    "socketPath",
    "subnet",
    "sysctl",
    "table",
    "txQLen",
    "type",
    "value",
    "version",
    "vlan",
    "vlanId",
    "vlanTrunk",
    "vrfname",
];

/// Rewrite, at every depth, each object key that is not one of [`KEYS`] but
/// equals one case-insensitively, to that key. Between several spellings of
/// one key the exact one is kept, otherwise the last one in the object. Go
/// instead decodes every spelling into the field in turn (the last wins, two
/// objects for a struct field merge), which needs the field's type to follow;
/// an object that spells one key twice is malformed either way. Keys
/// matching nothing are kept as they are.
pub fn canonicalize(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.keys().any(|k| needs_rewrite(k)) {
                *map = canonical_object(std::mem::take(map));
            }
            map.values_mut().for_each(canonicalize);
        }
        Value::Array(items) => items.iter_mut().for_each(canonicalize),
        _ => {}
    }
}

/// Remove, at every depth (objects inside lists included), each object member
/// whose value is `null`. Go's decoder leaves a field alone when its value is
/// `null`: a plain field keeps its default, a pointer stays nil, both what an
/// absent key gives; serde would instead refuse `null` for every field that is
/// not an `Option`. List elements are kept, null or not: leaving one out
/// would shift the others. Only for decoding into structs: where `null` has a
/// meaning of its own (GC's `cni.dev/valid-attachments`) the raw value is read.
pub fn drop_null_members(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_null_members);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_null_members),
        _ => {}
    }
}

/// The known spelling of `key`, if `key` matches one under Go's rule.
pub fn known_key(key: &str) -> Option<&'static str> {
    if let Ok(i) = KEYS.binary_search(&key) {
        return Some(KEYS[i]);
    }
    KEYS.iter().copied().find(|k| equal_fold(k, key))
}

/// The value of known key `key` in `object`: the exact spelling if present,
/// otherwise the last spelling that matches it (as [`canonicalize`] keeps).
/// For the few keys read before (or without) canonicalizing the whole input.
pub fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    debug_assert_eq!(known_key(key), Some(key), "{key} is not in KEYS");
    object.get(key).or_else(|| {
        object
            .iter()
            .filter(|(k, _)| equal_fold(k, key))
            .map(|(_, v)| v)
            .next_back()
    })
}

fn needs_rewrite(key: &str) -> bool {
    KEYS.binary_search(&key).is_err() && known_key(key).is_some()
}

fn canonical_object(map: Map<String, Value>) -> Map<String, Value> {
    let exact: Vec<&'static str> = map
        .keys()
        .filter_map(|k| KEYS.binary_search(&k.as_str()).ok().map(|i| KEYS[i]))
        .collect();
    let mut out = Map::with_capacity(map.len());
    for (key, value) in map {
        match known_key(&key) {
            // A folded spelling of a key that is also present exactly: Go
            // ignores it for the field, and so does every reader here.
            Some(known) if known != key && exact.contains(&known) => {
                out.insert(key, value);
            }
            Some(known) => {
                out.insert(known.to_string(), value);
            }
            None => {
                out.insert(key, value);
            }
        }
    }
    out
}

/// Go's `bytes.EqualFold`: equal under Unicode simple case folding, so the
/// Kelvin sign matches `k` and the long s matches `s`, as they do for Go.
fn equal_fold(a: &str, b: &str) -> bool {
    let mut bs = b.chars();
    for ca in a.chars() {
        let Some(cb) = bs.next() else { return false };
        if ca != cb && !fold_eq(ca, cb) {
            return false;
        }
    }
    bs.next().is_none()
}

fn fold_eq(a: char, b: char) -> bool {
    a.to_lowercase().eq(b.to_lowercase()) || a.to_uppercase().eq(b.to_uppercase())
}

/// The field names a serde-derived struct reads, for tests that check a
/// config struct's keys are all in [`KEYS`].
#[cfg(test)]
pub fn struct_fields<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Probe;
    #[derive(Debug)]
    struct Fields(&'static [&'static str]);
    impl std::fmt::Display for Fields {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "fields")
        }
    }
    impl std::error::Error for Fields {}
    impl de::Error for Fields {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Fields(&[])
        }
    }
    impl<'de> de::Deserializer<'de> for Probe {
        type Error = Fields;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Fields> {
            Err(Fields(&[]))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Fields> {
            Err(Fields(fields))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    match T::deserialize(Probe) {
        Err(Fields(f)) => f,
        Ok(_) => &[],
    }
}

/// Test helper: every field of these structs must be a known key.
#[cfg(test)]
pub fn assert_known(fields: &[&[&str]]) {
    for key in fields.concat() {
        assert_eq!(
            known_key(key),
            Some(key),
            "{key} is missing from gojson::KEYS"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(mut v: Value) -> Value {
        canonicalize(&mut v);
        v
    }

    #[test]
    fn keys_are_sorted_and_distinct_under_folding() {
        assert!(KEYS.windows(2).all(|w| w[0] < w[1]), "KEYS must be sorted");
        for (i, a) in KEYS.iter().enumerate() {
            for b in &KEYS[i + 1..] {
                assert!(!equal_fold(a, b), "{a} and {b} fold to the same key");
            }
        }
    }

    #[test]
    fn go_cni_port_mappings() {
        let v = canon(json!({"runtimeConfig": {"portMappings": [
            {"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}
        ]}}));
        assert_eq!(
            v["runtimeConfig"]["portMappings"][0],
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""})
        );
    }

    #[test]
    fn go_cni_ip_ranges_and_bandwidth() {
        let v = canon(json!({"RuntimeConfig": {
            "IPRanges": [[{"Subnet": "10.1.0.0/16", "RangeStart": "10.1.0.10",
                           "RangeEnd": "10.1.0.20", "Gateway": "10.1.0.1"}]],
            "Bandwidth": {"IngressRate": 1, "IngressBurst": 2, "EgressRate": 3, "EgressBurst": 4},
        }}));
        let rc = &v["runtimeConfig"];
        assert_eq!(
            rc["ipRanges"][0][0],
            json!({"subnet": "10.1.0.0/16", "rangeStart": "10.1.0.10",
                   "rangeEnd": "10.1.0.20", "gateway": "10.1.0.1"})
        );
        assert_eq!(
            rc["bandwidth"],
            json!({"ingressRate": 1, "ingressBurst": 2, "egressRate": 3, "egressBurst": 4})
        );
    }

    #[test]
    fn dns_mac_ips_aliases_and_args() {
        let v = canon(json!({
            "DNS": {"Nameservers": ["10.0.0.53"], "Domain": "d", "Search": ["s"], "Options": ["o"]},
            "runtimeConfig": {"MAC": "0a:58:00:00:00:01", "IPs": ["10.1.0.5/24"],
                              "Aliases": {"net": ["a"]}},
            "Args": {"CNI": {"IPs": ["10.1.0.6"], "Mac": "0a:58:00:00:00:02"}},
        }));
        assert_eq!(
            v["dns"],
            json!({"nameservers": ["10.0.0.53"], "domain": "d", "search": ["s"], "options": ["o"]})
        );
        assert_eq!(v["runtimeConfig"]["mac"], "0a:58:00:00:00:01");
        assert_eq!(v["runtimeConfig"]["ips"][0], "10.1.0.5/24");
        assert_eq!(v["runtimeConfig"]["aliases"]["net"][0], "a");
        assert_eq!(v["args"]["cni"]["ips"][0], "10.1.0.6");
        assert_eq!(v["args"]["cni"]["mac"], "0a:58:00:00:00:02");
    }

    #[test]
    fn prev_result_and_config_keys() {
        let v = canon(json!({
            "CNIVersion": "1.0.0", "Name": "n", "Type": "bridge", "IsGateway": true,
            "IPAM": {"Type": "ipamd", "Ranges": [[{"Subnet": "10.9.0.0/24"}]], "DataDir": "/d"},
            "PrevResult": {"Interfaces": [{"Name": "eth0", "Sandbox": "/n"}],
                           "IPs": [{"Address": "10.9.0.2/24", "Interface": 0}]},
        }));
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["isGateway"], true);
        assert_eq!(v["ipam"]["ranges"][0][0]["subnet"], "10.9.0.0/24");
        assert_eq!(v["ipam"]["dataDir"], "/d");
        assert_eq!(v["prevResult"]["interfaces"][0]["sandbox"], "/n");
        assert_eq!(v["prevResult"]["ips"][0]["address"], "10.9.0.2/24");
    }

    #[test]
    fn exact_match_wins_over_folded_in_either_order() {
        for v in [
            json!({"HostPort": 1, "hostPort": 2}),
            json!({"hostPort": 2, "HostPort": 1}),
        ] {
            assert_eq!(canon(v)["hostPort"], 2);
        }
    }

    #[test]
    fn last_folded_spelling_wins_without_an_exact_one() {
        let v = canon(json!({"HostPort": 1, "HOSTPORT": 2}));
        assert_eq!(v, json!({"hostPort": 2}));
    }

    #[test]
    fn unknown_keys_and_order_are_kept() {
        let v = canon(json!({"X-Vendor": {"Foo": 1}, "MTU": 1400, "zeta": 0}));
        assert_eq!(
            v.to_string(),
            r#"{"X-Vendor":{"Foo":1},"mtu":1400,"zeta":0}"#
        );
    }

    #[test]
    fn field_prefers_the_exact_key_then_the_last_folded_one() {
        let exact = json!({"LOGFILE": "/a", "logFile": "/b", "logfile": "/c"});
        assert_eq!(
            field(exact.as_object().unwrap(), "logFile"),
            Some(&json!("/b"))
        );
        let folded = json!({"LOGFILE": "/a", "logfile": "/c"});
        assert_eq!(
            field(folded.as_object().unwrap(), "logFile"),
            Some(&json!("/c"))
        );
        assert_eq!(field(&Map::new(), "logFile"), None);
    }

    #[test]
    fn null_members_go_at_every_depth_list_elements_stay() {
        let mut v = json!({"a": null, "b": {"c": null, "d": 1},
            "e": [null, {"f": null, "g": [null]}], "h": false});
        drop_null_members(&mut v);
        assert_eq!(
            v,
            json!({"b": {"d": 1}, "e": [null, {"g": [null]}], "h": false})
        );
    }

    #[test]
    fn unicode_simple_folding_like_go() {
        // U+212A KELVIN SIGN folds to k, U+017F LATIN SMALL LETTER LONG S to s.
        assert_eq!(known_key("\u{212A}ind"), None);
        assert_eq!(known_key("ma\u{017F}ter"), Some("master"));
        assert_eq!(known_key("bac\u{212A}end"), Some("backend"));
        assert_eq!(known_key("mast"), None);
    }
}
