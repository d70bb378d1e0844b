//! host-device's keys: which host device the attachment takes, and finding it.
//!
//! As in the reference, the first set key of `device`, `hwaddr`, `kernelpath`,
//! `pciBusID` decides (an empty string is unset); `runtimeConfig.deviceID` (the
//! `deviceID` capability of SR-IOV device plugins) replaces `pciBusID` when it names a
//! PCI device, or names an auxiliary device (`/sys/bus/auxiliary/devices/<id>`). A PCI
//! device bound to a userspace (DPDK) driver has no net device: nothing is moved.

use crate::cni::{Code, Error, Request};
use crate::netlink::{Link, Netlink};
use crate::plugins::conf_keys::{config_ifname, validate_mac};
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub(super) const SYS_BUS_PCI: &str = "/sys/bus/pci/devices";
const SYS_BUS_AUXILIARY: &str = "/sys/bus/auxiliary/devices";
/// The drivers the reference takes for DPDK mode (no kernel net device).
const USERSPACE_DRIVERS: &[&str] = &["vfio-pci", "uio_pci_generic", "igb_uio"];

#[derive(Debug, Default, Deserialize)]
pub(super) struct Conf {
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub hwaddr: Option<String>,
    #[serde(default)]
    pub kernelpath: Option<String>,
    #[serde(default, rename = "pciBusID")]
    pub pci_bus_id: Option<String>,
}

/// How the host device is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Selector {
    Name(String),
    /// Lower case, colon separated.
    Mac(String),
    /// `kernelpath`: a device directory under /sys/devices.
    KernelPath(PathBuf),
    /// `pciBusID` (or a PCI `deviceID`).
    Pci(String),
    /// An auxiliary-bus `deviceID`.
    Auxiliary(String),
    /// A PCI device bound to a userspace driver: no link to move.
    Dpdk(String),
}

/// The configuration as ADD and CHECK read it.
pub(super) fn load(req: &Request) -> Result<Selector, Error> {
    let conf: Conf = req.conf.typed()?;
    let set = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    let mut pci = set(&conf.pci_bus_id);
    let mut aux = None;
    if let Some(id) = device_id(req)? {
        if sys_id_exists(SYS_BUS_PCI, &id) {
            pci = Some(id);
        } else if sys_id_exists(SYS_BUS_AUXILIARY, &id) {
            pci = None;
            aux = Some(id);
        } else {
            return Err(Error::invalid_config(format!(
                "runtime config DeviceID {id} not found or unsupported"
            )));
        }
    }
    if let Some(p) = &pci {
        safe_component("pciBusID", p)?;
        if has_dpdk_driver(p)? {
            return Ok(Selector::Dpdk(p.clone()));
        }
    }
    if let Some(d) = set(&conf.device) {
        config_ifname("device", &d)?;
        return Ok(Selector::Name(d));
    }
    if let Some(m) = set(&conf.hwaddr) {
        return Ok(Selector::Mac(validate_mac(&m, "hwaddr")?));
    }
    if let Some(k) = set(&conf.kernelpath) {
        let path = Path::new(&k);
        let inside = path.is_absolute()
            && k.starts_with("/sys/devices/")
            && !path.components().any(|c| c.as_os_str() == "..");
        if !inside {
            return Err(Error::invalid_config(format!(
                "kernel device path {k:?} must be absolute and begin with /sys/devices/"
            )));
        }
        return Ok(Selector::KernelPath(path.to_path_buf()));
    }
    if let Some(p) = pci {
        return Ok(Selector::Pci(p));
    }
    if let Some(a) = aux {
        return Ok(Selector::Auxiliary(a));
    }
    Err(Error::invalid_config(
        r#"specify either "device", "hwaddr", "kernelpath" or "pciBusID""#,
    ))
}

/// `runtimeConfig.deviceID`, unset when empty.
fn device_id(req: &Request) -> Result<Option<String>, Error> {
    match req.conf.runtime_config("deviceID") {
        None => Ok(None),
        Some(v) => match v.as_str() {
            Some("") => Ok(None),
            Some(s) => safe_component("runtimeConfig.deviceID", s).map(|()| Some(s.to_string())),
            None => Err(Error::invalid_config(format!(
                "runtimeConfig.deviceID must be a string, got {v}"
            ))),
        },
    }
}

/// A bus id goes into a sysfs path: one path component, never `..`.
fn safe_component(key: &str, id: &str) -> Result<(), Error> {
    if id.contains('/') || id == "." || id == ".." || id.contains('\0') {
        return Err(Error::invalid_config(format!(
            "{key} {id:?} is not a bus device id like 0000:00:05.0"
        )));
    }
    Ok(())
}

fn sys_id_exists(bus: &str, id: &str) -> bool {
    Path::new(bus).join(id).exists()
}

/// Whether PCI device `id` is bound to one of [`USERSPACE_DRIVERS`]; a device with no
/// driver link is an error, as in the reference.
fn has_dpdk_driver(id: &str) -> Result<bool, Error> {
    let link = Path::new(SYS_BUS_PCI).join(id).join("driver");
    let target = std::fs::canonicalize(&link).map_err(|e| {
        Error::invalid_config(format!("error with host device: {}: {e}", link.display()))
    })?;
    let driver = target.file_name().and_then(|n| n.to_str()).unwrap_or("");
    Ok(USERSPACE_DRIVERS.contains(&driver))
}

/// The host device `sel` names, in the socket's (the host's) netns. A device that is
/// not there is reported as such: it does not exist or another attachment took it.
pub(super) fn find_host_link(host: &mut Netlink, sel: &Selector) -> Result<Link, Error> {
    let found = match sel {
        Selector::Name(name) => host.link_by_name(name)?,
        Selector::Mac(mac) => host.link_by_mac(mac)?,
        Selector::KernelPath(p) => by_sysfs_name(host, &net_device_name(p)?)?,
        Selector::Pci(id) => by_sysfs_name(host, &net_device_name(&pci_net_dir(id)?)?)?,
        Selector::Auxiliary(id) => {
            let dir = Path::new(SYS_BUS_AUXILIARY).join(id);
            by_sysfs_name(host, &net_device_name(&dir)?)?
        }
        Selector::Dpdk(_) => None,
    };
    found.ok_or_else(|| {
        Error::new(
            Code::InvalidConfig,
            format!(
                "failed to find host device: {} is not in this (the host's) network namespace; \
                 it does not exist, or another attachment holds it in its pod",
                describe(sel)
            ),
        )
    })
}

pub(super) fn describe(sel: &Selector) -> String {
    match sel {
        Selector::Name(n) => format!("device {n}"),
        Selector::Mac(m) => format!("the device with hwaddr {m}"),
        Selector::KernelPath(p) => format!("the net device of {}", p.display()),
        Selector::Pci(id) => format!("the net device of PCI device {id}"),
        Selector::Auxiliary(id) => format!("the net device of auxiliary device {id}"),
        Selector::Dpdk(id) => format!("PCI device {id} (userspace driver)"),
    }
}

fn by_sysfs_name(host: &mut Netlink, name: &str) -> Result<Option<Link>, Error> {
    Ok(host.link_by_name(name)?)
}

/// `/sys/bus/pci/devices/<id>/net`, or a virtio device's `virtio*/net` below it.
fn pci_net_dir(id: &str) -> Result<PathBuf, Error> {
    let dev = Path::new(SYS_BUS_PCI).join(id);
    if dev.join("net").symlink_metadata().is_ok() {
        return Ok(dev);
    }
    let mut virtio: Vec<PathBuf> = std::fs::read_dir(&dev)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    virtio.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("virtio"))
            && p.join("net").is_dir()
    });
    virtio.sort();
    virtio
        .into_iter()
        .next()
        .ok_or_else(|| Error::invalid_config(format!("no net directory under pci device {id}")))
}

/// The net device of sysfs device directory `dir`: the first (by name) entry of its
/// `net/`, as the reference takes it; or, beyond the reference, `dir` itself when it is
/// a net device's own directory (`…/net/eth1`, which `/sys/class/net/eth1` resolves to).
fn net_device_name(dir: &Path) -> Result<String, Error> {
    let net = dir.join("net");
    match std::fs::read_dir(&net) {
        Ok(rd) => {
            let mut names: Vec<String> = rd
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            names.sort();
            names.into_iter().next().ok_or_else(|| {
                Error::invalid_config(format!(
                    "failed to find network device in path {}",
                    net.display()
                ))
            })
        }
        Err(_) if is_net_device_dir(dir) => Ok(dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string()),
        Err(e) => Err(Error::invalid_config(format!(
            "failed to read directory {}: {e}",
            net.display()
        ))),
    }
}

fn is_net_device_dir(dir: &Path) -> bool {
    dir.join("ifindex").is_file()
        && dir
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|p| p == "net")
}
