//! bridge `ipMasq` and `macspoofchk`: the firewall steps of ADD, DEL and GC.
//! Everything is tagged with the attachment, so DEL and GC need no netns.

use super::Conf;
use crate::cni::{CniResult, Error, Request};
use crate::firewall::{self, Attachment};
use crate::netlink::Netlink;
use crate::plugins::common::{ipam_rollback_on_error, valid_attachments};
use ipnet::IpNet;
use std::net::IpAddr;

fn attachment(req: &Request) -> Attachment {
    Attachment::new(&req.conf.name, req.container_id(), req.ifname())
}

/// ipMasq and macspoofchk, once addressing succeeded. A failure releases the
/// IPAM reservation (the caller removes the veth); each firewall call is one
/// atomic batch, and macspoofchk failing removes what ipMasq added.
pub(super) fn add(
    req: &Request,
    conf: &Conf,
    host_veth: &str,
    cont: &mut Netlink,
    peer_index: u32,
    result: CniResult,
) -> Result<CniResult, Error> {
    if !conf.ip_masq && !conf.macspoofchk {
        return Ok(result);
    }
    let att = attachment(req);
    let step = || -> Result<(), Error> {
        if conf.ip_masq && !result.ips.is_empty() {
            let addrs: Vec<IpAddr> = result.ips.iter().map(|ip| ip.address.addr()).collect();
            let subnets: Vec<IpNet> = result.ips.iter().map(|ip| ip.address.trunc()).collect();
            firewall::masq::add(&att, &addrs, &subnets)?;
        }
        if conf.macspoofchk {
            let mac = cont.link_by_index(peer_index)?.and_then(|l| l.mac);
            let spoof = firewall::macspoof::add(&att, host_veth, &mac.unwrap_or_default());
            if let (Err(_), true) = (&spoof, conf.ip_masq) {
                let _ = firewall::masq::del(&att);
            }
            spoof?;
        }
        Ok(())
    };
    ipam_rollback_on_error(req, step)?;
    Ok(result)
}

/// By tag: works when the netns (and the veth with it) is already gone.
pub(super) fn del(req: &Request, conf: &Conf) -> Result<(), Error> {
    if conf.ip_masq {
        firewall::masq::del(&attachment(req))?;
    }
    if conf.macspoofchk {
        firewall::macspoof::del(&attachment(req))?;
    }
    Ok(())
}

/// Whatever this network's attachments left behind, whatever the config
/// says now.
pub(super) fn gc(req: &Request) -> Result<(), Error> {
    let Some(valid) = valid_attachments(req)? else {
        return Ok(());
    };
    let masq = firewall::masq::gc(&req.conf.name, &valid);
    let spoof = firewall::macspoof::gc(&req.conf.name, &valid);
    Error::all([masq.map_err(Error::from), spoof.map_err(Error::from)])
}
