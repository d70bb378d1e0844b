//! dhcp: the reference IPAM plugin that takes the pod's address from the LAN's DHCP
//! server. The plugin process only asks the lease daemon (`dhcp daemon`, socket
//! `/run/cni/dhcp.sock` or `ipam.daemonSocketPath`), which acquires the lease inside the
//! pod's netns and keeps it until DEL (see `crate::dhcp`). Keys as the reference v1.9.1:
//! `daemonSocketPath`, `provide`, `request`, `priority`; and cnikit's `ipv4` (default
//! true) and `ipv6` (default false): `"ipv6": true` has the daemon lease an IPv6 address
//! too, by DHCPv6 (IA_NA), which the reference cannot (containernetworking/plugins#720).
//!
//! Unlike the reference, DEL and GC succeed when the daemon is not running (nothing can
//! be released, and a pod must stay removable; the daemon forgets a lease whose pod is
//! gone when it next starts), the result carries the LAN's DNS, and STATUS and GC exist.

use super::gc_valid_attachments;
use crate::cni::config::without_nulls;
use crate::cni::{CniResult, Code, Error, IpConfig, Plugin, Request, Route};
use crate::dhcp::lease::Terms;
use crate::dhcp::options::{self, ProvideOption, RequestOption};
use crate::dhcp::service::{self, Families, Response};
use crate::dhcp::v6::lease::Terms6;
use crate::dhcp::DEFAULT_SOCKET;
use ipamd::client::{Daemon, Failure};
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `dhcp` plugin.
pub struct Dhcp;

/// The `ipam` keys.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct IpamConf {
    #[serde(rename = "daemonSocketPath")]
    daemon_socket_path: String,
    provide: Vec<ProvideOption>,
    request: Vec<RequestOption>,
    priority: i64,
    /// cnikit: lease an IPv4 address (DHCPv4); absent: true, as the reference.
    ipv4: Option<bool>,
    /// cnikit: lease an IPv6 address too (DHCPv6, IA_NA).
    ipv6: bool,
}

impl IpamConf {
    /// The families to lease; neither is a config error.
    fn families(&self) -> Result<Families, Error> {
        let f = Families {
            v4: self.ipv4.unwrap_or(true),
            v6: self.ipv6,
        };
        if !f.v4 && !f.v6 {
            return Err(Error::invalid_config(
                "ipam (dhcp): \"ipv4\": false needs \"ipv6\": true (an IPv6-only pod); \
                 as it is, the pod would get no address",
            ));
        }
        Ok(f)
    }
}

/// How long the plugin waits for the daemon: longer than the daemon's own bound on an
/// acquisition (`-resendtimeout`, 208 s by default), which decides when ADD gives up.
const ANSWER_WAIT: Duration = Duration::from_secs(240);

impl Plugin for Dhcp {
    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = load(req)?;
        let priority = route_priority(conf.priority)?;
        let client_id = options::client_id(req.container_id(), &req.conf.name, req.ifname());
        let options =
            options::client_options(client_id, &conf.provide, &conf.request, &req.env.args)?;
        let families = conf.families()?;
        let netns = absolute(req.netns())?;
        let asked = service::Request::Acquire {
            attachment: req.attachment(),
            netns,
            options,
            families,
        };
        match call(&socket_of(&conf), &asked)? {
            Some(Response::Granted { terms, terms6 })
                if terms.is_some() == families.v4 && terms6.is_some() == families.v6 =>
            {
                Ok(result_of(terms.as_deref(), terms6.as_deref(), priority))
            }
            Some(other) => Err(unexpected(&other)),
            None => Err(no_daemon(&socket_of(&conf), Code::TryAgainLater)),
        }
    }

    // ---------------------------------------------------------------- CHECK
    /// The daemon holds the lease, it is in force, and its address is on the interface.
    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = load(req)?;
        let asked = service::Request::Check {
            attachment: req.attachment(),
        };
        match call(&socket_of(&conf), &asked)? {
            Some(_) => Ok(()),
            None => Err(no_daemon(&socket_of(&conf), Code::TryAgainLater)),
        }
    }

    // ---------------------------------------------------------------- DEL
    fn del(&self, req: &Request) -> Result<(), Error> {
        let socket = req.conf_or_del_fallback(
            |r| load(r).map(|c| socket_of(&c)),
            |_| PathBuf::from(DEFAULT_SOCKET),
        )?;
        let asked = service::Request::Release {
            attachment: req.attachment(),
        };
        if call(&socket, &asked)?.is_none() {
            eprintln!(
                "dhcp: {}; nothing released",
                no_daemon(&socket, Code::TryAgainLater)
            );
        }
        Ok(())
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        let socket = socket_of(&load(req)?);
        match call(&socket, &service::Request::Status) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(no_daemon(&socket, Code::NotAvailable)),
            Err(e) => Err(Error::new(Code::NotAvailable, e.to_string())),
        }
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        let socket = socket_of(&load(req)?);
        let asked = service::Request::Gc {
            network: req.conf.name.clone(),
            valid: gc_valid_attachments(req)?,
        };
        match call(&socket, &asked)? {
            Some(Response::Collected { released }) if released > 0 => {
                eprintln!("dhcp: GC released {released} lease(s) of {}", req.conf.name);
            }
            Some(_) => {}
            None => eprintln!(
                "dhcp: {}; nothing collected",
                no_daemon(&socket, Code::TryAgainLater)
            ),
        }
        Ok(())
    }
}

fn load(req: &Request) -> Result<IpamConf, Error> {
    let Some(ipam) = req.conf.raw.get("ipam").filter(|v| !v.is_null()) else {
        return Err(Error::invalid_config("dhcp needs an \"ipam\" section"));
    };
    serde_json::from_value(without_nulls(ipam))
        .map_err(|e| Error::invalid_config(format!("ipam (dhcp): {e}")))
}

fn socket_of(conf: &IpamConf) -> PathBuf {
    match conf.daemon_socket_path.as_str() {
        "" => PathBuf::from(DEFAULT_SOCKET),
        p => PathBuf::from(p),
    }
}

/// `priority` as the reference applies it: to every route, when not 0.
fn route_priority(priority: i64) -> Result<Option<u32>, Error> {
    match u32::try_from(priority) {
        Ok(0) => Ok(None),
        Ok(p) => Ok(Some(p)),
        Err(_) => Err(Error::invalid_config(format!(
            "ipam.priority {priority}: a route metric is from 0 to {}",
            u32::MAX
        ))),
    }
}

/// The daemon runs elsewhere: the netns path must not depend on our working directory.
fn absolute(netns: &str) -> Result<PathBuf, Error> {
    if netns.is_empty() {
        return Err(Error::new(Code::InvalidEnv, "ADD needs CNI_NETNS"));
    }
    std::path::absolute(netns)
        .map_err(|e| Error::new(Code::InvalidEnv, format!("CNI_NETNS {netns}: {e}")))
}

/// One request to the daemon: `None` when no daemon answers at `socket`.
fn call(socket: &Path, req: &service::Request) -> Result<Option<Response>, Error> {
    let daemon = Daemon::new(socket).with_timeouts(Duration::from_secs(2), ANSWER_WAIT);
    match daemon.call::<service::Dhcp>(req) {
        None => Ok(None),
        Some(Ok(resp)) => Ok(Some(resp)),
        Some(Err(Failure::Service(e))) => Err(e.into()),
        Some(Err(Failure::Other(why))) => Err(Error::new(Code::TryAgainLater, why)),
    }
}

fn no_daemon(socket: &Path, code: Code) -> Error {
    Error::new(
        code,
        format!(
            "no DHCP daemon answers at {}: start it with `systemctl enable --now cnikit-dhcp.socket` \
             (the Debian package's unit), or run `/opt/cni/bin/dhcp daemon` as root",
            socket.display()
        ),
    )
}

fn unexpected(resp: &Response) -> Error {
    Error::new(
        Code::Internal,
        format!("the DHCP daemon answered ADD with {resp:?}"),
    )
}

/// The leases as a CNI result: the IPv4 address with its gateway, then the IPv6 address
/// (a /128, no gateway: DHCPv6 names no router, router advertisements do); the IPv4
/// routes (with `priority` when set); the LAN's DNS of both.
fn result_of(terms: Option<&Terms>, terms6: Option<&Terms6>, priority: Option<u32>) -> CniResult {
    let mut result = CniResult::default();
    if let Some(t) = terms {
        result.routes = t
            .routes
            .iter()
            .map(|r| {
                let mut route = Route::new(IpNet::V4(r.dst), Some(IpAddr::V4(r.gw)));
                route.scope = r.scope;
                route.priority = priority;
                route
            })
            .collect();
        result.ips.push(IpConfig {
            address: IpNet::V4(t.address),
            gateway: t.gateway.map(IpAddr::V4),
            interface: None,
        });
        result.dns = t.dns.clone();
    }
    if let Some(t) = terms6 {
        result.ips.push(IpConfig {
            address: IpNet::V6(t.address),
            gateway: None,
            interface: None,
        });
        let dns = &mut result.dns;
        for n in &t.dns.nameservers {
            if !dns.nameservers.contains(n) {
                dns.nameservers.push(n.clone());
            }
        }
        for n in &t.dns.search {
            if !dns.search.contains(n) {
                dns.search.push(n.clone());
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_zero_is_unset_and_negative_is_refused() {
        assert_eq!(route_priority(0).unwrap(), None);
        assert_eq!(route_priority(10).unwrap(), Some(10));
        assert_eq!(
            route_priority(-1).unwrap_err().code,
            Code::InvalidConfig as u32
        );
    }

    /// Runtimes decode and send keys as Go does: any case matches.
    #[test]
    fn keys_get_go_matching() {
        use crate::cni::gojson::{assert_known, canonicalize, struct_fields};
        assert_known(&[
            struct_fields::<IpamConf>(),
            struct_fields::<ProvideOption>(),
            struct_fields::<RequestOption>(),
        ]);
        let mut ipam = serde_json::json!({
            "DaemonSocketPath": "/tmp/d.sock",
            "Provide": [{"Option": "host-name", "FromArg": "K8S_POD_NAME"}],
            "REQUEST": [{"SkipDefault": true, "Option": "121"}],
            "Priority": 5
        });
        canonicalize(&mut ipam);
        let conf: IpamConf = serde_json::from_value(ipam).unwrap();
        assert_eq!(socket_of(&conf), PathBuf::from("/tmp/d.sock"));
        assert_eq!(conf.provide[0].from_arg, "K8S_POD_NAME");
        assert!(conf.request[0].skip_default);
        assert_eq!(conf.priority, 5);
    }

    #[test]
    fn ipv4_only_by_default_and_not_neither() {
        let conf = |v: serde_json::Value| serde_json::from_value::<IpamConf>(v).unwrap();
        assert_eq!(
            conf(serde_json::json!({})).families().unwrap(),
            Families::default()
        );
        let v6only = conf(serde_json::json!({"ipv4": false, "ipv6": true}));
        assert_eq!(
            v6only.families().unwrap(),
            Families {
                v4: false,
                v6: true
            }
        );
        let e = conf(serde_json::json!({"ipv4": false}))
            .families()
            .unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig as u32);
    }

    #[test]
    fn conf_keys() {
        let conf: IpamConf = serde_json::from_value(serde_json::json!({
            "type": "dhcp",
            "daemonSocketPath": "/tmp/d.sock",
            "provide": [{"option": "host-name", "fromArg": "K8S_POD_NAME"}],
            "request": [{"skipDefault": true, "option": "121"}],
            "priority": 5,
            "ipv6": true
        }))
        .unwrap();
        assert_eq!(conf.families().unwrap(), Families { v4: true, v6: true });
        assert_eq!(socket_of(&conf), PathBuf::from("/tmp/d.sock"));
        assert_eq!(conf.provide[0].from_arg, "K8S_POD_NAME");
        assert!(conf.request[0].skip_default);
        assert_eq!(conf.priority, 5);
    }
}
