//! firewall: lets a pod's forwarded traffic through the host's firewall
//! (connections the pod opens, and their replies), chained after an
//! interface plugin; `ingressPolicy` `same-bridge` / `isolated` keep
//! bridges apart. The result is `prevResult` unchanged. Where the rules go
//! (the host's iptables-nft tables or ours) is `firewall::forward`'s call.

use crate::cni::env::validate_ifname;
use crate::cni::{CniResult, Code, Error, Plugin, Request};
use crate::firewall::forward::{Forget, Op, Spec};
use crate::firewall::{Gc, Isolation, DEFAULT_ADMIN_CHAIN};
use crate::plugins::firewall_backend::{FirewallBackend, FirewallConf};
use serde::Deserialize;
use std::net::IpAddr;
use std::path::PathBuf;

pub struct FirewallPlugin {
    pub firewall: FirewallBackend,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    /// "iptables" or empty (Podman 4.3 writes `""`); "firewalld" is refused;
    /// anything else means the automatic choice, as in the reference.
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    iptables_admin_chain_name: Option<String>,
    /// Only meaningful to the firewalld backend; accepted.
    #[serde(default)]
    firewalld_zone: Option<String>,
    /// "open" (default), "same-bridge" or "isolated".
    #[serde(default)]
    ingress_policy: Option<String>,
    /// The ipamd daemon that applies the firewall changes (see firewall/service.rs).
    #[serde(default)]
    daemon_socket: Option<PathBuf>,
}

impl FirewallConf for Conf {
    fn daemon_socket(&self) -> Option<&std::path::Path> {
        self.daemon_socket.as_deref()
    }
}

/// The longest chain name iptables takes (XT_EXTENSION_MAXNAMELEN - 1).
const MAX_CHAIN_NAME: usize = 28;

impl Conf {
    fn load(req: &Request) -> Result<Conf, Error> {
        let c: Conf = req.conf.typed()?;
        match c.backend.as_deref() {
            None | Some("") | Some("iptables") => {}
            Some("firewalld") => {
                // Refused rather than served from iptables: on a firewalld node,
                // firewalld's own forward chain would still drop the pod's traffic
                // while ADD reported success.
                return Err(Error::new(
                    Code::UnsupportedField,
                    "backend \"firewalld\" is not supported by cnikit (it has no D-Bus client); \
                     use \"iptables\" or leave it empty: the rules then go into the host's \
                     iptables-nft tables (or cnikit's own nftables table)",
                ));
            }
            Some(other) => {
                // The reference makes its automatic choice for any other value
                // (`getBackend`), so configs written for it say "nftables" and work.
                eprintln!(
                    "firewall: backend {other:?} is not \"iptables\" or \"firewalld\"; \
                     choosing automatically, as the reference does"
                );
            }
        }
        c.ingress_policy()?;
        validate_chain(&c.admin_chain())?;
        if let Some(zone) = c.firewalld_zone.as_deref().filter(|z| !z.is_empty()) {
            eprintln!(
                "firewall: firewalldZone {zone:?} only applies to the firewalld backend; ignored"
            );
        }
        Ok(c)
    }

    /// DEL with a configuration `load` refuses: DEL goes by tag and only
    /// needs the daemon.
    fn del_fallback(req: &Request) -> Conf {
        Conf {
            daemon_socket: crate::plugins::conf_keys::daemon_socket_of(req),
            ..Conf::default()
        }
    }

    fn admin_chain(&self) -> String {
        match self.iptables_admin_chain_name.as_deref() {
            None | Some("") => DEFAULT_ADMIN_CHAIN.to_string(),
            Some(name) => name.to_string(),
        }
    }

    /// `Some(isolated)` for the two isolating policies, None for "open".
    fn ingress_policy(&self) -> Result<Option<bool>, Error> {
        match self.ingress_policy.as_deref() {
            None | Some("") | Some("open") => Ok(None),
            Some("same-bridge") => Ok(Some(false)),
            Some("isolated") => Ok(Some(true)),
            Some(other) => Err(Error::invalid_config(format!(
                "ingressPolicy {other:?} must be \"open\", \"same-bridge\" or \"isolated\""
            ))),
        }
    }

    /// What this attachment asks the firewall for, from `prev`.
    fn spec(&self, req: &Request, prev: &CniResult) -> Result<Spec, Error> {
        let isolation = match self.ingress_policy()? {
            None => None,
            Some(isolated) => Some(Isolation {
                bridge: bridge_of(prev, self.ingress_policy.as_deref().unwrap_or_default())?,
                isolated,
            }),
        };
        Ok(Spec {
            att: req.attachment(),
            addrs: prev
                .ips
                .iter()
                .map(|ip| ip.address.addr())
                .collect::<Vec<IpAddr>>(),
            admin_chain: self.admin_chain(),
            isolation,
        })
    }
}

/// An iptables chain name the admin chain may have.
fn validate_chain(name: &str) -> Result<(), Error> {
    let bad = |why: &str| {
        Err(Error::invalid_config(format!(
            "iptablesAdminChainName {name:?} {why}"
        )))
    };
    if name.len() > MAX_CHAIN_NAME {
        return bad(&format!("is longer than {MAX_CHAIN_NAME} bytes"));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic()) || name.starts_with(['-', '!']) {
        return bad("must be printable ASCII without spaces, not starting with '-' or '!'");
    }
    let reserved = [
        "ACCEPT", "DROP", "QUEUE", "RETURN", "FORWARD", "INPUT", "OUTPUT",
    ];
    if reserved.contains(&name) || name.starts_with("CNI-ISOLATION-STAGE-") || name == "CNI-FORWARD"
    {
        return bad("is a built-in target or a chain the plugin itself uses");
    }
    Ok(())
}

/// The bridge an isolating policy applies to: prevResult's first interface,
/// as the reference takes it (bridge reports itself first).
fn bridge_of(prev: &CniResult, policy: &str) -> Result<String, Error> {
    let bridge = prev
        .interfaces
        .first()
        .map(|i| i.name.clone())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Error::invalid_config(format!(
                "ingressPolicy {policy:?} needs the bridge as prevResult's first interface; \
                 chain firewall after bridge"
            ))
        })?;
    // It goes into iptables rules as `-i`/`-o`, which only take interface names.
    validate_ifname(&bridge).map_err(|why| {
        Error::invalid_config(format!("prevResult's first interface {bridge:?} {why}"))
    })?;
    Ok(bridge)
}

fn prev_result(req: &Request) -> Result<&CniResult, Error> {
    req.conf.prev_result.as_ref().ok_or_else(|| {
        Error::invalid_config("firewall must be chained after an interface plugin: no prevResult")
    })
}

impl Plugin for FirewallPlugin {
    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = Conf::load(req)?;
        let prev = prev_result(req)?;
        let spec = conf.spec(req, prev)?;
        self.firewall
            .for_call(req, &conf)
            .apply(Op::Add(spec).into())?;
        Ok(prev.clone())
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        let spec = conf.spec(req, prev_result(req)?)?;
        self.firewall
            .for_call(req, &conf)
            .apply(Op::Check(spec).into())
            .map_err(|e| Error::from(e).context("CHECK"))
    }

    // ---------------------------------------------------------------- DEL
    /// By tag: needs neither the netns nor prevResult. With a prevResult,
    /// the reference plugin's untagged rules of its addresses go too.
    fn del(&self, req: &Request) -> Result<(), Error> {
        let conf = req.conf_or_del_fallback(Conf::load, Conf::del_fallback)?;
        let prev = req.conf.prev_result.as_ref();
        let del = Forget {
            att: req.attachment(),
            addrs: prev.map_or_else(Vec::new, |p| {
                p.ips.iter().map(|ip| ip.address.addr()).collect()
            }),
        };
        self.firewall
            .for_call(req, &conf)
            .apply(Op::Del(del).into())?;
        Ok(())
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        Conf::load(req).map(drop)
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        let Some(valid) = req.conf.valid_attachments()? else {
            return Ok(());
        };
        let gc = Gc {
            network: req.conf.name.clone(),
            valid,
        };
        self.firewall
            .for_call(req, &conf)
            .apply(Op::Gc(gc).into())?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "firewall_tests.rs"]
mod tests;
