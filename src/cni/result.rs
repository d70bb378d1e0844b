//! One result model (the 1.1.0 shape) and its conversion to and from the
//! layout of every spec version. Plugins only ever see [`CniResult`].

use super::error::{Code, Error};
use super::version::Version;
use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Map, Value};
use std::net::IpAddr;

/// The `dns` object: ipamd's, which also fills it from a resolvConf file.
pub use ipamd::config::Dns;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub dns: Dns,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    #[serde(default, rename = "pciID", skip_serializing_if = "String::is_empty")]
    pub pci_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpConfig {
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`; producers may write -1 for "unknown".
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "interface_index"
    )]
    pub interface: Option<usize>,
}

/// A route of a result: the IPAM config's own type, since IPAM hands its configured routes
/// on unchanged (every `types.Route` field kept).
pub use ipamd::config::RouteSpec as Route;

fn interface_index<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let raw: Option<i64> = Option::deserialize(d)?;
    Ok(raw.and_then(|i| usize::try_from(i).ok()))
}

/// The pre-0.3.0 per-family block.
#[derive(Debug, Serialize, Deserialize)]
struct LegacyIp {
    ip: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<LegacyRoute>,
}

#[derive(Debug, Serialize, Deserialize)]
struct LegacyRoute {
    dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gw: Option<IpAddr>,
}

impl CniResult {
    /// Parse a result (a delegate's output or a `prevResult`) in any layout.
    pub fn from_value(v: &Value) -> Result<CniResult, Error> {
        let mut v = v.clone();
        super::gojson::canonicalize(&mut v);
        Self::from_canonical(v)
    }

    /// [`CniResult::from_value`] of a value whose keys are already
    /// canonical (a `prevResult` inside a canonicalised configuration).
    pub(crate) fn from_canonical(mut v: Value) -> Result<CniResult, Error> {
        // `"gateway": null` and the like are absent to Go's decoder, so to us.
        super::gojson::drop_null_members(&mut v);
        let decode = |e: serde_json::Error| {
            Error::new(Code::Decode, format!("cannot decode CNI result: {e}"))
        };
        let Some(obj) = v.as_object() else {
            return Err(Error::new(Code::Decode, "CNI result is not a JSON object"));
        };
        if obj.contains_key("ip4") || obj.contains_key("ip6") {
            return Self::from_legacy(obj).map_err(decode);
        }
        // 0.3.x/0.4.0 carry ips[].version; serde ignores it.
        serde_json::from_value(v).map_err(decode)
    }

    fn from_legacy(obj: &Map<String, Value>) -> serde_json::Result<CniResult> {
        let mut result = CniResult::default();
        for key in ["ip4", "ip6"] {
            let Some(block) = obj.get(key).filter(|b| !b.is_null()) else {
                continue;
            };
            let legacy: LegacyIp = serde_json::from_value(block.clone())?;
            result.ips.push(IpConfig {
                address: legacy.ip,
                gateway: legacy.gateway,
                interface: None,
            });
            result
                .routes
                .extend(legacy.routes.into_iter().map(|r| Route::new(r.dst, r.gw)));
        }
        if let Some(dns) = obj.get("dns").filter(|d| !d.is_null()) {
            result.dns = serde_json::from_value(dns.clone())?;
        }
        Ok(result)
    }

    /// The IPs of the pod's interface `ifname`, by the reference's rule: an IP
    /// counts unless its `interface` names an entry of `interfaces` that is not
    /// a sandbox interface called `ifname` (so IPs without an index, or with one
    /// out of range, count). A chain's result may list other plugins'
    /// interfaces, whose addresses a meta plugin must leave alone.
    pub fn ips_on<'a>(&'a self, ifname: &'a str) -> impl Iterator<Item = &'a IpConfig> + 'a {
        let elsewhere = move |i: usize| {
            self.interfaces
                .get(i)
                .is_some_and(|iface| iface.name != ifname || iface.sandbox.is_empty())
        };
        self.ips
            .iter()
            .filter(move |ip| !ip.interface.is_some_and(elsewhere))
    }

    /// Render in the layout of `version`, with `cniVersion` first.
    pub fn to_value(&self, version: Version) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.as_str()));
        if version.has_legacy_result() {
            self.write_legacy(&mut out);
        } else {
            self.write_current(version, &mut out);
        }
        Value::Object(out)
    }

    fn write_current(&self, version: Version, out: &mut Map<String, Value>) {
        let mut shaped = self.clone();
        if version < Version::V110 {
            shaped.strip_1_1_fields();
        }
        let Ok(Value::Object(body)) = serde_json::to_value(&shaped) else {
            return;
        };
        for (k, mut v) in body {
            if k == "ips" && version.tags_ip_version() {
                tag_ip_versions(&mut v);
            }
            out.insert(k, v);
        }
    }

    /// The interface fields 1.1.0 added. A route's (`mtu`, `advmss`,
    /// `priority`, `table`, `scope`) stay at every version: the reference
    /// plugins print them whatever the version (libcni's one Route type), a
    /// reader that does not know them skips them, and a route without its
    /// table or metric is a different route (CHECK, and the reference bridge
    /// applying a 1.0.0 result of ours, would get it wrong).
    fn strip_1_1_fields(&mut self) {
        for i in &mut self.interfaces {
            i.mtu = None;
            i.socket_path.clear();
            i.pci_id.clear();
        }
    }

    /// 0.1.0/0.2.0: first address of each family, routes by family, no interfaces.
    fn write_legacy(&self, out: &mut Map<String, Value>) {
        for (key, want_v4) in [("ip4", true), ("ip6", false)] {
            let Some(ip) = self
                .ips
                .iter()
                .find(|ip| ip.address.addr().is_ipv4() == want_v4)
            else {
                continue;
            };
            let block = LegacyIp {
                ip: ip.address,
                gateway: ip.gateway,
                routes: self
                    .routes
                    .iter()
                    .filter(|r| r.dst.addr().is_ipv4() == want_v4)
                    .map(|r| LegacyRoute {
                        dst: r.dst,
                        gw: r.gw,
                    })
                    .collect(),
            };
            if let Ok(v) = serde_json::to_value(block) {
                out.insert(key.into(), v);
            }
        }
        if let Ok(dns) = serde_json::to_value(&self.dns) {
            out.insert("dns".into(), dns);
        }
    }
}

/// 0.3.x/0.4.0: every `ips[]` entry starts with `"version": "4"|"6"`.
fn tag_ip_versions(ips: &mut Value) {
    let Some(list) = ips.as_array_mut() else {
        return;
    };
    for entry in list {
        let Some(obj) = entry.as_object_mut() else {
            continue;
        };
        let is_v4 = obj
            .get("address")
            .and_then(Value::as_str)
            .and_then(|a| a.parse::<IpNet>().ok())
            .is_some_and(|a| a.addr().is_ipv4());
        let mut tagged = Map::new();
        tagged.insert("version".into(), json!(if is_v4 { "4" } else { "6" }));
        tagged.extend(std::mem::take(obj));
        *obj = tagged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        serde_json::from_value(json!({
            "interfaces": [
                {"name": "cni0", "mac": "00:11:22:33:44:55"},
                {"name": "veth1", "mac": "00:11:22:33:44:66"},
                {"name": "eth0", "mac": "00:11:22:33:44:77", "sandbox": "/run/netns/c1", "mtu": 1500}
            ],
            "ips": [
                {"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2},
                {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2}
            ],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.1.0.1", "priority": 5},
                {"dst": "::/0"}
            ],
            "dns": {"nameservers": ["10.1.0.1"], "search": ["example.com"]}
        }))
        .unwrap()
    }

    #[test]
    fn to_1_1_0_keeps_new_fields() {
        let v = sample().to_value(Version::V110);
        assert_eq!(
            v,
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "cni0", "mac": "00:11:22:33:44:55"},
                    {"name": "veth1", "mac": "00:11:22:33:44:66"},
                    {"name": "eth0", "mac": "00:11:22:33:44:77", "mtu": 1500, "sandbox": "/run/netns/c1"}
                ],
                "ips": [
                    {"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2},
                    {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2}
                ],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1", "priority": 5}, {"dst": "::/0"}],
                "dns": {"nameservers": ["10.1.0.1"], "search": ["example.com"]}
            })
        );
    }

    #[test]
    fn to_1_0_0_drops_1_1_interface_fields_and_keeps_route_fields() {
        let v = sample().to_value(Version::V100);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(
            v["interfaces"][2],
            json!({"name": "eth0", "mac": "00:11:22:33:44:77", "sandbox": "/run/netns/c1"})
        );
        // As the reference prints them (one Route type for every version).
        assert_eq!(
            v["routes"][0],
            json!({"dst": "0.0.0.0/0", "gw": "10.1.0.1", "priority": 5})
        );
        assert_eq!(sample().to_value(Version::V040)["routes"][0]["priority"], 5);
        assert!(v["ips"][0].get("version").is_none());
    }

    #[test]
    fn to_0_3_x_and_0_4_0_tag_ip_versions_first() {
        for ver in [Version::V030, Version::V031, Version::V040] {
            let v = sample().to_value(ver);
            assert_eq!(v["cniVersion"], ver.as_str());
            assert_eq!(
                v["ips"],
                json!([
                    {"version": "4", "address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2},
                    {"version": "6", "address": "fd00::5/64", "gateway": "fd00::1", "interface": 2}
                ])
            );
            let text = serde_json::to_string(&v["ips"][0]).unwrap();
            assert!(text.starts_with(r#"{"version":"4""#), "{text}");
        }
    }

    #[test]
    fn to_0_2_0_and_0_1_0_legacy_blocks() {
        for ver in [Version::V010, Version::V020] {
            let v = sample().to_value(ver);
            assert_eq!(
                v,
                json!({
                    "cniVersion": ver.as_str(),
                    "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1",
                            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}]},
                    "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1", "routes": [{"dst": "::/0"}]},
                    "dns": {"nameservers": ["10.1.0.1"], "search": ["example.com"]}
                })
            );
        }
    }

    #[test]
    fn legacy_keeps_first_address_of_each_family() {
        let mut r = sample();
        r.ips.insert(
            1,
            IpConfig {
                address: "10.2.0.9/24".parse().unwrap(),
                gateway: None,
                interface: None,
            },
        );
        let v = r.to_value(Version::V020);
        assert_eq!(v["ip4"]["ip"], "10.1.0.5/16");
    }

    #[test]
    fn from_0_2_0_layout() {
        let r = CniResult::from_value(&json!({
            "cniVersion": "0.2.0",
            "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1",
                    "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}]},
            "ip6": {"ip": "fd00::5/64"},
            "dns": {"nameservers": ["10.1.0.1"]}
        }))
        .unwrap();
        assert_eq!(r.ips.len(), 2);
        assert_eq!(r.ips[0].address.to_string(), "10.1.0.5/16");
        assert_eq!(r.ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
        assert_eq!(r.ips[1].gateway, None);
        assert_eq!(
            r.routes,
            vec![Route::new(
                "0.0.0.0/0".parse().unwrap(),
                Some("10.1.0.1".parse().unwrap())
            )]
        );
        assert_eq!(r.dns.nameservers, vec!["10.1.0.1"]);
        assert!(r.interfaces.is_empty());
    }

    #[test]
    fn from_0_3_1_and_0_4_0_layout() {
        for ver in ["0.3.0", "0.3.1", "0.4.0"] {
            let r = CniResult::from_value(&json!({
                "cniVersion": ver,
                "interfaces": [{"name": "eth0", "sandbox": "/x"}],
                "ips": [{"version": "4", "address": "10.1.0.5/16", "interface": 0},
                        {"version": "6", "address": "fd00::5/64", "interface": -1}],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dns": {}
            }))
            .unwrap();
            assert_eq!(r.ips[0].interface, Some(0));
            assert_eq!(r.ips[1].interface, None);
            assert_eq!(r.interfaces[0].sandbox, "/x");
        }
    }

    #[test]
    fn from_1_x_round_trips() {
        for ver in [Version::V100, Version::V110] {
            let v = sample().to_value(ver);
            let back = CniResult::from_value(&v).unwrap();
            assert_eq!(back.to_value(ver), v);
        }
        // 0.4.0 → model → 0.4.0 is lossless too.
        let v = sample().to_value(Version::V040);
        assert_eq!(
            CniResult::from_value(&v).unwrap().to_value(Version::V040),
            v
        );
        // 0.2.0 → model → 0.2.0 as well.
        let v = sample().to_value(Version::V020);
        assert_eq!(
            CniResult::from_value(&v).unwrap().to_value(Version::V020),
            v
        );
    }

    #[test]
    fn garbage_is_a_decode_error() {
        for bad in [
            json!(3),
            json!({"ips": [{"address": "nope"}]}),
            json!({"ip4": {"ip": 5}}),
        ] {
            assert_eq!(CniResult::from_value(&bad).unwrap_err().code, 6);
        }
    }

    #[test]
    fn empty_result_still_prints_dns_object() {
        assert_eq!(
            CniResult::default().to_value(Version::V100),
            json!({"cniVersion": "1.0.0", "dns": {}})
        );
        let r = CniResult::from_value(&json!({"dns": {"domain": ""}})).unwrap();
        assert_eq!(
            r.to_value(Version::V100),
            json!({"cniVersion": "1.0.0", "dns": {}})
        );
    }

    #[test]
    fn result_fields_are_known_to_go_matching() {
        use crate::cni::gojson::{assert_known, struct_fields};
        assert_known(&[
            struct_fields::<CniResult>(),
            struct_fields::<Interface>(),
            struct_fields::<IpConfig>(),
            struct_fields::<Route>(),
            struct_fields::<Dns>(),
            struct_fields::<LegacyIp>(),
            struct_fields::<LegacyRoute>(),
        ]);
    }

    #[test]
    fn go_cased_prev_result_decodes() {
        let r = CniResult::from_value(&json!({
            "CNIVersion": "1.0.0",
            "Interfaces": [{"Name": "eth0", "Mac": "0a:58:00:00:00:01", "Sandbox": "/n"}],
            "IPs": [{"Address": "10.1.0.5/24", "Gateway": "10.1.0.1", "Interface": 0}],
            "Routes": [{"Dst": "0.0.0.0/0"}],
        }))
        .unwrap();
        assert_eq!(r.interfaces[0].sandbox, "/n");
        assert_eq!(r.ips[0].interface, Some(0));
        assert_eq!(r.routes.len(), 1);
    }
}
