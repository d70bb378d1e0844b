//! What travels between a plugin and the daemon's firewall service: every
//! request decodes to the operation that was sent, errors keep their kind,
//! and the service's permission check.

use super::conntrack::{self, UdpPort};
use super::portmap::{Mapping, Masquerade, Proto};
use super::service::{Done, Envelope, Firewall};
use super::socket::current_netns;
use super::{macspoof, masq, portmap, Attachment, Error, ErrorKind, Request};
use ipamd::service::{target, Peer, Refusal, Service, DECLINED};

fn att() -> Attachment {
    Attachment::new("n", "c1", "eth0")
}

fn every_kind_of_request() -> Vec<Request> {
    let valid = vec![Attachment::new("n", "c2", "eth1")];
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
        portmap::Op::Add {
            att: att(),
            container: container.clone(),
            mappings: mappings.clone(),
            masq: masq_opts,
        }
        .into(),
        portmap::Op::Check {
            att: att(),
            container,
            mappings,
            masq: masq_opts,
        }
        .into(),
        portmap::Op::Del { att: att() }.into(),
        portmap::Op::Gc {
            network: "n".into(),
            valid: valid.clone(),
        }
        .into(),
        masq::Op::Add {
            att: att(),
            addrs: vec!["10.1.0.2".parse().unwrap()],
            subnets: vec!["10.1.0.0/24".parse().unwrap()],
        }
        .into(),
        masq::Op::Del { att: att() }.into(),
        masq::Op::Gc {
            network: "n".into(),
            valid: valid.clone(),
        }
        .into(),
        macspoof::Op::add(&att(), "veth1", "0a:58:0a:01:00:02")
            .unwrap()
            .into(),
        macspoof::Op::Del { att: att() }.into(),
        macspoof::Op::Gc {
            network: "n".into(),
            valid,
        }
        .into(),
        conntrack::Op::FlushUdp {
            targets: vec![UdpPort {
                port: 8080,
                dst: None,
                ipv6: true,
            }],
        }
        .into(),
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
        assert_eq!(Firewall::op(&got), sent.request.name());
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
        request: masq::Op::Del { att: att() }.into(),
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

fn peer(uid: u32) -> Peer {
    Peer {
        uid,
        gid: uid,
        groups: vec![],
    }
}

fn envelope(netns: u64) -> Envelope {
    Envelope {
        netns,
        request: masq::Op::Del { att: att() }.into(),
    }
}

#[test]
fn root_in_the_daemons_netns_is_served() {
    let here = current_netns().expect("own netns");
    assert!(Firewall.permit(&peer(0), &envelope(here)).is_ok());
}

#[test]
fn others_are_declined_and_do_it_themselves() {
    let here = current_netns().expect("own netns");
    let declined = |r: Result<(), Refusal<Error>>| match r {
        Err(Refusal::Declined(e)) => e.message,
        Err(Refusal::Failed(status, e)) => panic!("failed with {status}, not {DECLINED}: {e:?}"),
        Ok(()) => panic!("permitted"),
    };
    let msg = declined(Firewall.permit(&peer(1000), &envelope(here)));
    assert!(msg.contains("root only"), "{msg}");
    let msg = declined(Firewall.permit(&peer(0), &envelope(here.wrapping_add(1))));
    assert!(msg.contains("network namespace"), "{msg}");
}
