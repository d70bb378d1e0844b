//! loopback: bring `lo` up in the container. Runtimes (containerd's CRI, CRI-O)
//! call it for every pod with `CNI_IFNAME=lo`; whatever ifname is given, only
//! `lo` is touched, as in the reference plugin.

use crate::cni::{CniResult, Code, Error, Interface, IpConfig, Plugin, Request};
use crate::netlink::{Link, Netlink};
use crate::plugins::pod_netns::{container_netns_for_del, open_netns};
use ipnet::IpNet;

pub struct Loopback;

const LO: &str = "lo";

impl Plugin for Loopback {
    // ---------------------------------------------------------------- ADD
    /// A chained loopback passes `prevResult` through; alone it reports `lo`
    /// with its first IPv4 and first IPv6 address (127.0.0.1/8, ::1/128).
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let ns = open_netns(req.netns())?;
        let mut nl = Netlink::open_in(&ns)?;
        let lo = loopback_link(&mut nl, req.netns())?;
        nl.set_up(lo.index)?;
        let addrs = nl.addresses(lo.index)?;
        if let Some(bad) = addrs.iter().find(|a| !a.addr().is_loopback()) {
            return Err(Error::new(
                Code::Kernel,
                format!(
                    "{LO} in netns {} has a non-loopback address {bad}",
                    req.netns()
                ),
            ));
        }
        if let Some(prev) = &req.conf.prev_result {
            return Ok(prev.clone());
        }
        Ok(lo_result(&addrs, req.netns()))
    }

    // ---------------------------------------------------------------- CHECK
    fn check(&self, req: &Request) -> Result<(), Error> {
        let ns = open_netns(req.netns())?;
        let mut nl = Netlink::open_in(&ns)?;
        if !loopback_link(&mut nl, req.netns())?.up {
            return Err(Error::check_failed(format_args!(
                "{LO} in netns {} is down",
                req.netns()
            )));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- DEL
    /// Sets `lo` down like the reference; a netns that is already gone (or
    /// none given) is success, since runtimes call DEL more than once.
    fn del(&self, req: &Request) -> Result<(), Error> {
        // Setting the host's own lo down would cut every local service off.
        let Some(ns) = container_netns_for_del(req.netns(), format_args!("{LO} up"))? else {
            return Ok(());
        };
        let mut nl = Netlink::open_in(&ns)?;
        match nl.link_by_name(LO)? {
            Some(lo) => Ok(nl.set_down(lo.index)?),
            None => Ok(()),
        }
    }

    // ---------------------------------------------------------------- STATUS
    fn status(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    // ---------------------------------------------------------------- GC
    /// Nothing outlives a netns here.
    fn gc(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }
}

fn loopback_link(nl: &mut Netlink, netns: &str) -> Result<Link, Error> {
    nl.link_by_name(LO)?
        .ok_or_else(|| Error::new(Code::Kernel, format!("netns {netns} has no {LO} interface")))
}

fn lo_result(addrs: &[IpNet], netns: &str) -> CniResult {
    let first = |v4: bool| addrs.iter().find(|a| a.addr().is_ipv4() == v4).copied();
    CniResult {
        interfaces: vec![Interface {
            name: LO.to_string(),
            mac: "00:00:00:00:00:00".to_string(),
            sandbox: netns.to_string(),
            ..Default::default()
        }],
        ips: [first(true), first(false)]
            .into_iter()
            .flatten()
            .map(|address| IpConfig {
                address,
                gateway: None,
                interface: Some(0),
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_reports_first_address_of_each_family() {
        let addrs: Vec<IpNet> = ["127.0.0.1/8", "127.0.0.2/8", "::1/128"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let r = lo_result(&addrs, "/run/netns/p");
        assert_eq!(r.interfaces[0].name, "lo");
        assert_eq!(r.interfaces[0].mac, "00:00:00:00:00:00");
        let got: Vec<String> = r.ips.iter().map(|i| i.address.to_string()).collect();
        assert_eq!(got, ["127.0.0.1/8", "::1/128"]);
        assert!(r.ips.iter().all(|i| i.interface == Some(0)));
    }

    #[test]
    fn ipv4_only_netns_reports_one_address() {
        let addrs: Vec<IpNet> = vec!["127.0.0.1/8".parse().unwrap()];
        assert_eq!(lo_result(&addrs, "/n").ips.len(), 1);
    }
}
