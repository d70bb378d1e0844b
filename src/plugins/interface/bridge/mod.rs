//! bridge: a veth pair from a host bridge into the container, addressed by IPAM.
//! Keys and behaviour follow the reference plugin; see docs/plugins/bridge.md.

use crate::cni::{CniResult, Code, Command, Error, Interface, Plugin, Request};
use crate::netlink::{BridgeSpec, Link, NetNs, Netlink};
use crate::plugins::conf_keys::{
    config_ifname, configured_mtu, requested_mac, with_configured_dns,
};
use crate::plugins::firewall_backend::{FirewallBackend, FirewallConf};
use crate::plugins::ipam_delegation::{ipam_add, ipam_if_configured, ipam_rollback_on_error};
use crate::plugins::link_owner;
use crate::plugins::masquerade::{self, MasqKeys};
use crate::plugins::pod_interface::{
    address_iface, create_pod_veth, find_container_link_as_made, route_iface, Ipv6Setup,
    LinkLocalOff,
};
use crate::plugins::pod_netns::{open_netns, OwnLink};
use check::{check_peer_on_bridge, expect_kind};
use gateway::{apply_gateways, gateway_on_bridge};
use port::{attach_port, port_owner, PLUGIN};
use serde::Deserialize;

mod check;
#[cfg(test)]
mod conf_tests;
mod firewall;
#[cfg(test)]
mod firewall_tests;
mod gateway;
mod port;

pub struct Bridge {
    pub firewall: FirewallBackend,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(default = "default_bridge")]
    bridge: String,
    #[serde(default)]
    is_gateway: bool,
    #[serde(default)]
    is_default_gateway: bool,
    #[serde(default)]
    force_address: bool,
    /// `ipMasq`, `ipMasqBackend`, `ipMasqExclude`: read on their own by `load` (serde's
    /// flatten would lose the key's name from a type error's message).
    #[serde(skip)]
    masq: MasqKeys,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    hairpin_mode: bool,
    #[serde(default)]
    promisc_mode: bool,
    #[serde(default)]
    vlan: Option<u16>,
    /// Present, even as `[]`, turns VLAN filtering on, as in the reference.
    #[serde(default)]
    vlan_trunk: Option<Vec<Trunk>>,
    /// Keep VLAN 1 on a port that has VLANs; false by default since the
    /// reference's v1.8.0, so a pod on a VLAN sees only its VLAN.
    #[serde(default)]
    preserve_default_vlan: bool,
    #[serde(default)]
    enabledad: bool,
    #[serde(default)]
    macspoofchk: bool,
    #[serde(default)]
    disable_container_interface: bool,
    #[serde(default)]
    port_isolation: bool,
    /// The ipamd daemon that applies ipMasq/macspoofchk (see firewall/backend.rs).
    #[serde(default)]
    daemon_socket: Option<std::path::PathBuf>,
}

impl FirewallConf for Conf {
    fn daemon_socket(&self) -> Option<&std::path::Path> {
        self.daemon_socket.as_deref()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Trunk {
    #[serde(default)]
    id: Option<u16>,
    #[serde(default, rename = "minID")]
    min_id: Option<u16>,
    #[serde(default, rename = "maxID")]
    max_id: Option<u16>,
}

fn default_bridge() -> String {
    "cni0".into()
}

impl Conf {
    fn load(req: &Request) -> Result<Conf, Error> {
        let mut c: Conf = req.conf.typed()?;
        c.masq = req.conf.typed()?;
        // 0 means "not set" in the reference's Go structs; generated configs send it.
        c.mtu = configured_mtu(c.mtu)?;
        c.vlan = c.vlan.filter(|&v| v != 0);
        if c.disable_container_interface && req.conf.ipam_type.is_some() {
            return Err(Error::invalid_config(
                "disableContainerInterface cannot be used with IPAM: a down interface loses its addresses and routes",
            ));
        }
        if c.is_default_gateway {
            c.is_gateway = true;
        }
        if c.hairpin_mode && c.promisc_mode {
            return Err(Error::invalid_config(
                "cannot set hairpinMode and promiscMode at the same time",
            ));
        }
        config_ifname("bridge", &c.bridge)?;
        if let Some(v) = c.vlan {
            check_vid(v, "vlan")?;
            if c.is_gateway {
                // The gateway's own link (see gateway.rs), checked before ADD changes anything.
                config_ifname(
                    "bridge + vlan (VLAN gateway name)",
                    &format!("{}.{v}", c.bridge),
                )?;
            }
        }
        Ok(c)
    }

    /// DEL with a configuration `load` refuses: remove every kind of firewall
    /// entry the attachment may own (a removal of nothing is harmless).
    fn del_fallback(req: &Request) -> Conf {
        Conf {
            masq: MasqKeys::del_fallback(),
            macspoofchk: true,
            daemon_socket: crate::plugins::conf_keys::daemon_socket_of(req),
            ..Conf::default()
        }
    }

    /// The tagged VLAN ids of `vlanTrunk`, ascending, each once. As in the
    /// reference, an entry may give `id` and a `minID`/`maxID` pair together
    /// (both count), one of the pair alone is an error, and `{}` adds nothing.
    fn trunk_ids(&self) -> Result<Vec<u16>, Error> {
        let mut ids = std::collections::BTreeSet::new();
        for t in self.vlan_trunk.iter().flatten() {
            match (t.min_id, t.max_id) {
                (Some(lo), Some(hi)) => {
                    check_vid(lo, "vlanTrunk.minID")?;
                    check_vid(hi, "vlanTrunk.maxID")?;
                    if hi < lo {
                        return Err(Error::invalid_config(format!(
                            "vlanTrunk.minID {lo} is greater than maxID {hi}"
                        )));
                    }
                    ids.extend(lo..=hi);
                }
                (None, None) => {}
                (Some(_), None) | (None, Some(_)) => {
                    return Err(Error::invalid_config(
                        "vlanTrunk.minID and maxID go together: one of them is missing",
                    ))
                }
            }
            if let Some(id) = t.id {
                ids.insert(check_vid(id, "vlanTrunk.id")?);
            }
        }
        Ok(ids.into_iter().collect())
    }

    fn uses_vlans(&self) -> bool {
        self.vlan.is_some() || self.vlan_trunk.is_some()
    }
}

fn check_vid(v: u16, key: &str) -> Result<u16, Error> {
    if (1..=4094).contains(&v) {
        Ok(v)
    } else {
        Err(Error::invalid_config(format!(
            "{key} {v} must be between 1 and 4094"
        )))
    }
}

impl Plugin for Bridge {
    /// As the reference's (and, for ipamd, host-local's): it decodes them.
    fn reads_cni_args(&self) -> bool {
        true
    }

    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = Conf::load(req)?;
        // Held to the end of the call: dropping it closes its netfilter
        // sockets, which waits for the kernel (see firewall/socket.rs); last
        // is when that wait overlaps least with the work.
        let fw = self.firewall.for_call(req, &conf);
        let trunk = conf.trunk_ids()?;
        conf.masq.check_backend("bridge", req)?;
        let mac = requested_mac(req)?;
        let ns = open_netns(req.netns())?;
        let mut host = Netlink::open()?;
        let mut cont = Netlink::open_in(&ns)?;

        let bridge = host.ensure_bridge(BridgeSpec {
            name: conf.bridge.clone(),
            mtu: conf.mtu,
            vlan_filtering: conf.uses_vlans(),
            promisc: conf.promisc_mode,
        })?;
        let (host_name, pair) = create_pod_veth(
            (&mut host, &mut cont),
            req,
            &ns,
            conf.mtu,
            mac,
            Some(bridge.index),
        )?;
        // From here on a failure must remove the veth (deleting one end removes both).
        let att = req.attachment();
        let attached = attach_port(&mut host, &conf, &trunk, &att, (&bridge, pair.host_index))
            .and_then(|()| {
                let pod = Pod {
                    ns: &ns,
                    index: pair.peer_index,
                    mac: &pair.peer_mac(),
                };
                self.address(req, &conf, pod, &mut host, &mut cont, &bridge)
            })
            .map(|mut r| {
                r.interfaces = interfaces(&bridge, req, &host_name, pair);
                r
            })
            .and_then(|r| {
                firewall::add(&*fw, req, &conf, &host_name, &mut cont, pair.peer_index, r)
            });
        attached
            .inspect_err(|_| {
                if let Err(ce) = host.delete_link(pair.host_index) {
                    eprintln!("cleanup after failed ADD: {ce}");
                }
            })
            .map(|r| with_configured_dns(req, r))
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        let Some(prev) = req.conf.prev_result.clone() else {
            return Err(Error::invalid_config("CHECK needs prevResult"));
        };
        ipam_if_configured(req, Command::Check)?;
        let mut host = Netlink::open()?;
        let bridge = host.link_by_name(&conf.bridge)?.ok_or_else(|| {
            Error::check_failed(format_args!("bridge {} does not exist", conf.bridge))
        })?;
        expect_kind(&bridge, "bridge")?;

        let mut found = find_container_link_as_made(req, &prev, "veth")?;
        check_peer_on_bridge(&mut host, &found.link, &bridge)?;
        found.check_iface_state(&prev)?;
        masquerade::check_if_on(&self.firewall, (req, &conf), &conf.masq, &prev)
    }

    // ---------------------------------------------------------------- DEL
    fn del(&self, req: &Request) -> Result<(), Error> {
        // Never fail DEL on kernel state that is gone, nor on a config it cannot use.
        let conf = req.conf_or_del_fallback(Conf::load, Conf::del_fallback)?;
        // Held to the end (see ADD): its sockets close after the link is
        // deleted, when the kernel's grace period has mostly passed already.
        let fw = self.firewall.for_call(req, &conf);
        let owner = port_owner(&req.attachment());
        let ours = OwnLink {
            kind: "veth",
            bridge: Some(&conf.bridge),
            owner: Some(&owner),
        };
        link_owner::del_veth_attachment(req, || firewall::del(&*fw, req, &conf), ours)
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        Conf::load(req)?;
        ipam_if_configured(req, Command::Status)
    }

    // ---------------------------------------------------------------- GC
    /// The stale veths leave the bridge before IPAM frees their addresses.
    fn gc(&self, req: &Request) -> Result<(), Error> {
        let conf = Conf::load(req)?;
        link_owner::gc_stale_veths(req, PLUGIN, || {
            firewall::gc(&*self.firewall.for_call(req, &conf), req)
        })
    }
}

impl Bridge {
    /// IPAM ADD, gateway bookkeeping, and the container side. Undoes the IPAM
    /// reservation if anything after it fails.
    fn address(
        &self,
        req: &Request,
        conf: &Conf,
        pod: Pod,
        host: &mut Netlink,
        cont: &mut Netlink,
        bridge: &Link,
    ) -> Result<CniResult, Error> {
        let peer_index = pod.index;
        if req.conf.ipam_type.is_none() {
            // L2 only: bring the container end up unless asked not to.
            if !conf.disable_container_interface {
                cont.set_up(peer_index)?;
            }
            return Ok(CniResult::default());
        }
        let mut result = ipam_add(req)?;
        ipam_rollback_on_error(req, || {
            if result.ips.is_empty() {
                return Err(Error::new(
                    Code::Delegate,
                    "IPAM plugin returned no IP addresses",
                ));
            }
            apply_gateways(conf, &mut result);
            for ip in &mut result.ips {
                ip.interface = Some(2);
            }
            let v6 = Ipv6Setup {
                dad: conf.enabledad,
                mac: Some(pod.mac),
                link_local_off: LinkLocalOff::WithUp,
                ..Ipv6Setup::default()
            };
            address_iface(pod.ns, cont, peer_index, req.ifname(), &result, v6)?;
            route_iface(cont, peer_index, &result)?;
            if conf.disable_container_interface {
                cont.set_down(peer_index)?;
            }
            if conf.is_gateway {
                gateway_on_bridge(host, conf, bridge, &result)?;
            }
            Ok(result)
        })
    }
}

/// The pod's end of the veth: its netns, index, and the MAC it was made with.
#[derive(Clone, Copy)]
struct Pod<'a> {
    ns: &'a NetNs,
    index: u32,
    mac: &'a str,
}

/// Result interfaces in the reference order: bridge, host veth, container, with the
/// MACs known from the creates (no read-back).
fn interfaces(
    bridge: &Link,
    req: &Request,
    host_name: &str,
    pair: crate::netlink::VethPair,
) -> Vec<Interface> {
    // cnikit pins a bridge's MAC at creation, so the one read at ensure time holds.
    let bridge_mac = bridge.mac.clone().unwrap_or_default();
    vec![
        Interface {
            name: bridge.name.clone(),
            mac: bridge_mac,
            ..Default::default()
        },
        Interface {
            name: host_name.to_string(),
            mac: pair.host_mac(),
            ..Default::default()
        },
        Interface {
            name: req.ifname().to_string(),
            mac: pair.peer_mac(),
            sandbox: req.netns().to_string(),
            ..Default::default()
        },
    ]
}
