//! Link ownership: a link cnikit makes on the host for one attachment (a
//! bridge port's veth, a bandwidth ifb) names its owner in its alias,
//! `cnikit <plugin> <network>/<containerID>/<ifname>` (the attachment's tag).
//! Host-side names are random or shared with the reference, so only the alias
//! lets GC find the links of attachments the runtime no longer has: without
//! it, GC would free a gone pod's address while its veth still held it on the
//! bridge, and the next pod given that address would share it.

use crate::cni::{Attachment, Command, Error, Request};
use crate::netlink::{Link, Netlink};
use crate::plugins::ipam_delegation::ipam_if_configured;
use crate::plugins::pod_netns::{delete_container_link, OwnLink};

/// The alias that marks a link as `plugin`'s, made for `att`.
pub fn alias(plugin: &str, att: &Attachment) -> String {
    format!("{}{}", alias_prefix(plugin), att.tag())
}

/// The alias prefix shared by `plugin`'s links of every attachment of `network`.
pub fn network_alias_prefix(plugin: &str, network: &str) -> String {
    format!(
        "{}{}",
        alias_prefix(plugin),
        Attachment::tag_prefix(network)
    )
}

/// The alias prefix of every link `plugin` owns.
pub fn alias_prefix(plugin: &str) -> String {
    format!("cnikit {plugin} ")
}

/// `plugin`'s links of `kind` made for attachments of `network` that are not
/// in `valid` (GC's list): what a GC removes.
pub fn stale_links(
    host: &mut Netlink,
    kind: &str,
    plugin: &str,
    network: &str,
    valid: &[Attachment],
) -> Result<Vec<Link>, Error> {
    let prefix = network_alias_prefix(plugin, network);
    let keep: Vec<String> = valid.iter().map(|a| alias(plugin, a)).collect();
    let links = host.links()?;
    Ok(links
        .into_iter()
        .filter(|l| l.is_kind(kind))
        .filter(|l| {
            l.alias
                .as_deref()
                .is_some_and(|a| a.starts_with(&prefix) && !keep.iter().any(|k| k == a))
        })
        .collect())
}

/// GC of `plugin`'s links of `kind` (and so, for a veth, the pod end too): those
/// of this network whose attachment is not in the request's valid list.
pub fn remove_stale(req: &Request, kind: &str, plugin: &str) -> Result<(), Error> {
    let Some(valid) = req.conf.valid_attachments()? else {
        return Ok(());
    };
    let mut host = Netlink::open()?;
    let stale = stale_links(&mut host, kind, plugin, &req.conf.name, &valid)?;
    delete_links(&mut host, &stale)
}

/// Deletes every link of `links`; one already gone (say, with its netns) is
/// done. Every deletion is tried; the failures are reported together.
pub fn delete_links(host: &mut Netlink, links: &[Link]) -> Result<(), Error> {
    let steps = links.iter().map(|l| match host.delete_link(l.index) {
        Err(e) if e.is_not_found() => Ok(()),
        other => other.map_err(Error::from),
    });
    Error::all(steps.collect::<Vec<_>>())
}

/// GC of a plugin whose attachments each own a host veth named `plugin`'s (bridge, ptp).
/// The veths of attachments not in the valid list go first, so that no address IPAM
/// then frees is still held by a stale interface; then IPAM's GC; then `firewall_gc`,
/// the plugin's firewall state. The spec: continue past individual errors, report them.
pub fn gc_stale_veths(
    req: &Request,
    plugin: &str,
    firewall_gc: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let links = remove_stale(req, "veth", plugin);
    let ipam = ipam_if_configured(req, Command::Gc);
    let rules = firewall_gc();
    Error::all([links, ipam, rules])
}

/// DEL of an attachment that owns a veth (bridge, ptp): IPAM's DEL, then `firewall_del`
/// (the plugin's rules), then the veth `ours` describes. Every step runs even if an earlier
/// one failed, so that one broken piece (say, an unusable IPAM store) does not strand the
/// others' state; the failures are reported together.
pub fn del_veth_attachment(
    req: &Request,
    firewall_del: impl FnOnce() -> Result<(), Error>,
    ours: OwnLink,
) -> Result<(), Error> {
    let ipam = ipam_if_configured(req, Command::Del);
    let rules = firewall_del();
    let link = delete_container_link(req.netns(), req.ifname(), ours);
    Error::all([ipam, rules, link])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_prefix_does_not_match_a_longer_network_name() {
        let a = Attachment::new("pods", "c1", "eth0");
        assert_eq!(alias("bridge", &a), "cnikit bridge pods/c1/eth0");
        let other = alias("bridge", &Attachment::new("pods2", "c1", "eth0"));
        assert!(!other.starts_with(&network_alias_prefix("bridge", "pods")));
        assert!(alias("bridge", &a).starts_with(&network_alias_prefix("bridge", "pods")));
    }
}
