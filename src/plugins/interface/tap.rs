//! tap: a persistent TAP device named CNI_IFNAME in the pod, for a virtual machine's NIC
//! (KubeVirt-style), as the reference v1.9.1 makes it: `mac`, `mtu`, `multiQueue`,
//! `owner`, `group` (who may open it), `bridge` (a bridge inside the pod it joins),
//! addresses from IPAM when there is one. See docs/plugins/tap.md.

use super::child::{address_from_ipam, del_single_iface, status_if_supported};
use crate::cni::{CniResult, Code, Command, Error, Interface, Plugin, Request};
use crate::netlink::{selinux_context, tap_supported, Link, LinkSetup, NetNs, Netlink, TapSpec};
use crate::plugins::conf_keys::{config_ifname, configured_mtu, validate_mac, with_configured_dns};
use crate::plugins::ipam_delegation::ipam_if_configured;
use crate::plugins::pod_interface::{ensure_ifname_free, expect_mac, find_container_link};
use crate::plugins::pod_netns::open_netns;
use serde::Deserialize;
use serde_json::Value;

pub struct Tap;

/// `IFLA_INFO_KIND` of a tap (and a tun), the only kind of link DEL removes.
const KIND: &str = "tun";

/// The plugin's keys (`args`, a Go `*struct{}` there, carries nothing).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(default)]
    multi_queue: bool,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    owner: Option<u32>,
    #[serde(default)]
    group: Option<u32>,
    #[serde(default)]
    selinux_context: Option<String>,
    #[serde(default)]
    bridge: Option<String>,
}

/// What one call makes, validated.
#[derive(Debug)]
struct Settings {
    spec: TapSpec,
    mtu: Option<u32>,
    mac: Option<String>,
    bridge: Option<String>,
    selinux_context: Option<String>,
}

impl Settings {
    fn load(req: &Request) -> Result<Settings, Error> {
        let c: Conf = req.conf.typed()?;
        let bridge = c.bridge.filter(|b| !b.is_empty());
        if let Some(b) = &bridge {
            config_ifname("bridge", b)?;
        }
        let selinux_context = c.selinux_context.filter(|l| !l.is_empty());
        // The reference makes the tap with its netlink library when both owner and group
        // are given (and no SELinux context), which sets IFF_VNET_HDR; otherwise with
        // `ip tuntap`, which sets IFF_NO_PI.
        let vnet_hdr = c.owner.is_some() && c.group.is_some() && selinux_context.is_none();
        Ok(Settings {
            spec: TapSpec {
                name: req.ifname().to_string(),
                multi_queue: c.multi_queue,
                vnet_hdr,
                owner: c.owner,
                group: c.group,
            },
            mtu: configured_mtu(c.mtu)?,
            mac: mac(req, c.mac)?,
            bridge,
            selinux_context,
        })
    }
}

/// The reference's precedence, last wins: `mac`, `CNI_ARGS MAC=`, `runtimeConfig.mac`;
/// an empty value is not set.
fn mac(req: &Request, conf: Option<String>) -> Result<Option<String>, Error> {
    let runtime = match req.conf.runtime_config("mac") {
        Some(Value::String(s)) => Some(s.clone()),
        None => None,
        Some(other) => {
            return Err(Error::invalid_config(format!(
                "runtimeConfig.mac must be a string, got {other}"
            )))
        }
    };
    let env = req.args.get("MAC").map(str::to_string);
    [
        (runtime, "runtimeConfig.mac"),
        (env, "CNI_ARGS MAC"),
        (conf, "mac"),
    ]
    .into_iter()
    .find_map(|(m, key)| m.filter(|m| !m.is_empty()).map(|m| (m, key)))
    .map(|(m, key)| validate_mac(&m, key))
    .transpose()
}

/// `selinuxContext`: the reference execs `ip` under that label so that the tap is created
/// with it. cnikit creates the tap itself, so it can only honour a label that is the one
/// it runs under; without SELinux enabled there is no label to give.
fn check_selinux(label: Option<&str>) -> Result<(), Error> {
    let Some(label) = label else {
        return Ok(());
    };
    match selinux_context() {
        None => Ok(()),
        Some(current) if current == label => Ok(()),
        Some(current) => Err(Error::new(
            Code::UnsupportedField,
            format!(
                "selinuxContext {label:?}: cnikit creates the tap itself, as {current:?}, and cannot give it another SELinux context; leave selinuxContext unset or use the reference tap plugin"
            ),
        )),
    }
}

/// After the create: MTU, MAC and `arp_notify` in one request, the bridge in the pod,
/// then up (without IPAM) or addressed from IPAM (which brings it up).
fn finish(
    req: &Request,
    s: &Settings,
    ns: &NetNs,
    cont: &mut Netlink,
    index: u32,
) -> Result<CniResult, Error> {
    let setup = LinkSetup {
        mtu: s.mtu,
        mac: s.mac.as_deref(),
        // As the reference (tap.go:316) when IPAM addresses it: a gratuitous ARP for
        // its addresses when it goes up. Over netlink, not through /proc/sys.
        arp_notify: req.conf.ipam_type.is_some(),
        ..LinkSetup::default()
    };
    cont.setup_link(index, &setup)?;
    if let Some(name) = &s.bridge {
        let bridge = cont.link_by_name(name)?.ok_or_else(|| {
            Error::invalid_config(format!(
                "bridge {name} does not exist in netns {}",
                req.netns()
            ))
        })?;
        cont.set_master(index, bridge.index)?;
    }
    if req.conf.ipam_type.is_some() {
        return address_from_ipam(req, ns, cont, index);
    }
    cont.set_up(index)?;
    let link = cont.link_by_index(index)?;
    Ok(CniResult {
        interfaces: vec![Interface {
            name: req.ifname().to_string(),
            mac: link.and_then(|l| l.mac).unwrap_or_default(),
            sandbox: req.netns().to_string(),
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// CHECK: the link is a tap as configured (queues, owner, group, MTU).
fn expect_tap(nl: &mut Netlink, link: &Link, s: &Settings) -> Result<(), Error> {
    let name = &link.name;
    let info = match link.is_kind(KIND) {
        true => nl.tun_info(link.index)?,
        false => None,
    };
    let Some(info) = info.filter(|i| i.tap) else {
        return Err(Error::check_failed(format_args!("{name} is not a tap")));
    };
    let differs = |what: &str, have: String, want: String| {
        Err(Error::check_failed(format_args!(
            "{name} {what} is {have}, configured {want}"
        )))
    };
    if info.multi_queue != s.spec.multi_queue {
        return differs(
            "multiQueue",
            info.multi_queue.to_string(),
            s.spec.multi_queue.to_string(),
        );
    }
    for (what, want, have) in [
        ("owner", s.spec.owner, info.owner),
        ("group", s.spec.group, info.group),
        ("mtu", s.mtu, Some(link.mtu)),
    ] {
        if let Some(w) = want.filter(|w| Some(*w) != have) {
            let have = have.map_or("unset".to_string(), |h| h.to_string());
            return differs(what, have, w.to_string());
        }
    }
    Ok(())
}

impl Plugin for Tap {
    /// As the reference, which decodes them (`MAC`).
    fn reads_cni_args(&self) -> bool {
        true
    }

    // ---------------------------------------------------------------- ADD
    /// The tap first, then IPAM; a failure after the create removes the tap again, and
    /// one after IPAM's ADD releases what it gave.
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let s = Settings::load(req)?;
        check_selinux(s.selinux_context.as_deref())?;
        let ns = open_netns(req.netns())?;
        let mut cont = Netlink::open_in(&ns)?;
        ensure_ifname_free(&mut cont, req.ifname(), req.netns())?;
        let index = ns.create_tap(&s.spec)?;
        let result = finish(req, &s, &ns, &mut cont, index).inspect_err(|_| {
            if let Err(e) = cont.delete_link(index) {
                eprintln!("cleanup after failed ADD: {e}");
            }
        })?;
        Ok(with_configured_dns(req, result))
    }

    // ---------------------------------------------------------------- CHECK
    /// IPAM's CHECK, then the link of prevResult in the pod: a tap as configured, with
    /// prevResult's MAC (and MTU, when it gives one), addresses and routes.
    fn check(&self, req: &Request) -> Result<(), Error> {
        let s = Settings::load(req)?;
        ipam_if_configured(req, Command::Check)?;
        let Some(prev) = &req.conf.prev_result else {
            return Err(Error::invalid_config("tap: CHECK needs prevResult"));
        };
        let mut found = find_container_link(req, prev)?;
        let (link, iface) = (&found.link, &prev.interfaces[found.pos]);
        expect_tap(&mut found.nl, link, &s)?;
        expect_mac(link, &iface.mac)?;
        if let Some(mtu) = iface.mtu.filter(|m| *m != link.mtu) {
            return Err(Error::check_failed(format_args!(
                "{} has MTU {}, prevResult says {mtu}",
                link.name, link.mtu
            )));
        }
        if let Some(name) = &s.bridge {
            let bridge = found.nl.link_by_name(name)?;
            if bridge.is_none_or(|b| link.master != Some(b.index)) {
                return Err(Error::check_failed(format_args!(
                    "{} is not a port of bridge {name}",
                    link.name
                )));
            }
        }
        found.check_iface_state(prev)
    }

    // ---------------------------------------------------------------- DEL
    /// IPAM's DEL, then the tap; both run even if one fails. A netns or link that is gone
    /// is done, and a link named CNI_IFNAME that is not a tun/tap stays. No plugin key is
    /// read, so no configuration can block it.
    fn del(&self, req: &Request) -> Result<(), Error> {
        del_single_iface(req, KIND)
    }

    // ---------------------------------------------------------------- STATUS
    /// The configuration, the kernel's TUN/TAP support (50 without), then IPAM's STATUS.
    fn status(&self, req: &Request) -> Result<(), Error> {
        Settings::load(req)?;
        status_if_supported(
            req,
            tap_supported()?,
            "this kernel has no TUN/TAP support (CONFIG_TUN, /dev/net/tun), so ADD cannot create taps",
        )
    }

    // ---------------------------------------------------------------- GC
    /// IPAM's GC: the taps go with their pods' netns.
    fn gc(&self, req: &Request) -> Result<(), Error> {
        ipam_if_configured(req, Command::Gc)
    }
}

#[cfg(test)]
#[path = "tap_tests.rs"]
mod tests;
