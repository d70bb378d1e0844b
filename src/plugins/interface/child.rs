//! What macvlan and ipvlan share: a child link of a master, moved into the
//! pod and addressed from IPAM. [`ChildKind`] states what differs between
//! them; every `ChildKind` is a [`Plugin`] made of the same steps. The steps
//! that only need one link the plugin made in the pod (addressing it from IPAM,
//! STATUS's kernel probe, DEL) also serve vlan, dummy and tap.

use crate::cni::{CniResult, Code, Command, Error, Plugin, Request};
use crate::netlink::{ChildLink, Link, NetNs, Netlink};
use crate::plugins::conf_keys::{config_ifname, configured_mtu, with_configured_dns};
use crate::plugins::ipam_delegation::{ipam_add, ipam_if_configured, ipam_rollback_on_error};
use crate::plugins::pod_interface::{
    address_iface, ensure_ifname_free, expect_kind, find_container_link, route_iface, Ipv6Setup,
    LinkLocalOff,
};
use crate::plugins::pod_netns::{delete_container_link, open_netns, OwnLink};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::fmt::{Debug, Display};

/// The keys macvlan and ipvlan both take.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ChildConf {
    #[serde(default)]
    pub master: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub link_in_container: bool,
}

/// A child plugin's configuration for ADD and CHECK.
pub(super) struct Loaded<K: ChildKind> {
    pub shared: ChildConf,
    /// The keys of this kind alone.
    pub own: K::Conf,
    pub mode: K::Mode,
}

/// One kind of child link: its own keys, its modes, and how ADD creates and
/// addresses it. CHECK, DEL, STATUS and GC need nothing more.
pub(super) trait ChildKind: Sync + Sized {
    /// `IFLA_INFO_KIND` of the link, also the plugin's name in messages.
    const KIND: &'static str;
    /// The names the `mode` key takes, the default first.
    const MODES: &'static [(&'static str, Self::Mode)];
    type Conf: DeserializeOwned;
    type Mode: Copy + PartialEq + Debug + 'static;
    /// Whether it holds `CNI_ARGS` to known keys (see `Plugin::reads_cni_args`).
    const READS_CNI_ARGS: bool;

    /// What the kind asks of the request beyond well-formed keys.
    fn require(_req: &Request) -> Result<(), Error> {
        Ok(())
    }

    /// What STATUS and GC check of the configuration before asking IPAM.
    fn validate(req: &Request) -> Result<(), Error>;

    /// The mode the kernel reports for a link of this kind (None: not reported).
    fn mode_of(link: &Link) -> Option<Self::Mode>;

    /// ADD once the configuration is loaded: create the link and address it
    /// (the kinds do this through [`add_child`]).
    fn add_link(req: &Request, conf: Loaded<Self>) -> Result<CniResult, Error>;
}

impl<K: ChildKind> Plugin for K {
    fn reads_cni_args(&self) -> bool {
        K::READS_CNI_ARGS
    }

    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        K::add_link(req, load(req)?).map(|r| with_configured_dns(req, r))
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let Loaded::<K> { mode, .. } = load(req)?;
        check_child(req, K::KIND, mode, K::mode_of)
    }

    // ---------------------------------------------------------------- DEL
    /// Needs nothing from the plugin's own keys, so none of them can block it.
    fn del(&self, req: &Request) -> Result<(), Error> {
        del_single_iface(req, K::KIND)
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, req: &Request) -> Result<(), Error> {
        K::validate(req)?;
        let supported = Netlink::open()?.child_kind_supported(K::KIND)?;
        let lacking = format_args!(
            "this kernel has no {0} support (no {0} module to load), so ADD cannot create {0} links",
            K::KIND
        );
        status_if_supported(req, supported, lacking)
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        K::validate(req)?;
        ipam_if_configured(req, Command::Gc)
    }
}

/// The configuration for ADD and CHECK: the keys decoded, the mode one of
/// `K::MODES`, what the kind requires, and a master name the kernel takes.
pub(super) fn load<K: ChildKind>(req: &Request) -> Result<Loaded<K>, Error> {
    let mut shared: ChildConf = req.conf.typed()?;
    let own = req.conf.typed()?;
    shared.mtu = configured_mtu(shared.mtu)?;
    // `""` is Go's unset string: the master is then chosen as for no key.
    shared.master = shared.master.filter(|m| !m.is_empty());
    let mode = configured_mode::<K>(shared.mode.as_deref())?;
    K::require(req)?;
    if let Some(m) = &shared.master {
        config_ifname("master", m)?;
    }
    Ok(Loaded { shared, own, mode })
}

/// The `mode` key as one of `K::MODES`; unset or empty is the default.
fn configured_mode<K: ChildKind>(mode: Option<&str>) -> Result<K::Mode, Error> {
    let wanted = mode.filter(|m| !m.is_empty()).unwrap_or(K::MODES[0].0);
    let known = K::MODES.iter().find(|(name, _)| *name == wanted);
    known.map(|&(_, m)| m).ok_or_else(|| {
        let names: Vec<&str> = K::MODES.iter().map(|(name, _)| *name).collect();
        Error::invalid_config(format!(
            "mode {wanted:?} is not one of {}",
            names.join(", ")
        ))
    })
}

/// The master link for macvlan/ipvlan: the configured name, or the link of
/// the default route. With `linkInContainer` the lookup happens in the netns.
fn resolve_master(nl: &mut Netlink, master: Option<&str>, where_: &str) -> Result<Link, Error> {
    let link = match master {
        Some(name) => nl.link_by_name(name)?.ok_or_else(|| {
            Error::invalid_config(format!(
                "master interface {name} does not exist in {where_}"
            ))
        })?,
        None => nl.default_route_link()?.ok_or_else(|| {
            Error::invalid_config(format!(
                "no master given and {where_} has no default route to pick one from"
            ))
        })?,
    };
    Ok(link)
}

/// Create a macvlan/ipvlan child for the container and return it as the
/// container's netns sees it. The master lives on the host (the child is moved
/// into the pod by the create request itself), or, with `linkInContainer`,
/// inside the pod already.
fn create_child(
    req: &Request,
    ns: &NetNs,
    cont: &mut Netlink,
    link_in_container: bool,
    (master, mtu): (Option<&str>, Option<u32>),
    create: impl FnOnce(&mut Netlink, ChildLink) -> crate::netlink::Result<Link>,
) -> Result<Link, Error> {
    let mut host = if link_in_container {
        None
    } else {
        Some(Netlink::open()?)
    };
    let (nl, where_, target) = match host.as_mut() {
        Some(h) => (h, "the host".to_string(), Some(ns)),
        None => (cont, format!("netns {}", req.netns()), None),
    };
    let master = resolve_master(nl, master, &where_)?;
    check_mtu_against_master(mtu, &master)?;
    let link = ChildLink {
        name: req.ifname().to_string(),
        master_index: master.index,
        mtu,
        netns: target,
        arp_notify: false,
    };
    Ok(create(nl, link)?)
}

/// How a child is addressed for IPv6. macvlan and ipvlan announce their addresses going
/// up, as the reference (v1.9.1) has them: `arp_notify` went on with the create
/// (`MacvlanSpec::arp_notify`), and in the same request the kernel's IPv6 link-local
/// address went off (see `Netlink::create_child`), so none of its own here;
/// `ndisc_notify` for IPv6. vlan does neither. The child's MAC is known from the create.
fn child_ipv6(child: &Link) -> Ipv6Setup<'_> {
    let announced = child.is_kind("macvlan") || child.is_kind("ipvlan");
    Ipv6Setup {
        dad: false,
        ndisc_notify: announced,
        link_local_off: if announced {
            LinkLocalOff::Done
        } else {
            LinkLocalOff::BeforeUp
        },
        mac: child.mac.as_deref(),
    }
}

/// ADD for macvlan/ipvlan: the child is created for the pod and addressed from
/// IPAM, or by `without_ipam` when the config has none; any failure after the
/// create deletes the link again, so a failed ADD leaves nothing in the pod.
pub fn add_child(
    req: &Request,
    link_in_container: bool,
    master_mtu: (Option<&str>, Option<u32>),
    create: impl FnOnce(&mut Netlink, ChildLink) -> crate::netlink::Result<Link>,
    without_ipam: impl FnOnce(&NetNs, &mut Netlink, u32) -> Result<CniResult, Error>,
) -> Result<CniResult, Error> {
    let ns = open_netns(req.netns())?;
    let mut cont = Netlink::open_in(&ns)?;
    ensure_ifname_free(&mut cont, req.ifname(), req.netns())?;
    let child = create_child(req, &ns, &mut cont, link_in_container, master_mtu, create)?;
    let index = child.index;
    let addressed = if req.conf.ipam_type.is_none() {
        without_ipam(&ns, &mut cont, index)
    } else {
        ipam_addressed(req, &ns, &mut cont, index, child_ipv6(&child))
    };
    addressed.inspect_err(|_| {
        if let Err(e) = cont.delete_link(index) {
            eprintln!("cleanup after failed ADD: {e}");
        }
    })
}

/// Addresses from IPAM, released again if addressing fails (dummy's and tap's).
pub(super) fn address_from_ipam(
    req: &Request,
    ns: &NetNs,
    cont: &mut Netlink,
    index: u32,
) -> Result<CniResult, Error> {
    ipam_addressed(req, ns, cont, index, Ipv6Setup::default())
}

/// [`address_from_ipam`] with the IPv6 setup `v6`.
fn ipam_addressed(
    req: &Request,
    ns: &NetNs,
    cont: &mut Netlink,
    index: u32,
    v6: Ipv6Setup,
) -> Result<CniResult, Error> {
    let ipam = ipam_add(req)?;
    ipam_rollback_on_error(req, || {
        if ipam.ips.is_empty() {
            return Err(Error::new(
                Code::Delegate,
                "IPAM plugin returned no IP addresses",
            ));
        }
        address_single_iface(ns, cont, req, index, v6, ipam)
    })
}

/// MTU may not exceed the master's (the kernel's error would be EINVAL).
fn check_mtu_against_master(mtu: Option<u32>, master: &Link) -> Result<(), Error> {
    match mtu {
        Some(m) if m > master.mtu => Err(Error::invalid_config(format!(
            "mtu {m} is larger than the master {}'s mtu {}",
            master.name, master.mtu
        ))),
        _ => Ok(()),
    }
}

/// Address a single container interface (macvlan/ipvlan) `index` from `result`
/// (without DAD; IPv6 as `v6` says), and report it as interface 0, with the MAC `v6`
/// knows or else the kernel's.
pub fn address_single_iface(
    ns: &NetNs,
    cont: &mut Netlink,
    req: &Request,
    index: u32,
    v6: Ipv6Setup,
    mut result: CniResult,
) -> Result<CniResult, Error> {
    for ip in &mut result.ips {
        ip.interface = Some(0);
    }
    address_iface(ns, cont, index, req.ifname(), &result, v6)?;
    route_iface(cont, index, &result)?;
    let mac = match v6.mac {
        Some(mac) => mac.to_string(),
        None => cont
            .link_by_index(index)?
            .and_then(|l| l.mac)
            .unwrap_or_default(),
    };
    result.interfaces = vec![crate::cni::Interface {
        name: req.ifname().to_string(),
        mac,
        sandbox: req.netns().to_string(),
        ..Default::default()
    }];
    Ok(result)
}

/// CHECK for macvlan/ipvlan: link of the right kind in the netns, with the
/// prevResult's addresses and routes.
fn check_single_iface(req: &Request, kind: &str) -> Result<(Link, CniResult), Error> {
    let Some(prev) = req.conf.prev_result.clone() else {
        return Err(Error::invalid_config("CHECK needs prevResult"));
    };
    ipam_if_configured(req, Command::Check)?;
    let mut found = find_container_link(req, &prev)?;
    expect_kind(&found.link, kind)?;
    found.check_iface_state(&prev)?;
    Ok((found.link, prev))
}

/// CHECK for macvlan/ipvlan: [`check_single_iface`], then the link's mode
/// (`mode_of` reads it; `None` when the kernel did not report one) against the config's.
fn check_child<M: PartialEq + Debug>(
    req: &Request,
    kind: &str,
    mode: M,
    mode_of: impl FnOnce(&Link) -> Option<M>,
) -> Result<(), Error> {
    let (link, _) = check_single_iface(req, kind)?;
    let actual = mode_of(&link);
    if actual.as_ref().is_some_and(|m| *m != mode) {
        return Err(Error::check_failed(format_args!(
            "{} has {kind} mode {actual:?}, config says {mode:?}",
            link.name
        )));
    }
    Ok(())
}

/// DEL of a plugin whose only state in the pod is the link of `kind` it made: IPAM
/// first (so the lease goes even if the netns is gone), then the link. It reads none
/// of the plugin's keys, so no configuration (and no missing master) can block it.
pub(super) fn del_single_iface(req: &Request, kind: &str) -> Result<(), Error> {
    // Both steps run even if the first fails: a broken IPAM must not keep the link.
    let ipam = ipam_if_configured(req, Command::Del);
    let ours = OwnLink {
        kind,
        bridge: None,
        owner: None,
    };
    let link = delete_container_link(req.netns(), req.ifname(), ours);
    Error::all([ipam, link])
}

/// STATUS of a plugin whose ADD makes a link the kernel may not support: not
/// available (50, with `lacking` saying what is missing) without that support, so
/// that no ADD is tried, else IPAM's STATUS.
pub(super) fn status_if_supported(
    req: &Request,
    supported: bool,
    lacking: impl Display,
) -> Result<(), Error> {
    if !supported {
        return Err(Error::new(Code::NotAvailable, lacking.to_string()));
    }
    ipam_if_configured(req, Command::Status)
}
