//! The container's network namespace as CNI_NETNS names it, which the plugin
//! cannot trust to be a container's: a `/proc/<pid>/ns/net` whose pid was
//! recycled can be the host's own. ADD and CHECK refuse the plugin's own
//! namespace; DEL removes nothing there, and elsewhere only a link that is
//! recognisably the attachment's.

use crate::cni::{Code, Error};
use crate::netlink::{Link, NetNs, Netlink};
use std::fmt::Display;

/// The netns for ADD/CHECK; a missing one is "container unknown" (code 3),
/// any other failure (EPERM, …) a kernel error (see `cni::error`). The
/// plugin's own namespace is refused (code 4): configuring the host as if it
/// were a container would put the pod's interface, addresses and routes on
/// the host, and a later DEL would remove host links.
pub fn open_netns(path: &str) -> Result<NetNs, Error> {
    let ns = NetNs::open(path)?;
    if is_own_netns(&ns)? {
        return Err(Error::new(
            Code::InvalidEnv,
            format!("CNI_NETNS {path} is this plugin's own network namespace, not a container's"),
        ));
    }
    Ok(ns)
}

/// The netns for DEL: None when CNI_NETNS is empty or names a namespace that is gone,
/// since runtimes call DEL more than once and after the container is gone. What DEL does
/// in the plugin's own namespace is each caller's to say.
pub fn netns_for_del(path: &str) -> Result<Option<NetNs>, Error> {
    if path.is_empty() {
        return Ok(None);
    }
    match NetNs::open(path) {
        Ok(ns) => Ok(Some(ns)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The netns for a DEL that changes what is inside it: None when there is nothing to
/// change, because [`netns_for_del`] finds none or CNI_NETNS is the plugin's own
/// namespace, where DEL leaves `leaving` as it is (said on stderr).
pub fn container_netns_for_del(path: &str, leaving: impl Display) -> Result<Option<NetNs>, Error> {
    let Some(ns) = netns_for_del(path)? else {
        return Ok(None);
    };
    if is_own_netns(&ns)? {
        eprintln!(
            "DEL: CNI_NETNS {path} is this plugin's own network namespace; leaving {leaving}"
        );
        return Ok(None);
    }
    Ok(Some(ns))
}

/// Which container link a DEL may remove: one of `kind`, and for a veth with
/// `bridge` given (and existing), one whose host end is a port of it or
/// carries `owner`, the alias the plugin gave it. Anything else named like
/// CNI_IFNAME is someone else's and stays.
#[derive(Debug, Clone, Copy)]
pub struct OwnLink<'a> {
    pub kind: &'a str,
    pub bridge: Option<&'a str>,
    pub owner: Option<&'a str>,
}

/// DEL of the container interface: a missing netns or link means done. A
/// CNI_NETNS that is the plugin's own namespace (a recycled
/// `/proc/<pid>/ns/net`, a hostile runtime) and a link that is not ours are
/// reported on stderr and left alone: DEL succeeds, removing nothing there.
pub fn delete_container_link(netns_path: &str, ifname: &str, ours: OwnLink) -> Result<(), Error> {
    let leaving = format_args!("{ifname} there alone");
    let Some(ns) = container_netns_for_del(netns_path, leaving)? else {
        return Ok(());
    };
    let mut nl = Netlink::open_in(&ns)?;
    let Some(link) = nl.link_by_name(ifname)? else {
        return Ok(());
    };
    if let Some(why) = not_ours(&link, ours)? {
        eprintln!("DEL: {ifname} in {netns_path} {why}; leaving it alone");
        return Ok(());
    }
    match nl.delete_link(link.index) {
        Err(e) if e.is_not_found() => Ok(()),
        other => other.map_err(Error::from),
    }
}

/// Why `link` is not one `ours` describes, or None when it is.
fn not_ours(link: &Link, ours: OwnLink) -> Result<Option<String>, Error> {
    let kind = link.kind.as_deref().unwrap_or("device without kind");
    if kind != ours.kind {
        return Ok(Some(format!("is a {kind}, not a {}", ours.kind)));
    }
    let Some(bridge_name) = ours.bridge.filter(|b| !b.is_empty()) else {
        return Ok(None);
    };
    let mut host = Netlink::open()?;
    let peer = match link.link {
        Some(i) => host.link_by_index(i)?,
        None => None,
    };
    // A host end that names this attachment is ours, whatever its bridge,
    // without another read under the RTNL (links made before the alias
    // existed are checked by their bridge).
    if ours.owner.is_some() && peer.as_ref().and_then(|p| p.alias.as_deref()) == ours.owner {
        return Ok(None);
    }
    // A bridge that is gone cannot vouch for anything; the kind has to do.
    let Some(bridge) = host.link_by_name(bridge_name)? else {
        return Ok(None);
    };
    Ok(match peer {
        Some(p) if p.master == Some(bridge.index) => None,
        Some(p) => Some(format!(
            "has its host end {} outside bridge {bridge_name}",
            p.name
        )),
        None => Some("has no host end here".to_string()),
    })
}

/// Whether `ns` is the network namespace this thread is in: the host's, for
/// a plugin run by a runtime on the host.
pub fn is_own_netns(ns: &NetNs) -> Result<bool, Error> {
    Ok(ns.id()? == NetNs::current_id()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{BridgeSpec, VethSpec};
    use std::sync::mpsc;

    /// Runs `f` on a thread of its own in a fresh network namespace, which
    /// plays the host (the plugin's own namespace). Making one needs root;
    /// without it the calling test skips.
    fn in_fresh_netns(f: impl FnOnce() + Send + 'static) {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: needs root");
            return;
        }
        std::thread::spawn(move || {
            // SAFETY: moves only this thread into a new network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            f()
        })
        .join()
        .unwrap()
    }

    /// A second namespace ("the container"), held by a parked thread until
    /// the returned sender is dropped; its path names that thread's netns.
    fn container() -> (String, mpsc::Sender<()>) {
        let (path_tx, path_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            // SAFETY: moves only this thread into a new network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            // SAFETY: gettid cannot fail.
            let tid = unsafe { libc::gettid() };
            path_tx
                .send(format!("/proc/{}/task/{tid}/ns/net", std::process::id()))
                .unwrap();
            let _ = stop_rx.recv();
        });
        (path_rx.recv().unwrap(), stop_tx)
    }

    fn veth_into(host: &mut Netlink, ns: &NetNs, host_name: &str) {
        host.create_veth(VethSpec {
            host_name: host_name.into(),
            peer_name: "eth0".into(),
            peer_netns: ns,
            mtu: None,
            peer_mac: None,
            master: None,
        })
        .unwrap();
    }

    fn has_eth0(path: &str) -> bool {
        let ns = NetNs::open(path).unwrap();
        let mut nl = Netlink::open_in(&ns).unwrap();
        nl.link_by_name("eth0").unwrap().is_some()
    }

    #[test]
    fn add_into_the_plugins_own_netns_is_refused_and_del_removes_nothing_there() {
        in_fresh_netns(|| {
            let own = "/proc/thread-self/ns/net";
            let err = open_netns(own).unwrap_err();
            assert_eq!(err.code, Code::InvalidEnv as u32, "{err:?}");
            assert!(err.msg.contains("CNI_NETNS"), "{err:?}");
            // A host link named like CNI_IFNAME, of the very kind DEL removes.
            let (path, _stop) = container();
            let mut host = Netlink::open().unwrap();
            host.create_veth(VethSpec {
                host_name: "eth0".into(),
                peer_name: "peer0".into(),
                peer_netns: &NetNs::open(&path).unwrap(),
                mtu: None,
                peer_mac: None,
                master: None,
            })
            .unwrap();
            let ours = OwnLink {
                kind: "veth",
                bridge: None,
                owner: None,
            };
            delete_container_link(own, "eth0", ours).unwrap();
            assert!(has_eth0(own), "DEL removed the host's eth0");
        });
    }

    #[test]
    fn del_removes_only_a_link_of_the_attachments_kind_and_bridge() {
        in_fresh_netns(|| {
            let (path, _stop) = container();
            let ns = NetNs::open(&path).unwrap();
            let mut host = Netlink::open().unwrap();
            let br = |name: &str| BridgeSpec {
                name: name.into(),
                ..Default::default()
            };
            let ours_br = host.ensure_bridge(br("br-ours")).unwrap();
            host.ensure_bridge(br("br-other")).unwrap();
            veth_into(&mut host, &ns, "h0");
            let h0 = host.link_by_name("h0").unwrap().unwrap();
            let other = host.link_by_name("br-other").unwrap().unwrap();
            host.set_master(h0.index, other.index).unwrap();

            let macvlan = OwnLink {
                kind: "macvlan",
                bridge: None,
                owner: None,
            };
            delete_container_link(&path, "eth0", macvlan).unwrap();
            assert!(has_eth0(&path), "a veth was taken for a macvlan");
            let on_ours = OwnLink {
                kind: "veth",
                bridge: Some("br-ours"),
                owner: Some("cnikit bridge ours"),
            };
            delete_container_link(&path, "eth0", on_ours).unwrap();
            assert!(has_eth0(&path), "a veth of another bridge was removed");
            host.set_up_with_alias(h0.index, "cnikit bridge theirs", false)
                .unwrap();
            delete_container_link(&path, "eth0", on_ours).unwrap();
            assert!(has_eth0(&path), "an alias not the attachment's vouched");

            host.set_master(h0.index, ours_br.index).unwrap();
            delete_container_link(&path, "eth0", on_ours).unwrap();
            assert!(!has_eth0(&path), "a port of the bridge stayed");

            veth_into(&mut host, &ns, "h1");
            let h1 = host.link_by_name("h1").unwrap().unwrap();
            host.set_master(h1.index, other.index).unwrap();
            host.set_up_with_alias(h1.index, "cnikit bridge ours", false)
                .unwrap();
            delete_container_link(&path, "eth0", on_ours).unwrap();
            assert!(!has_eth0(&path), "a host end naming the attachment stayed");
        });
    }
}
