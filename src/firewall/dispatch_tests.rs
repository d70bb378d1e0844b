//! A network's set, chain and base-chain rule go with its last pod, on the
//! kernel (need root: only under the isolated test runner).

use super::{ip_masq, pm_hairpin, Dispatch};
use crate::firewall::cleanup::{Del, Gc};
use crate::firewall::portmap::{self, Mapping, Masquerade, Proto, Spec};
use crate::firewall::schema::{INET, MASQ_BASE, PM_MASQ_BASE};
use crate::firewall::store::read;
use crate::firewall::test_netns::in_new_netns;
use crate::firewall::{masq, Attachment, Request, Sockets};
use ipnet::IpNet;

const SUBNET: &str = "10.9.0.0/24";

fn subnet() -> IpNet {
    SUBNET.parse().expect("net")
}

fn run(op: impl Into<Request>) {
    op.into()
        .run(&Sockets::default())
        .expect("firewall operation");
}

fn masq_add(network: &str, id: &str, addr: &str) -> masq::Op {
    masq::Op::Add {
        att: Attachment::new(network, id, "eth0"),
        addrs: vec![addr.parse().expect("ip")],
        subnets: vec![subnet()],
    }
}

fn masq_del(network: &str, id: &str) -> masq::Op {
    masq::Op::Del(Del {
        att: Attachment::new(network, id, "eth0"),
    })
}

/// Whether the set, its chain and the base-chain rule naming the set exist.
fn present(d: &Dispatch, base: &str) -> (bool, bool, bool) {
    read(&Sockets::default(), |nft| {
        Ok((
            nft.set_exists(INET, &d.set.name)?,
            nft.chain_exists(INET, &d.chain.name)?,
            nft.rule_looking_up(INET, base, &d.set.name)?.is_some(),
        ))
    })
    .expect("read the ruleset")
}

#[test]
fn a_networks_last_pod_takes_its_set_chain_and_rule() {
    in_new_netns("disp-last", || {
        let d = ip_masq(true, &[subnet()]);
        run(masq_add("net", "c1", "10.9.0.2"));
        run(masq_add("net", "c2", "10.9.0.3"));
        run(masq_del("net", "c1"));
        assert_eq!(present(&d, MASQ_BASE), (true, true, true), "c2 is left");
        run(masq_del("net", "c2"));
        assert_eq!(present(&d, MASQ_BASE), (false, false, false));
        // Runtimes repeat DEL; the network's next pod makes them again.
        run(masq_del("net", "c2"));
        run(masq_add("net", "c3", "10.9.0.4"));
        assert_eq!(present(&d, MASQ_BASE), (true, true, true));
    });
}

/// Networks with the same subnets share the set: one network's last pod
/// leaves it to the other's.
#[test]
fn a_set_another_network_still_uses_stays() {
    in_new_netns("disp-shared", || {
        let d = ip_masq(true, &[subnet()]);
        run(masq_add("net", "c1", "10.9.0.2"));
        run(masq_add("other", "c2", "10.9.0.3"));
        run(masq_del("net", "c1"));
        assert_eq!(present(&d, MASQ_BASE), (true, true, true));
        run(masq::Op::Gc(Gc {
            network: "other".into(),
            valid: vec![],
        }));
        assert_eq!(present(&d, MASQ_BASE), (false, false, false));
    });
}

#[test]
fn portmaps_hairpin_set_goes_with_the_last_pod() {
    in_new_netns("disp-pm", || {
        let spec = Spec {
            att: Attachment::new("net", "c1", "eth0"),
            container: vec!["10.9.0.2/24".parse().expect("net")],
            mappings: vec![Mapping {
                host_ip: None,
                host_port: 18080,
                proto: Proto::Tcp,
                container_port: 80,
            }],
            masq: Masquerade {
                snat: true,
                masq_all: false,
            },
        };
        let d = pm_hairpin(subnet());
        run(portmap::Op::Add(spec.clone()));
        assert_eq!(present(&d, PM_MASQ_BASE), (true, true, true));
        run(portmap::Op::Del(Del { att: spec.att }));
        assert_eq!(present(&d, PM_MASQ_BASE), (false, false, false));
    });
}
