//! What travels between a plugin and the daemon's firewall service: every
//! request decodes to the operation that was sent, errors keep their kind,
//! and the service's permission check.

use super::conntrack::{self, UdpPort};
use super::portmap::{Mapping, Masquerade, Proto, Spec};
use super::service::{Done, Envelope, Firewall, FORBIDDEN};
use super::{
    forward, macspoof, masq, portmap, Attachment, Del, Error, ErrorKind, Gc, Isolation, Request,
};
use ipamd::service::{target, Endpoint, Peer, Refusal, Service, DECLINED};

fn att() -> Attachment {
    Attachment::new("n", "c1", "eth0")
}

fn forward_spec() -> forward::Spec {
    forward::Spec {
        att: att(),
        addrs: vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
        admin_chain: "CNI-ADMIN".into(),
        isolation: Some(Isolation {
            bridge: "cni0".into(),
            isolated: false,
        }),
    }
}

fn every_kind_of_request() -> Vec<Request> {
    let del = Del { att: att() };
    let gc = Gc {
        network: "n".into(),
        valid: vec![Attachment::new("n", "c2", "eth1")],
    };
    let container = vec![
        "10.1.0.2/24".parse().unwrap(),
        "fd00::2/64".parse().unwrap(),
    ];
    let mappings = vec![Mapping {
        host_ip: Some("127.0.0.1".parse().unwrap()),
        host_port: 8080,
        proto: Proto::Tcp,
        container_port: 80,
    }];
    let masq_opts = Masquerade {
        snat: true,
        masq_all: false,
    };
    vec![
        portmap::Op::Add(Spec {
            att: att(),
            container: container.clone(),
            mappings: mappings.clone(),
            masq: masq_opts,
        })
        .into(),
        portmap::Op::Check(Spec {
            att: att(),
            container,
            mappings,
            masq: masq_opts,
        })
        .into(),
        portmap::Op::Del(del.clone()).into(),
        portmap::Op::Gc(gc.clone()).into(),
        masq::Op::Add {
            att: att(),
            addrs: vec!["10.1.0.2".parse().unwrap()],
            subnets: vec!["10.1.0.0/24".parse().unwrap()],
        }
        .into(),
        masq::Op::Del(del.clone()).into(),
        masq::Op::Gc(gc.clone()).into(),
        masq::Op::Check {
            att: att(),
            addrs: vec!["10.1.0.2".parse().unwrap()],
            subnets: vec!["10.1.0.0/24".parse().unwrap()],
        }
        .into(),
        macspoof::Op::add(&att(), "veth1", "0a:58:0a:01:00:02")
            .unwrap()
            .into(),
        macspoof::Op::Del(del.clone()).into(),
        macspoof::Op::Gc(gc.clone()).into(),
        conntrack::Op::FlushUdp {
            targets: vec![UdpPort {
                port: 8080,
                dst: None,
                ipv6: true,
            }],
        }
        .into(),
        forward::Op::Add(forward_spec()).into(),
        forward::Op::Check(forward_spec()).into(),
        forward::Op::Del(forward::Forget {
            att: att(),
            addrs: vec!["10.1.0.2".parse().unwrap()],
        })
        .into(),
        forward::Op::Gc(gc.clone()).into(),
    ]
}

#[test]
fn every_request_decodes_to_the_operation_sent() {
    for request in every_kind_of_request() {
        let sent = Envelope { netns: 7, request };
        let wire = serde_json::to_vec(&sent).unwrap();
        let got: Envelope = serde_json::from_slice(&wire).unwrap();
        assert_eq!(got.request, sent.request);
        assert_eq!(got.netns, 7);
        assert_eq!(got.op(), sent.request.name());
        assert_eq!(
            target::<Firewall>(&got),
            format!("/v1/ext/firewall.{}", sent.request.name())
        );
    }
}

#[test]
fn the_wire_spelling_stays() {
    let env = Envelope {
        netns: 1,
        request: masq::Op::Del(Del { att: att() }).into(),
    };
    assert_eq!(
        serde_json::to_string(&env).unwrap(),
        r#"{"netns":1,"request":{"op":"masq-del","att":{"network":"n","container_id":"c1","ifname":"eth0"}}}"#
    );
    assert_eq!(serde_json::to_string(&Done {}).unwrap(), "{}");
}

#[test]
fn errors_keep_their_kind_over_the_wire() {
    for kind in [
        ErrorKind::Conflict,
        ErrorKind::Mismatch,
        ErrorKind::Unsupported,
        ErrorKind::Other,
    ] {
        let sent = Error::new(kind, "host port tcp/8080 belongs to another container");
        let wire = serde_json::to_vec(&sent).unwrap();
        let got: Error = serde_json::from_slice(&wire).unwrap();
        assert_eq!(got.kind, kind);
        assert_eq!(got.message, sent.message);
    }
    assert_eq!(Firewall::malformed("x".into()).kind, ErrorKind::Other);
}

/// A peer as the kernel would describe it: `uid`, whether CAP_NET_ADMIN is in
/// its effective set, and whether it is in this (the daemon's) network namespace.
fn peer(uid: u32, cap_net_admin: bool, here: bool) -> Peer {
    let mut netns = Peer::netns_of_this_thread().expect("own netns");
    if !here {
        netns.ino = netns.ino.wrapping_add(1);
    }
    Peer {
        netns: Some(netns),
        ..Peer::with_uid(uid, cap_net_admin)
    }
}

/// The caller's claim about its namespace is whatever it writes: `claim`.
fn envelope(claim: u64) -> Envelope {
    Envelope {
        netns: claim,
        request: masq::Op::Del(Del { att: att() }).into(),
    }
}

fn own_claim() -> u64 {
    Peer::netns_of_this_thread().expect("own netns").ino
}

fn declined(r: Result<(), Refusal<Error>>) -> String {
    match r {
        Err(Refusal::Declined(e)) => e.message,
        Err(Refusal::Failed(status, e)) => panic!("failed with {status}, not {DECLINED}: {e:?}"),
        Ok(()) => panic!("permitted"),
    }
}

fn forbidden(r: Result<(), Refusal<Error>>) -> String {
    match r {
        Err(Refusal::Failed(FORBIDDEN, e)) => e.message,
        Err(Refusal::Failed(status, e)) => panic!("failed with {status}, not 403: {e:?}"),
        Err(Refusal::Declined(e)) => panic!("declined, not refused: {e:?}"),
        Ok(()) => panic!("permitted"),
    }
}

#[test]
fn root_with_net_admin_in_the_daemons_netns_is_served() {
    let ok = Firewall::default().permit(&peer(0, true, true), &envelope(own_claim()));
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn capability_less_root_is_refused_whatever_it_claims() {
    let msg = forbidden(Firewall::default().permit(&peer(0, false, true), &envelope(own_claim())));
    assert!(msg.contains("CAP_NET_ADMIN"), "{msg}");
}

#[test]
fn root_in_another_netns_is_declined_even_when_it_claims_ours() {
    let msg = declined(Firewall::default().permit(&peer(0, true, false), &envelope(own_claim())));
    assert!(msg.contains("network namespace"), "{msg}");
    // Without capabilities as well: its own fallback decides what it may do there.
    declined(Firewall::default().permit(&peer(0, false, false), &envelope(own_claim())));
}

#[test]
fn a_peer_of_unknown_netns_is_not_served() {
    let unknown = Peer {
        netns: None,
        ..peer(0, true, true)
    };
    declined(Firewall::default().permit(&unknown, &envelope(own_claim())));
}

#[test]
fn non_root_is_refused_without_the_capability_and_declined_with_it() {
    forbidden(Firewall::default().permit(&peer(1000, false, true), &envelope(own_claim())));
    let msg = declined(Firewall::default().permit(&peer(1000, true, true), &envelope(own_claim())));
    assert!(msg.contains("root only"), "{msg}");
}
