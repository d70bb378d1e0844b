//! portmap: host port → container port, chained after an interface plugin.
//! Mappings come from `runtimeConfig.portMappings`, container addresses from
//! `prevResult`; the result is `prevResult` unchanged. The nftables side
//! (maps, masquerade, ownership tags) is in `firewall::portmap`.

use super::portmap_marker;
use crate::cni::{CniResult, Code, Error, Plugin, Request};
use crate::firewall::conntrack::{self, UdpPort};
use crate::firewall::portmap::{Mapping, Masquerade, Op, Proto, Spec};
use crate::firewall::{Del, Firewall, Gc};
use crate::netlink::{self, sysctl, Netlink};
use crate::plugins::firewall_backend::{FirewallBackend, FirewallConf};
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;
use std::net::IpAddr;

pub struct Portmap {
    pub firewall: FirewallBackend,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    /// Masquerade hairpin and localhost connections (default true).
    #[serde(default = "yes")]
    snat: bool,
    #[serde(default)]
    masq_all: bool,
    /// Accepted for compatibility; cnikit needs no packet marks.
    #[serde(default)]
    mark_masq_bit: Option<i64>,
    /// Accepted for compatibility: "nftables" or "iptables" (we always use nftables).
    #[serde(default)]
    backend: Option<String>,
    #[serde(default, rename = "conditionsV4")]
    conditions_v4: Option<Vec<String>>,
    #[serde(default, rename = "conditionsV6")]
    conditions_v6: Option<Vec<String>>,
    /// The reference's iptables chain that decides on SNAT by marking; cnikit
    /// masquerades by `snat`/`masqAll` itself (a note says so).
    #[serde(default)]
    external_set_mark_chain: Option<String>,
    /// The ipamd daemon that applies the firewall changes (see firewall/service.rs).
    #[serde(default)]
    daemon_socket: Option<std::path::PathBuf>,
}

impl FirewallConf for Conf {
    fn daemon_socket(&self) -> Option<&std::path::Path> {
        self.daemon_socket.as_deref()
    }
}

fn yes() -> bool {
    true
}

impl Conf {
    fn load(req: &Request) -> Result<Conf, Error> {
        let c: Conf = req.conf.typed()?;
        if let Some(bit) = c.mark_masq_bit.filter(|b| !(0..=31).contains(b)) {
            return Err(Error::invalid_config(format!(
                "markMasqBit {bit} must be between 0 and 31"
            )));
        }
        match c.backend.as_deref() {
            None | Some("nftables") => {}
            Some("iptables") => {
                eprintln!("portmap: backend \"iptables\" requested; cnikit always uses nftables")
            }
            Some(other) => {
                return Err(Error::invalid_config(format!(
                    "backend {other:?} must be \"nftables\" or \"iptables\""
                )))
            }
        }
        // Empty strings add nothing to the reference's rules (`[""]` is no
        // condition); real ones are refused, as ignoring them would open the
        // ports wider than asked.
        for (key, list) in [
            ("conditionsV4", &c.conditions_v4),
            ("conditionsV6", &c.conditions_v6),
        ] {
            if let Some(list) = list.as_ref().filter(|l| l.iter().any(|c| !c.is_empty())) {
                return Err(Error::new(
                    Code::UnsupportedField,
                    format!("{key} {list:?} is not supported by cnikit's portmap yet"),
                ));
            }
        }
        if let Some(chain) = &c.external_set_mark_chain {
            eprintln!(
                "portmap: externalSetMarkChain {chain:?} is not used; cnikit masquerades by snat/masqAll itself"
            );
        }
        Ok(c)
    }

    /// DEL with a configuration `load` refuses: DEL only needs the daemon.
    fn del_fallback(req: &Request) -> Conf {
        Conf {
            daemon_socket: crate::plugins::conf_keys::daemon_socket_of(req),
            ..Conf::default()
        }
    }

    fn masquerade(&self) -> Masquerade {
        Masquerade {
            snat: self.snat,
            masq_all: self.masq_all,
        }
    }
}

impl Plugin for Portmap {
    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = Conf::load(req)?;
        let mappings = mappings(req)?;
        let prev = req.conf.prev_result.clone();
        if mappings.is_empty() {
            return Ok(prev.unwrap_or_default());
        }
        let prev = prev.ok_or_else(|| {
            Error::invalid_config(
                "portmap must be chained after an interface plugin: no prevResult",
            )
        })?;
        let container = container_addrs(&prev, req.ifname());
        if container.is_empty() {
            // The reference forwards nothing then, and succeeds.
            eprintln!(
                "portmap: prevResult has no IP address for interface {}; no ports mapped",
                req.ifname()
            );
            return Ok(prev);
        }
        if conf.snat {
            allow_localhost(&container)?;
        }
        let fw = self.firewall.for_call(req, &conf);
        fw.apply(
            Op::Add(Spec {
                att: req.attachment(),
                container: container.clone(),
                mappings: mappings.clone(),
                masq: conf.masquerade(),
            })
            .into(),
        )?;
        portmap_marker::set(req);
        flush_stale_udp(&*fw, &mappings, &container);
        Ok(prev)
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        let mappings = mappings(req)?;
        if mappings.is_empty() {
            return Ok(());
        }
        let prev = req
            .conf
            .prev_result
            .as_ref()
            .ok_or_else(|| Error::invalid_config("CHECK needs prevResult"))?;
        let container = container_addrs(prev, req.ifname());
        if container.is_empty() {
            // ADD mapped nothing (see there).
            return Ok(());
        }
        self.firewall.for_call(req, &conf).apply(
            Op::Check(Spec {
                att: req.attachment(),
                container,
                mappings,
                masq: conf.masquerade(),
            })
            .into(),
        )?;
        Ok(())
    }

    // ---------------------------------------------------------------- DEL
    /// With the mappings and prevResult again (what runtimes send), by the
    /// keys ADD made from them, so the cost does not grow with the pods on
    /// the node; otherwise by tag, which works without netns or prevResult,
    /// whatever the mappings say. A DEL without mappings does no firewall
    /// work (plugins#510) unless this attachment's ADD left a marker, i.e.
    /// the runtime forgot to pass its mappings again. Mappings that cannot be
    /// parsed count as some.
    fn del(&self, req: &Request) -> Result<(), Error> {
        let conf = req.conf_or_del_fallback(Conf::load, Conf::del_fallback)?;
        let mappings = mappings(req).map_err(|e| {
            eprintln!("DEL: {}; removing this attachment's mappings anyway", e.msg);
        });
        if mappings.as_ref().is_ok_and(Vec::is_empty) && !portmap_marker::is_set(req) {
            return Ok(());
        }
        let container = req
            .conf
            .prev_result
            .as_ref()
            .map(|prev| container_addrs(prev, req.ifname()))
            .filter(|addrs| !addrs.is_empty());
        let op = match (mappings, container) {
            (Ok(mappings), Some(container)) if !mappings.is_empty() => Op::DelKeys(Spec {
                att: req.attachment(),
                container,
                mappings,
                masq: conf.masquerade(),
            }),
            _ => Op::Del(Del {
                att: req.attachment(),
            }),
        };
        self.firewall.for_call(req, &conf).apply(op.into())?;
        portmap_marker::clear(req);
        Ok(())
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        Conf::load(req)?;
        Ok(())
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        let Some(valid) = req.conf.valid_attachments()? else {
            return Ok(());
        };
        self.firewall.for_call(req, &conf).apply(
            Op::Gc(Gc {
                network: req.conf.name.clone(),
                valid: valid.clone(),
            })
            .into(),
        )?;
        portmap_marker::gc(&req.conf.name, &valid);
        Ok(())
    }
}

/// `runtimeConfig.portMappings`; absent or null is no mappings.
fn mappings(req: &Request) -> Result<Vec<Mapping>, Error> {
    let Some(list) = req.conf.runtime_config("portMappings") else {
        return Ok(Vec::new());
    };
    let entries = list.as_array().ok_or_else(|| {
        Error::invalid_config(format!(
            "runtimeConfig.portMappings must be a list, got {list}"
        ))
    })?;
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            mapping(e).map_err(|why| {
                Error::invalid_config(format!("runtimeConfig.portMappings[{i}] {e}: {why}"))
            })
        })
        .collect()
}

fn mapping(e: &Value) -> Result<Mapping, String> {
    let port = |key: &str| -> Result<u16, String> {
        e.get(key)
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{key} must be a port number 1-65535"))
    };
    let text = |key: &str| e.get(key).and_then(Value::as_str).unwrap_or_default();
    let proto = match text("protocol").to_ascii_lowercase().as_str() {
        "" | "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        "sctp" => Proto::Sctp,
        other => return Err(format!("protocol {other:?} must be tcp, udp or sctp")),
    };
    let host_ip = match text("hostIP") {
        "" => None,
        ip => Some(
            ip.parse::<IpAddr>()
                .map_err(|_| format!("hostIP {ip:?} is not an IP address"))?,
        ),
    };
    Ok(Mapping {
        host_ip,
        host_port: port("hostPort")?,
        proto,
        container_port: port("containerPort")?,
    })
}

/// The first address of each family on the container interface
/// ([`CniResult::ips_on`]). Empty when none is there.
fn container_addrs(prev: &CniResult, ifname: &str) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = Vec::new();
    for ip in prev.ips_on(ifname) {
        let addr = ip.address;
        if !out
            .iter()
            .any(|a| a.addr().is_ipv4() == addr.addr().is_ipv4())
        {
            out.push(addr);
        }
    }
    out
}

/// Connections to 127.0.0.1:hostPort are DNATed out of the host interface
/// that leads to the container, which the kernel only allows with
/// route_localnet set on it (the reference plugin does the same). That
/// interface is the one of the kernel's route to the container, asked for
/// by one lookup as the reference does (`ip route get`): no route dump,
/// whose length grows with the node's pods.
fn allow_localhost(container: &[IpNet]) -> Result<(), Error> {
    let Some(v4) = container.iter().map(IpNet::addr).find(IpAddr::is_ipv4) else {
        return Ok(());
    };
    let mut nl = Netlink::open()?;
    let Some(oif) = nl.route_to(v4)?.and_then(|r| r.oif) else {
        return Ok(());
    };
    let Some(name) = netlink::link_name(oif)? else {
        return Ok(());
    };
    let key = format!("net/ipv4/conf/{name}/route_localnet");
    if sysctl::get(&key).ok().as_deref() != Some("1") {
        sysctl::set(&key, "1")?;
    }
    Ok(())
}

/// Best effort: a failure here leaves old flows stale until they time out,
/// which is no reason to fail the ADD (the reference plugin only logs too).
fn flush_stale_udp(fw: &dyn Firewall, mappings: &[Mapping], container: &[IpNet]) {
    let mut targets = Vec::new();
    for m in mappings.iter().filter(|m| m.proto == Proto::Udp) {
        let dst = m.host_ip.filter(|ip| !ip.is_unspecified());
        for ipv6 in container.iter().map(|net| net.addr().is_ipv6()) {
            if dst.is_none_or(|d| d.is_ipv6() == ipv6) {
                targets.push(UdpPort {
                    port: m.host_port,
                    dst,
                    ipv6,
                });
            }
        }
    }
    if targets.is_empty() {
        return;
    }
    if let Err(e) = fw.apply(conntrack::Op::FlushUdp { targets }.into()) {
        eprintln!("portmap: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_keys_get_go_matching() {
        use crate::cni::gojson::{assert_known, struct_fields};
        assert_known(&[struct_fields::<Conf>()]);
    }

    #[test]
    fn mapping_defaults_and_errors() {
        let m = mapping(&json!({"hostPort": 8080, "containerPort": 80})).unwrap();
        assert_eq!((m.proto, m.host_ip, m.host_port), (Proto::Tcp, None, 8080));
        let m = mapping(
            &json!({"hostPort": 1, "containerPort": 2, "protocol": "UDP", "hostIP": "::1"}),
        )
        .unwrap();
        assert_eq!(m.proto, Proto::Udp);
        assert!(m.host_ip.unwrap().is_ipv6());
        assert!(mapping(&json!({"hostPort": 0, "containerPort": 80})).is_err());
        assert!(mapping(&json!({"hostPort": 70000, "containerPort": 80})).is_err());
        assert!(mapping(&json!({"hostPort": 1, "containerPort": 80, "protocol": "icmp"})).is_err());
        assert!(mapping(&json!({"hostPort": 1, "containerPort": 80, "hostIP": "x"})).is_err());
    }

    #[test]
    fn container_addrs_first_per_family_on_the_container_iface() {
        let prev = CniResult::from_value(&json!({
            "interfaces": [{"name": "br0"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": [
                {"address": "10.0.0.9/24", "interface": 0},
                {"address": "10.1.0.2/24", "interface": 1},
                {"address": "10.1.0.3/24", "interface": 1},
                {"address": "fd00::2/64", "interface": 1}
            ]
        }))
        .unwrap();
        let got = container_addrs(&prev, "eth0");
        assert_eq!(
            got,
            vec![
                "10.1.0.2/24".parse().unwrap(),
                "fd00::2/64".parse().unwrap()
            ]
        );
        assert!(container_addrs(&prev, "eth1").is_empty());
    }

    #[test]
    fn container_addrs_keep_ips_without_a_usable_index() {
        // As the reference: an IP with no index, or one past `interfaces`,
        // counts even when other IPs name their interface.
        let prev = CniResult::from_value(&json!({
            "interfaces": [{"name": "br0"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": [
                {"address": "10.0.0.9/24", "interface": 0},
                {"address": "10.1.0.2/24"},
                {"address": "fd00::2/64", "interface": 7}
            ]
        }))
        .unwrap();
        let want: Vec<IpNet> = vec![
            "10.1.0.2/24".parse().unwrap(),
            "fd00::2/64".parse().unwrap(),
        ];
        assert_eq!(container_addrs(&prev, "eth0"), want);
        assert_eq!(container_addrs(&prev, "eth1"), want);
    }
}
