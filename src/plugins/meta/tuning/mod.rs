//! tuning: a chained plugin that changes the container interface `CNI_IFNAME` and the
//! pod's network sysctls, as the reference does: `sysctl`, `mac` (also capability `mac`,
//! `CNI_ARGS MAC=`), `mtu`, `promisc`, `allmulti`, `txQLen`, each also in `args.cni`.
//! ADD backs up what it changes on the link (`backup.rs`) and DEL puts it back; sysctls
//! are not restored (they die with the pod's netns), as in the reference.

use crate::cni::config::without_nulls;
use crate::cni::{CniResult, Code, Error, Plugin, Request};
use crate::netlink::{sysctl, Link, NetNs, Netlink};
use crate::plugins::conf_keys::{configured_mtu, validate_mac};
use crate::plugins::pod_netns::open_netns;
use crate::plugins::pod_netns::{is_own_netns, netns_for_del};
use backup::{Backup, BackupFile, DEFAULT_DIR};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use sysctls::{check_allowlist, proc_key, refuse_duplicate_keys, ALLOWLIST};

mod backup;
#[path = "sysctl.rs"]
mod sysctls;

pub struct Tuning;

/// The plugin's keys, at the top level and (but `dataDir`) in `args.cni`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Conf {
    #[serde(default, rename = "dataDir")]
    data_dir: Option<String>,
    #[serde(default)]
    sysctl: Option<Map<String, Value>>,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    promisc: Option<bool>,
    #[serde(default)]
    mtu: Option<i64>,
    #[serde(default, rename = "txQLen")]
    tx_qlen: Option<i64>,
    #[serde(default)]
    allmulti: Option<bool>,
}

/// What one call applies, validated.
#[derive(Debug, Default)]
pub(super) struct Settings {
    /// (configured key, `/proc/sys` key, value), in the configuration's order.
    sysctls: Vec<(String, String, String)>,
    /// The link fields to set; `promisc` only ever turns it on, as in the reference.
    link: Backup,
    /// `promisc` as configured, for CHECK (which also wants it off when false).
    promisc: bool,
    dir: PathBuf,
}

impl Settings {
    fn load(req: &Request, allowlist: &Path) -> Result<Settings, Error> {
        refuse_duplicate_keys(&req.conf.bytes)?;
        let conf: Conf = req.conf.typed()?;
        let args_cni = req.conf.raw.get("args").and_then(|a| a.get("cni"));
        let args: Conf = match args_cni.filter(|v| !v.is_null()) {
            Some(v) => serde_json::from_value(without_nulls(v)).map_err(|e| {
                Error::invalid_config(format!("args.cni has a tuning key of the wrong type: {e}"))
            })?,
            None => Conf::default(),
        };
        let mut sysctls: Vec<(String, Value)> =
            conf.sysctl.unwrap_or_default().into_iter().collect();
        for (k, v) in args.sysctl.unwrap_or_default() {
            match sysctls.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => sysctls.push((k, v)),
            }
        }
        let keys: Vec<&str> = sysctls.iter().map(|(k, _)| k.as_str()).collect();
        check_allowlist(allowlist, &keys)?;
        let sysctls = sysctls
            .iter()
            .map(|(k, v)| {
                let value = v.as_str().ok_or_else(|| {
                    Error::invalid_config(format!("sysctl {k:?} must be a string, got {v}"))
                })?;
                Ok((k.clone(), proc_key(k, req.ifname())?, value.to_string()))
            })
            .collect::<Result<_, Error>>()?;
        let promisc = args.promisc.or(conf.promisc).unwrap_or(false);
        let link = Backup {
            mac: mac(req, conf.mac, args.mac)?,
            promisc: promisc.then_some(true),
            mtu: mtu(args.mtu.or(conf.mtu))?,
            allmulti: args.allmulti.or(conf.allmulti),
            tx_qlen: tx_qlen(args.tx_qlen.or(conf.tx_qlen))?,
        };
        Ok(Settings {
            sysctls,
            link,
            promisc,
            dir: conf
                .data_dir
                .filter(|d| !d.is_empty())
                .map_or_else(|| DEFAULT_DIR.into(), PathBuf::from),
        })
    }
}

/// The reference's precedence, last wins: `mac`, `CNI_ARGS MAC=`, `runtimeConfig.mac`
/// (capability `mac`), `args.cni.mac`. An empty value is not set, but for
/// `args.cni.mac`, a pointer in the reference: given as `""`, it leaves the MAC alone.
fn mac(req: &Request, conf: Option<String>, args: Option<String>) -> Result<Option<String>, Error> {
    if args.as_deref() == Some("") {
        return Ok(None);
    }
    let runtime = match req.conf.runtime_config("mac") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::String(_)) | None => None,
        Some(other) => {
            return Err(Error::invalid_config(format!(
                "runtimeConfig.mac must be a string, got {other}"
            )))
        }
    };
    let env = req
        .args
        .get("MAC")
        .filter(|m| !m.is_empty())
        .map(str::to_string);
    let chosen = [
        (args, "args.cni.mac"),
        (runtime, "runtimeConfig.mac"),
        (env, "CNI_ARGS MAC"),
        (conf, "mac"),
    ]
    .into_iter()
    .find_map(|(m, key)| m.filter(|m| !m.is_empty()).map(|m| (m, key)));
    chosen.map(|(m, key)| validate_mac(&m, key)).transpose()
}

fn mtu(v: Option<i64>) -> Result<Option<u32>, Error> {
    match v {
        None => Ok(None),
        Some(m) => configured_mtu(Some(u32::try_from(m).map_err(|_| {
            Error::invalid_config(format!("mtu {m} must be between 68 and 65535"))
        })?)),
    }
}

fn tx_qlen(v: Option<i64>) -> Result<Option<u32>, Error> {
    v.map(|q| {
        u32::try_from(q).map_err(|_| {
            Error::invalid_config(format!("txQLen {q} must be between 0 and {}", u32::MAX))
        })
    })
    .transpose()
}

/// Chained only: the interface and its result come from the plugins before.
fn prev_result(req: &Request) -> Result<&CniResult, Error> {
    req.conf.prev_result.as_ref().ok_or_else(|| {
        Error::invalid_config(
            "tuning is a chained plugin: it needs prevResult from the plugin before it",
        )
    })
}

fn container_link(nl: &mut Netlink, req: &Request) -> Result<Link, Error> {
    nl.link_by_name(req.ifname())?.ok_or_else(|| {
        Error::new(
            Code::Kernel,
            format!("interface {} is missing in {}", req.ifname(), req.netns()),
        )
    })
}

impl Plugin for Tuning {
    /// As the reference's (and, for ipamd, host-local's): it decodes them.
    fn reads_cni_args(&self) -> bool {
        true
    }

    // ---------------------------------------------------------------- ADD
    /// Sysctls first, then the backup, then the link's fields; a failure part-way puts
    /// back what this call changed (sysctls included) before reporting it.
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let s = Settings::load(req, Path::new(ALLOWLIST))?;
        let mut result = prev_result(req)?.clone();
        let ns = open_netns(req.netns())?;
        let mut nl = Netlink::open_in(&ns)?;
        let link = container_link(&mut nl, req)?;
        let written = write_sysctls(&ns, &s)?;
        let applied = apply_link(req, &mut nl, &link, &s);
        if let Err(e) = applied {
            restore_sysctls(&ns, &written);
            return Err(e);
        }
        if let Some(mac) = &s.link.mac {
            for i in result
                .interfaces
                .iter_mut()
                .filter(|i| i.name == req.ifname())
            {
                i.mac = mac.clone();
            }
        }
        Ok(result)
    }

    // ---------------------------------------------------------------- CHECK
    /// Every configured sysctl and link field is as configured (promisc also when it is
    /// configured off, as in the reference).
    fn check(&self, req: &Request) -> Result<(), Error> {
        let s = Settings::load(req, Path::new(ALLOWLIST))?;
        prev_result(req)?;
        let ns = open_netns(req.netns())?;
        for (key, path, want) in &s.sysctls {
            let have = ns.run(|| sysctl::get(path))??;
            if normalized(&have) != normalized(want) {
                return Err(Error::check_failed(format_args!(
                    "sysctl {key} is {have:?}, configured {want:?}"
                )));
            }
        }
        let mut nl = Netlink::open_in(&ns)?;
        let link = container_link(&mut nl, req)?;
        let name = req.ifname();
        let differs = |what: &str, have: &dyn std::fmt::Display, want: &dyn std::fmt::Display| {
            Err(Error::check_failed(format_args!(
                "{name} {what} is {have}, configured {want}"
            )))
        };
        if let Some(mac) = &s.link.mac {
            let have = link.mac.clone().unwrap_or_default();
            if have != *mac {
                return differs("MAC address", &have, mac);
            }
        }
        if link.promisc != s.promisc {
            return differs("promiscuous mode", &link.promisc, &s.promisc);
        }
        if let Some(mtu) = s.link.mtu.filter(|m| *m != link.mtu) {
            return differs("MTU", &link.mtu, &mtu);
        }
        if let Some(on) = s.link.allmulti.filter(|on| *on != link.allmulti) {
            return differs("all-multicast mode", &link.allmulti, &on);
        }
        if let Some(q) = s.link.tx_qlen.filter(|q| *q != link.txqlen) {
            return differs("transmit queue length", &link.txqlen, &q);
        }
        Ok(())
    }

    // ---------------------------------------------------------------- DEL
    /// Puts back what the backup holds and removes it. Never fails: what cannot be
    /// restored is reported on stderr (the interface is about to go with its pod).
    fn del(&self, req: &Request) -> Result<(), Error> {
        let file = BackupFile::new(&del_dir(req), req.container_id(), req.ifname());
        if let Err(e) = restore(req, &file) {
            eprintln!("tuning DEL: {e}");
        }
        if let Err(e) = file.remove() {
            eprintln!("tuning DEL: {e}");
        }
        Ok(())
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    // ---------------------------------------------------------------- GC
    /// Nothing to collect: a backup is named by container and interface only, not by
    /// network, so the valid attachments of one network cannot tell another network's
    /// backups from stale ones; DEL removes each, also when the pod is gone.
    fn gc(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }
}

/// Write each sysctl inside the pod's netns; on a failure put back those written.
/// Returns the old values of those written.
fn write_sysctls(ns: &NetNs, s: &Settings) -> Result<Vec<(String, String)>, Error> {
    let mut written: Vec<(String, String)> = Vec::new();
    for (key, path, value) in &s.sysctls {
        let step = ns.run(|| -> Result<String, Error> {
            let old = sysctl::get(path)?;
            sysctl::set(path, value)?;
            Ok(old)
        });
        match step.map_err(Error::from).and_then(|r| r) {
            Ok(old) => written.push((path.clone(), old)),
            Err(e) => {
                restore_sysctls(ns, &written);
                return Err(e.context(format_args!("sysctl {key}")));
            }
        }
    }
    Ok(written)
}

fn restore_sysctls(ns: &NetNs, written: &[(String, String)]) {
    for (path, old) in written.iter().rev() {
        let undone = ns.run(|| sysctl::set(path, old));
        if let Err(e) = undone
            .map_err(Error::from)
            .and_then(|r| r.map_err(Error::from))
        {
            eprintln!("tuning: cannot put sysctl {path} back to {old:?}: {e}");
        }
    }
}

/// Back up, then set MAC, promisc, MTU, allmulti, queue length (the reference's order);
/// on a failure restore from the backup and drop it.
fn apply_link(req: &Request, nl: &mut Netlink, link: &Link, s: &Settings) -> Result<(), Error> {
    if s.link.is_empty() {
        return Ok(());
    }
    let file = BackupFile::new(&s.dir, req.container_id(), req.ifname());
    let mut backup = file.read()?.unwrap_or_default();
    backup.record(link, &s.link);
    file.write(&backup)?;
    let i = link.index;
    let want = &s.link;
    let steps = (|| -> crate::netlink::Result<()> {
        if let Some(mac) = &want.mac {
            nl.set_mac(i, mac)?;
        }
        if want.promisc == Some(true) {
            nl.set_promisc(i, true)?;
        }
        if let Some(mtu) = want.mtu {
            nl.set_mtu(i, mtu)?;
        }
        if let Some(on) = want.allmulti {
            nl.set_allmulti(i, on)?;
        }
        if let Some(q) = want.tx_qlen {
            nl.set_txqlen(i, q)?;
        }
        Ok(())
    })();
    if let Err(e) = steps {
        for failed in backup.restore(nl, i) {
            eprintln!("tuning: undoing the failed ADD: {failed}");
        }
        if let Err(rm) = file.remove() {
            eprintln!("tuning: undoing the failed ADD: {rm}");
        }
        return Err(e.into());
    }
    Ok(())
}

/// DEL's restore: nothing to do without a backup, a netns or the link.
fn restore(req: &Request, file: &BackupFile) -> Result<(), Error> {
    let Some(backup) = file.read()? else {
        return Ok(());
    };
    let Some(ns) = netns_for_del(req.netns())? else {
        return Ok(());
    };
    if is_own_netns(&ns)? {
        return Err(Error::invalid_config(format!(
            "CNI_NETNS {} is this plugin's own network namespace; leaving {} as it is",
            req.netns(),
            req.ifname()
        )));
    }
    let mut nl = Netlink::open_in(&ns)?;
    let Some(link) = nl.link_by_name(req.ifname())? else {
        return Ok(());
    };
    Error::all(backup.restore(&mut nl, link.index).into_iter().map(Err))
}

/// `dataDir` for DEL, whatever else the configuration gets wrong.
fn del_dir(req: &Request) -> PathBuf {
    match req.conf.raw.get("dataDir") {
        Some(Value::String(d)) if !d.is_empty() => PathBuf::from(d),
        _ => DEFAULT_DIR.into(),
    }
}

/// Sysctl values compared field by field: the kernel separates multi-value settings
/// (`net.ipv4.tcp_rmem`) with tabs where a configuration has spaces.
fn normalized(v: &str) -> Vec<&str> {
    v.split_whitespace().collect()
}

#[cfg(test)]
mod tests;
