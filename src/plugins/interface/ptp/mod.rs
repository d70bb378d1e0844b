//! ptp: a veth pair per pod and no bridge. The pod reaches everything, its
//! own subnet too, through the gateway address on the host end; the host
//! reaches the pod by a host route. Keys and behaviour follow the reference
//! plugin; see docs/plugins/ptp.md.

use crate::cni::{CniResult, Command, Error, Interface, Plugin, Request};
use crate::firewall::Firewall;
use crate::netlink::{NetNs, Netlink, VethPair};
use crate::plugins::conf_keys::{configured_mtu, daemon_socket_of, with_configured_dns};
use crate::plugins::firewall_backend::{FirewallBackend, FirewallConf};
use crate::plugins::ipam_delegation::{ipam_add, ipam_if_configured, ipam_rollback_on_error};
use crate::plugins::link_owner;
use crate::plugins::masquerade::{self, MasqKeys};
use crate::plugins::pod_interface::{
    address_iface, create_pod_veth, find_container_link_as_made, route_iface, Ipv6Setup,
    LinkLocalOff,
};
use crate::plugins::pod_netns::{open_netns, OwnLink};
use routing::{enable_forwarding, hops, prepare_host_end, route_host, route_pod, settle_ipv6, Hop};
use serde::Deserialize;
use std::path::{Path, PathBuf};

mod routing;
#[cfg(test)]
mod tests;

/// The plugin's name in the aliases of the host veths it owns (see link_owner).
const PLUGIN: &str = "ptp";

pub struct Ptp {
    pub firewall: FirewallBackend,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    /// `ipMasq`, `ipMasqBackend`, `ipMasqExclude`: read on their own by `load` (serde's
    /// flatten would lose the key's name from a type error's message).
    #[serde(skip)]
    masq: MasqKeys,
    #[serde(default)]
    mtu: Option<u32>,
    /// The ipamd daemon that applies ipMasq (see firewall/backend.rs).
    #[serde(default)]
    daemon_socket: Option<PathBuf>,
}

impl FirewallConf for Conf {
    fn daemon_socket(&self) -> Option<&Path> {
        self.daemon_socket.as_deref()
    }
}

impl Conf {
    fn load(req: &Request) -> Result<Conf, Error> {
        let mut c: Conf = req.conf.typed()?;
        c.masq = req.conf.typed()?;
        // 0 means "not set" in the reference's Go struct; kind sends none, others 0.
        c.mtu = configured_mtu(c.mtu)?;
        if req.conf.ipam_type.is_none() {
            return Err(Error::invalid_config(
                "ptp needs IPAM: the configuration has no ipam.type",
            ));
        }
        Ok(c)
    }

    /// DEL with a configuration `load` refuses: remove whatever masquerade
    /// entries the attachment may own (a removal of nothing is harmless).
    fn del_fallback(req: &Request) -> Conf {
        Conf {
            masq: MasqKeys::del_fallback(),
            daemon_socket: daemon_socket_of(req),
            ..Conf::default()
        }
    }
}

impl Plugin for Ptp {
    // reads_cni_args: false, as the reference, which never decodes CNI_ARGS
    // (its IPAM plugin reads them by its own rule).

    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = Conf::load(req)?;
        conf.masq.check_backend(PLUGIN, req)?;
        // Held to the end of the call (its netfilter sockets; see bridge).
        let fw = self.firewall.for_call(req, &conf);
        let ns = open_netns(req.netns())?;
        let mut host = Netlink::open()?;
        let mut cont = Netlink::open_in(&ns)?;

        let mut result = ipam_add(req)?;
        let result = ipam_rollback_on_error(req, || {
            let hops = hops(&result)?;
            enable_forwarding(&hops)?;
            // Every address is the container interface's, interfaces[1].
            for ip in &mut result.ips {
                ip.interface = Some(1);
            }
            let (host_name, pair) =
                create_pod_veth((&mut host, &mut cont), req, &ns, conf.mtu, None, None)?;
            // From here on a failure removes the veth (both ends go together).
            let mut pod = Pod {
                req,
                ns: &ns,
                host: &mut host,
                cont: &mut cont,
                pair,
                host_name,
            };
            pod.wire(&conf, &*fw, &hops, result).inspect_err(|_| {
                if let Err(e) = pod.host.delete_link(pair.host_index) {
                    eprintln!("cleanup after failed ADD: {e}");
                }
            })
        })?;
        Ok(with_configured_dns(req, result))
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        let Some(prev) = req.conf.prev_result.clone() else {
            return Err(Error::invalid_config("ptp: CHECK needs prevResult"));
        };
        ipam_if_configured(req, Command::Check)?;
        let mut found = find_container_link_as_made(req, &prev, "veth")?;
        found.check_iface_state(&prev)?;
        routing::check_pod_routes(&mut found.nl, &prev, found.pos)?;
        masquerade::check_if_on(&self.firewall, (req, &conf), &conf.masq, &prev)
    }

    // ---------------------------------------------------------------- DEL
    fn del(&self, req: &Request) -> Result<(), Error> {
        // Never fail DEL on kernel state that is gone, nor on a config it cannot use.
        let conf = req.conf_or_del_fallback(Conf::load, Conf::del_fallback)?;
        let fw = self.firewall.for_call(req, &conf);
        let rules = || match conf.masq.ip_masq {
            true => masquerade::del(&*fw, req, &conf.masq.ip_masq_exclude),
            false => Ok(()),
        };
        // The veth, with the gateway address and host route on its host end.
        let ours = OwnLink {
            kind: "veth",
            bridge: None,
            owner: None,
        };
        link_owner::del_veth_attachment(req, rules, ours)
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        Conf::load(req)?;
        ipam_if_configured(req, Command::Status)
    }

    // ---------------------------------------------------------------- GC
    /// The stale veths go before IPAM frees the addresses routed to them.
    fn gc(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        link_owner::gc_stale_veths(req, PLUGIN, || match masquerade::gc_request(req) {
            Ok(Some(gc)) => masquerade::gc(&*self.firewall.for_call(req, &conf), gc),
            other => other.map(drop),
        })
    }
}

/// One ADD's freshly made veth and the sockets on both sides of it.
struct Pod<'a> {
    req: &'a Request,
    ns: &'a NetNs,
    host: &'a mut Netlink,
    cont: &'a mut Netlink,
    pair: VethPair,
    host_name: String,
}

impl Pod<'_> {
    /// Everything after the veth exists: both ends addressed and routed,
    /// the result's interfaces, ipMasq.
    fn wire(
        &mut self,
        conf: &Conf,
        fw: &dyn Firewall,
        hops: &[Hop],
        mut result: CniResult,
    ) -> Result<CniResult, Error> {
        let (req, pair) = (self.req, self.pair);
        prepare_host_end(&self.host_name, &pair, hops)?;
        let alias = link_owner::alias(PLUGIN, &req.attachment());
        // The pod's end is still down: the kernel's link-local address can go off in
        // the request that brings this end up (see set_up_with_alias).
        self.host.set_up_with_alias(pair.host_index, &alias, true)?;
        // In the pod: addresses, ptp's routes, then IPAM's routes, which may
        // go via a gateway only ptp's own routes make reachable. The pod's end comes
        // up second, but dormant: its link-local address goes off in its up request
        // too (see LinkLocalOff::WithUp).
        let v6 = Ipv6Setup {
            mac: Some(&pair.peer_mac()),
            link_local_off: LinkLocalOff::WithUp,
            ..Ipv6Setup::default()
        };
        address_iface(
            self.ns,
            self.cont,
            pair.peer_index,
            req.ifname(),
            &result,
            v6,
        )?;
        settle_ipv6(self.cont, pair.peer_index, hops)?;
        route_pod(self.cont, pair.peer_index, hops)?;
        route_iface(self.cont, pair.peer_index, &result)?;
        route_host(self.host, &pair, hops)?;
        result.interfaces = self.interfaces();
        if conf.masq.ip_masq {
            masquerade::add(fw, req, &result, &conf.masq.ip_masq_exclude)?;
        }
        Ok(result)
    }

    /// Result interfaces in the reference order: host veth, container, with the MACs
    /// known from the create (no read-back).
    fn interfaces(&self) -> Vec<Interface> {
        vec![
            Interface {
                name: self.host_name.clone(),
                mac: self.pair.host_mac(),
                ..Default::default()
            },
            Interface {
                name: self.req.ifname().to_string(),
                mac: self.pair.peer_mac(),
                sandbox: self.req.netns().to_string(),
                ..Default::default()
            },
        ]
    }
}
