//! Configuration keys several plugins read alike: `mtu`, interface names,
//! `dns`, the container MAC (from `runtimeConfig`, `args` or `CNI_ARGS`), and
//! `daemonSocket` for a DEL that cannot use the rest.

use crate::cni::{CniResult, Error, Request};
use serde_json::Value;

/// The smallest and largest MTU an Ethernet-like link takes (the kernel's
/// ETH_MIN_MTU and ETH_MAX_MTU).
const MTU_RANGE: std::ops::RangeInclusive<u32> = 68..=65535;

/// The `mtu` key: 0 means "not set", as in the reference's Go structs; any
/// other value outside what the kernel takes is refused here, before a link
/// is made, instead of coming back from the kernel half-way through ADD.
pub fn configured_mtu(mtu: Option<u32>) -> Result<Option<u32>, Error> {
    match mtu {
        None | Some(0) => Ok(None),
        Some(m) if MTU_RANGE.contains(&m) => Ok(Some(m)),
        Some(m) => Err(Error::invalid_config(format!(
            "mtu {m} must be between {} and {}",
            MTU_RANGE.start(),
            MTU_RANGE.end()
        ))),
    }
}

/// An interface name from the configuration (`master`, `bridge`, names made
/// from them) by the kernel's rules, before it reaches any kernel call: a
/// `%d` would make the kernel pick a fresh name, a NUL would cut it short,
/// and either would make DEL miss what ADD made (code 7, naming `key`).
pub fn config_ifname(key: &str, name: &str) -> Result<(), Error> {
    crate::cni::env::validate_ifname(name)
        .map_err(|why| Error::invalid_config(format!("{key} {name:?} {why}")))
}

/// The configuration's `dns`, when it sets anything, is the result's (the
/// reference interface plugins report it, and Podman writes it into the
/// container's resolv.conf); otherwise whatever IPAM returned.
pub fn with_configured_dns(req: &Request, mut result: CniResult) -> CniResult {
    if !req.conf.dns.is_empty() {
        result.dns = req.conf.dns.clone();
    }
    result
}

/// The container MAC requested by the runtime, in the order of precedence the
/// reference uses: `runtimeConfig.mac` (capability), `args.cni.mac`, `CNI_ARGS MAC=`.
/// An empty value is not set, and the next one counts, as in the reference.
pub fn requested_mac(req: &Request) -> Result<Option<String>, Error> {
    let from_conf = |v: &Value, key: &'static str| -> Result<Option<(String, &str)>, Error> {
        match v.as_str() {
            Some(s) => Ok(Some((s.to_string(), key))),
            None => Err(Error::invalid_config(format!(
                "{key} must be a string, got {v}"
            ))),
        }
    };
    let candidates = [
        req.conf
            .runtime_config("mac")
            .map(|v| from_conf(v, "runtimeConfig.mac"))
            .transpose()?
            .flatten(),
        req.conf
            .args_cni("mac")
            .map(|v| from_conf(v, "args.cni.mac"))
            .transpose()?
            .flatten(),
        req.args.get("MAC").map(|m| (m.to_string(), "CNI_ARGS MAC")),
    ];
    let chosen = candidates
        .into_iter()
        .flatten()
        .find(|(m, _)| !m.is_empty());
    chosen.map(|(m, key)| validate_mac(&m, key)).transpose()
}

/// A MAC in any form Go's `net.ParseMAC` reads — `0a:58:0a:00:00:05`,
/// `0A-58-0A-00-00-05`, `0a58.0a00.0005` — as lower-case `0a:58:0a:00:00:05`,
/// the form the kernel reports. `net.ParseMAC` also reads 8- and 20-byte
/// addresses (EUI-64, InfiniBand); an Ethernet link cannot take those, so they
/// are refused here by name rather than by the kernel half-way through ADD.
pub fn validate_mac(mac: &str, key: &str) -> Result<String, Error> {
    let bytes = parse_mac(mac).ok_or_else(|| {
        Error::invalid_config(format!(
            "{key} {mac:?} is not a MAC address like 0a:58:0a:00:00:05"
        ))
    })?;
    if bytes.len() != 6 {
        return Err(Error::invalid_config(format!(
            "{key} {mac:?} is a {}-byte hardware address (EUI-64 or InfiniBand); an Ethernet link takes a 6-byte MAC",
            bytes.len()
        )));
    }
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(hex.join(":"))
}

/// `net.ParseMAC`'s grammar: 6, 8 or 20 bytes, as two-digit groups separated
/// by one of `:` or `-` throughout, or as four-digit groups separated by `.`.
fn parse_mac(s: &str) -> Option<Vec<u8>> {
    let byte = |pair: &str| {
        (pair.len() == 2 && pair.bytes().all(|c| c.is_ascii_hexdigit()))
            .then(|| u8::from_str_radix(pair, 16).ok())
            .flatten()
    };
    let sep = s.chars().find(|c| matches!(c, ':' | '-' | '.'))?;
    let width = if sep == '.' { 4 } else { 2 };
    let mut bytes = Vec::new();
    for group in s.split(sep) {
        if group.len() != width || !group.is_ascii() {
            return None;
        }
        for i in (0..width).step_by(2) {
            bytes.push(byte(&group[i..i + 2])?);
        }
    }
    matches!(bytes.len(), 6 | 8 | 20).then_some(bytes)
}

/// `daemonSocket` when it is a string, for a DEL whose configuration is
/// otherwise unusable.
pub fn daemon_socket_of(req: &Request) -> Option<std::path::PathBuf> {
    let path = req.conf.raw.get("daemonSocket")?.as_str()?;
    Some(path.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::args::CniArgs;
    use crate::plugins::firewall_backend::test_request;
    use serde_json::json;

    #[test]
    fn macs_in_every_form_go_reads_come_out_lower_case_with_colons() {
        for mac in [
            "0a:58:0a:00:00:05",
            "0A:58:0A:00:00:05",
            "0a-58-0a-00-00-05",
            "0a58.0a00.0005",
            "0A58.0A00.0005",
        ] {
            assert_eq!(validate_mac(mac, "mac").unwrap(), "0a:58:0a:00:00:05");
        }
        for bad in [
            "0a:58:0a:00:00",
            "0a:58:0a:00:00:05:",
            "0a:58-0a:00:00:05",
            "0a5:80a:000:05",
            "0a580a000005",
            "0a58:0a00:0005",
            "0a.58.0a.00.00.05",
            "0g:58:0a:00:00:05",
            " 0a:58:0a:00:00:05",
            "0a:58:0a:00:00:é5",
        ] {
            let e = validate_mac(bad, "runtimeConfig.mac").unwrap_err();
            assert_eq!(e.code, 7, "{bad}");
            assert!(e.msg.contains("runtimeConfig.mac"), "{bad}: {}", e.msg);
        }
        // EUI-64 and InfiniBand addresses parse, but no Ethernet link takes one.
        let ib = "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01";
        for long in ["02:00:5e:10:00:00:00:01", "0200.5e10.0000.0001", ib] {
            let e = validate_mac(long, "mac").unwrap_err();
            assert!(
                e.msg.contains("6-byte") && e.msg.contains("mac"),
                "{long}: {}",
                e.msg
            );
        }
    }

    #[test]
    fn an_empty_requested_mac_is_not_set_and_the_next_one_counts() {
        let req = |extra: serde_json::Value, env: &str| {
            let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge"});
            conf.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let mut r = test_request(crate::cni::Command::Add, conf);
            r.args = CniArgs::parse(env).unwrap();
            requested_mac(&r)
        };
        let none = json!({"runtimeConfig": {"mac": ""}, "args": {"cni": {"mac": ""}}});
        assert_eq!(req(none.clone(), "MAC=").unwrap(), None);
        assert_eq!(
            req(none, "MAC=0A-58-0A-00-00-07").unwrap().as_deref(),
            Some("0a:58:0a:00:00:07")
        );
        let args = json!({"runtimeConfig": {"mac": ""}, "args": {"cni": {"mac": "0a580a000006"}}});
        assert!(req(args, "").is_err(), "a bad value still counts");
        let args =
            json!({"runtimeConfig": {"mac": ""}, "args": {"cni": {"mac": "0a58.0a00.0006"}}});
        assert_eq!(
            req(args, "MAC=0a:58:0a:00:00:07").unwrap().as_deref(),
            Some("0a:58:0a:00:00:06")
        );
        let first =
            json!({"runtimeConfig": {"mac": "0a:58:0a:00:00:05"}, "args": {"cni": {"mac": ""}}});
        assert_eq!(
            req(first, "MAC=0a:58:0a:00:00:07").unwrap().as_deref(),
            Some("0a:58:0a:00:00:05")
        );
    }
}
