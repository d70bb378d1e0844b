//! dummy: a dummy link named CNI_IFNAME in the pod, addressed from IPAM, which is
//! required. A purely virtual interface that routes to its addresses without
//! transmitting: an address for applications to bind to, next to another plugin's
//! interface (as the reference README puts it).

use super::child::{address_from_ipam, del_single_iface, status_if_supported};
use crate::cni::{CniResult, Command, Error, Plugin, Request};
use crate::netlink::{Link, Netlink};
use crate::plugins::ipam_delegation::{ipam_if_configured, require_ipam};
use crate::plugins::pod_interface::{
    ensure_ifname_free, expect_kind, expect_mac, find_container_link,
};
use crate::plugins::pod_netns::open_netns;

pub struct Dummy;

/// `IFLA_INFO_KIND`, and the only kind of link DEL removes.
const KIND: &str = "dummy";

impl Plugin for Dummy {
    // The reference dummy never decodes CNI_ARGS (its IPAM plugin does, by its own rule):
    // the default, `reads_cni_args` false.

    // ---------------------------------------------------------------- ADD
    /// The link first, then IPAM, as in the reference: a kernel without dummy support
    /// fails (101) before anything is leased. A failure after the create removes the link
    /// again, and one after IPAM's ADD releases what it gave.
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        require_ipam(req, "dummy")?;
        let ns = open_netns(req.netns())?;
        let mut cont = Netlink::open_in(&ns)?;
        ensure_ifname_free(&mut cont, req.ifname(), req.netns())?;
        let link = cont.create_dummy(req.ifname())?;
        address_from_ipam(req, &ns, &mut cont, link.index).inspect_err(|_| {
            if let Err(e) = cont.delete_link(link.index) {
                eprintln!("cleanup after failed ADD: {e}");
            }
        })
    }

    // ---------------------------------------------------------------- CHECK
    /// IPAM's CHECK, then the link of prevResult in the pod: a dummy, up, with
    /// prevResult's MAC, addresses and routes.
    fn check(&self, req: &Request) -> Result<(), Error> {
        require_ipam(req, "dummy")?;
        let Some(prev) = &req.conf.prev_result else {
            return Err(Error::invalid_config("CHECK needs prevResult"));
        };
        ipam_if_configured(req, Command::Check)?;
        let mut found = find_container_link(req, prev)?;
        expect_dummy(&found.link, &prev.interfaces[found.pos].mac)?;
        found.check_iface_state(prev)
    }

    // ---------------------------------------------------------------- DEL
    /// IPAM's DEL, then the link; both run even if one fails. A netns or link that is
    /// gone is done (runtimes repeat DEL), and a link named CNI_IFNAME that is not a dummy
    /// is someone else's and stays. Nothing here reads a plugin key, so no configuration
    /// can block it (an `ipam` section DEL cannot decode is no IPAM, see `NetConf`).
    fn del(&self, req: &Request) -> Result<(), Error> {
        del_single_iface(req, KIND)
    }

    // ---------------------------------------------------------------- STATUS
    /// IPAM's STATUS, after the kernel: without dummy support no ADD can succeed (50).
    fn status(&self, req: &Request) -> Result<(), Error> {
        require_ipam(req, "dummy")?;
        let supported = Netlink::open()?.dummy_supported()?;
        status_if_supported(
            req,
            supported,
            "this kernel has no dummy support (CONFIG_DUMMY), so ADD cannot create dummy links",
        )
    }

    // ---------------------------------------------------------------- GC
    /// IPAM's GC: the links go with their pods' netns.
    fn gc(&self, req: &Request) -> Result<(), Error> {
        ipam_if_configured(req, Command::Gc)
    }
}

/// CHECK: the link is a dummy, up, with the MAC prevResult gives (if it gives one).
fn expect_dummy(link: &Link, mac: &str) -> Result<(), Error> {
    expect_kind(link, KIND)?;
    expect_mac(link, mac)?;
    if !link.up {
        return Err(Error::check_failed(format_args!("{} is down", link.name)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Code;
    use crate::plugins::firewall_backend::test_request;
    use serde_json::json;

    fn link(kind: Option<&str>, mac: &str, up: bool) -> Link {
        Link {
            index: 3,
            name: "eth0".into(),
            kind: kind.map(str::to_string),
            mac: Some(mac.into()),
            mtu: 1500,
            master: None,
            up,
            promisc: false,
            allmulti: false,
            txqlen: 1000,
            link: None,
            macvlan_mode: None,
            ipvlan_mode: None,
            alias: None,
            bridge_default_pvid: None,
        }
    }

    #[test]
    fn check_wants_an_up_dummy_with_the_results_mac() {
        let mac = "ee:2d:0a:58:01:02";
        expect_dummy(&link(Some("dummy"), mac, true), mac).unwrap();
        expect_dummy(&link(Some("dummy"), mac, true), "EE:2D:0A:58:01:02").unwrap();
        expect_dummy(&link(Some("dummy"), mac, true), "").unwrap();
        for (l, needle) in [
            (link(Some("veth"), mac, true), "not a dummy"),
            (link(None, mac, true), "device without kind"),
            (link(Some("dummy"), "ee:2d:0a:58:01:03", true), "MAC"),
            (link(Some("dummy"), mac, false), "is down"),
        ] {
            let e = expect_dummy(&l, mac).unwrap_err();
            assert_eq!(e.code, Code::Kernel as u32);
            assert!(e.msg.contains(needle), "{needle}: {}", e.msg);
        }
    }

    /// ADD, CHECK and STATUS without IPAM are the reference's error, before any netns
    /// or kernel call (the test's netns does not exist).
    #[test]
    fn ipam_is_required() {
        for ipam in [None, Some(json!({})), Some(json!({"type": ""}))] {
            let mut conf = json!({"cniVersion": "1.1.0", "name": "n", "type": "dummy"});
            if let Some(ipam) = ipam {
                conf["ipam"] = ipam;
            }
            for command in [Command::Add, Command::Check, Command::Status] {
                let outcome = Dummy.call(&test_request(command, conf.clone()));
                let e = outcome.expect_err("no IPAM");
                assert_eq!(e.code, 7, "{command:?}: {e:?}");
                assert!(e.msg.contains("requires an IPAM"), "{}", e.msg);
            }
            // GC without IPAM has nothing to collect.
            Dummy.gc(&test_request(Command::Gc, conf)).unwrap();
        }
    }
}
