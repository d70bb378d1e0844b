//! bridge `ipMasq` and `macspoofchk`: the firewall steps of ADD, DEL and GC.
//! Everything is tagged with the attachment, so DEL and GC need no netns.

use super::Conf;
use crate::cni::{CniResult, Error, Request};
use crate::firewall::{macspoof, Del, Firewall};
use crate::netlink::Netlink;
use crate::plugins::ipam_delegation::ipam_rollback_on_error;
use crate::plugins::masquerade;

/// ipMasq and macspoofchk, once addressing succeeded. A failure releases the
/// IPAM reservation (the caller removes the veth); each firewall call is one
/// atomic batch, and macspoofchk failing removes what ipMasq added.
pub(super) fn add(
    fw: &dyn Firewall,
    req: &Request,
    conf: &Conf,
    host_veth: &str,
    cont: &mut Netlink,
    peer_index: u32,
    result: CniResult,
) -> Result<CniResult, Error> {
    if !conf.masq.ip_masq && !conf.macspoofchk {
        return Ok(result);
    }
    let step = || -> Result<(), Error> {
        let mac = match conf.macspoofchk {
            true => cont.link_by_index(peer_index)?.and_then(|l| l.mac),
            false => None,
        };
        apply_add(fw, req, conf, host_veth, mac.as_deref(), &result)
    };
    ipam_rollback_on_error(req, step)?;
    Ok(result)
}

/// The firewall requests of ADD, given the container's MAC (what the
/// unit tests drive with a recording backend).
pub(super) fn apply_add(
    fw: &dyn Firewall,
    req: &Request,
    conf: &Conf,
    host_veth: &str,
    mac: Option<&str>,
    result: &CniResult,
) -> Result<(), Error> {
    if conf.masq.ip_masq {
        masquerade::add(fw, req, result, &conf.masq.ip_masq_exclude)?;
    }
    if conf.macspoofchk {
        let att = req.attachment();
        let spoof = macspoof::Op::add(&att, host_veth, mac.unwrap_or_default())
            .and_then(|op| fw.apply(op.into()));
        if let (Err(_), true) = (&spoof, conf.masq.ip_masq) {
            let _ = masquerade::undo(fw, req);
        }
        spoof?;
    }
    Ok(())
}

/// With a prevResult, by the keys ADD made from it (the cost does not grow
/// with the pods on the node); without one, by tag, which also works when
/// the netns (and the veth with it) is already gone.
pub(super) fn del(fw: &dyn Firewall, req: &Request, conf: &Conf) -> Result<(), Error> {
    let att = req.attachment();
    let prev = req.conf.prev_result.as_ref();
    if conf.masq.ip_masq {
        masquerade::del(fw, req, &conf.masq.ip_masq_exclude)?;
    }
    if conf.macspoofchk {
        let op = match prev.and_then(|p| spoof_guard(p, &conf.bridge, req.ifname())) {
            Some((host_ifname, mac)) => macspoof::Op::DelKeys {
                att,
                host_ifname,
                mac,
            },
            None => macspoof::Op::Del(Del { att }),
        };
        fw.apply(op.into())?;
    }
    Ok(())
}

/// The host port and container MAC an ADD guarded, as its result lists them:
/// the interface outside any sandbox that is not the bridge, and the
/// container's interface.
fn spoof_guard(prev: &CniResult, bridge: &str, ifname: &str) -> Option<(String, String)> {
    let host = prev
        .interfaces
        .iter()
        .find(|i| i.sandbox.is_empty() && i.name != bridge)?;
    let cont = prev
        .interfaces
        .iter()
        .find(|i| !i.sandbox.is_empty() && i.name == ifname)?;
    (!cont.mac.is_empty()).then(|| (host.name.clone(), cont.mac.clone()))
}

/// Whatever this network's attachments left behind, whatever the config
/// says now.
pub(super) fn gc(fw: &dyn Firewall, req: &Request) -> Result<(), Error> {
    let Some(gc) = masquerade::gc_request(req)? else {
        return Ok(());
    };
    let masq = masquerade::gc(fw, gc.clone());
    let spoof = fw.apply(macspoof::Op::Gc(gc).into());
    Error::all([masq, spoof.map_err(Error::from)])
}
