//! Firewall operations done by the ipamd daemon when one runs.
//!
//! Why: when any process closes a netfilter netlink socket, the kernel takes
//! the nftables commit mutex and, if a recent batch deleted something, waits
//! for an RCU grace period (≈10 ms) under it (`nft_rcv_nl_event`,
//! NETLINK_URELEASE). Every short-lived plugin process closes its socket at
//! exit, so under pod churn every process waits its turn for those 10 ms.
//! The daemon (`cnikit ipamd daemon`) is long-lived and never closes its
//! socket: a plugin sends it the operation (`POST /v1/ext/<op>` on its unix
//! socket) and never opens a netfilter socket itself.
//!
//! When no daemon answers (no socket, refused, it died mid-request, it runs
//! in another network namespace, or it is an older daemon without these
//! operations) the plugin runs the same operation in-process, as before.
//! That is safe because every operation is idempotent: an ADD of our own
//! mapping again is fine, DEL and GC delete by tag, CHECK only reads, and a
//! conntrack flush can be repeated.

use super::conntrack::{self, UdpPort};
use super::portmap::{Mapping, Masquerade};
use super::socket::current_netns;
use super::tag::Attachment;
use super::{macspoof, masq, portmap, Error, ErrorKind, Result};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// The daemon's socket unless a config says otherwise (`daemonSocket`).
pub const DEFAULT_SOCKET: &str = "/run/cnikit/ipamd.sock";

static SOCKET: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The daemon socket for this process's firewall operations (None: the
/// default). The plugins set it from their `daemonSocket` key on every load.
pub fn set_daemon_socket(path: Option<&Path>) {
    *SOCKET.lock().unwrap_or_else(PoisonError::into_inner) = path.map(Path::to_path_buf);
}

fn daemon_socket() -> PathBuf {
    SOCKET
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// Every operation a plugin does, with its arguments.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(crate) enum Request {
    PortmapAdd {
        att: Attachment,
        container: Vec<IpNet>,
        mappings: Vec<Mapping>,
        masq: Masquerade,
    },
    PortmapCheck {
        att: Attachment,
        container: Vec<IpNet>,
        mappings: Vec<Mapping>,
        masq: Masquerade,
    },
    PortmapDel {
        att: Attachment,
    },
    PortmapGc {
        network: String,
        valid: Vec<Attachment>,
    },
    MasqAdd {
        att: Attachment,
        addrs: Vec<IpAddr>,
        subnets: Vec<IpNet>,
    },
    MasqDel {
        att: Attachment,
    },
    MasqGc {
        network: String,
        valid: Vec<Attachment>,
    },
    MacspoofAdd {
        att: Attachment,
        host_ifname: String,
        mac: String,
    },
    MacspoofDel {
        att: Attachment,
    },
    MacspoofGc {
        network: String,
        valid: Vec<Attachment>,
    },
    ConntrackFlushUdp {
        targets: Vec<UdpPort>,
    },
}

/// What travels: the operation and the caller's network namespace (the
/// daemon declines operations meant for another one).
#[derive(Serialize, Deserialize)]
struct Envelope {
    netns: u64,
    request: Request,
}

impl Request {
    /// The `<op>` of `/v1/ext/<op>` (also the daemon's metrics label).
    fn name(&self) -> &'static str {
        match self {
            Request::PortmapAdd { .. } => "firewall.portmap-add",
            Request::PortmapCheck { .. } => "firewall.portmap-check",
            Request::PortmapDel { .. } => "firewall.portmap-del",
            Request::PortmapGc { .. } => "firewall.portmap-gc",
            Request::MasqAdd { .. } => "firewall.masq-add",
            Request::MasqDel { .. } => "firewall.masq-del",
            Request::MasqGc { .. } => "firewall.masq-gc",
            Request::MacspoofAdd { .. } => "firewall.macspoof-add",
            Request::MacspoofDel { .. } => "firewall.macspoof-del",
            Request::MacspoofGc { .. } => "firewall.macspoof-gc",
            Request::ConntrackFlushUdp { .. } => "firewall.conntrack-flush-udp",
        }
    }

    /// The operation itself, in this process.
    fn run_here(&self) -> Result<()> {
        match self {
            Request::PortmapAdd {
                att,
                container,
                mappings,
                masq,
            } => portmap::add_here(att, container, mappings, *masq),
            Request::PortmapCheck {
                att,
                container,
                mappings,
                masq,
            } => portmap::check_here(att, container, mappings, *masq),
            Request::PortmapDel { att } => portmap::del_here(att),
            Request::PortmapGc { network, valid } => portmap::gc_here(network, valid),
            Request::MasqAdd {
                att,
                addrs,
                subnets,
            } => masq::add_here(att, addrs, subnets),
            Request::MasqDel { att } => masq::del_here(att),
            Request::MasqGc { network, valid } => masq::gc_here(network, valid),
            Request::MacspoofAdd {
                att,
                host_ifname,
                mac,
            } => macspoof::add_here(att, host_ifname, mac),
            Request::MacspoofDel { att } => macspoof::del_here(att),
            Request::MacspoofGc { network, valid } => macspoof::gc_here(network, valid),
            Request::ConntrackFlushUdp { targets } => conntrack::flush_udp_here(targets),
        }
    }
}

/// Plugin side: by the daemon if one serves it, else here.
pub(crate) fn run(request: Request) -> Result<()> {
    match via_daemon(&request, &daemon_socket()) {
        Some(answer) => answer,
        None => request.run_here(),
    }
}

fn via_daemon(request: &Request, socket: &Path) -> Option<Result<()>> {
    let op = request.name();
    let netns = current_netns().ok()?;
    let body = serde_json::to_vec(&Envelope {
        netns,
        request: request.clone(),
    })
    .ok()?;
    let client = ipamd::client::Client::without_store(socket);
    match client.call_ext(op, &body)? {
        Ok(_) => Some(Ok(())),
        Err((status, body)) => Some(Err(decode_error(socket, op, status, &body))),
    }
}

fn decode_error(socket: &Path, op: &str, status: u16, body: &[u8]) -> Error {
    serde_json::from_slice::<Error>(body).unwrap_or_else(|_| {
        Error::new(
            ErrorKind::Other,
            format!(
                "{op}: ipamd at {} answered {status}: {}",
                socket.display(),
                String::from_utf8_lossy(body).trim()
            ),
        )
    })
}

/// Status 421 makes the client run the operation itself (see
/// `ipamd::daemon::ExtensionFn`).
const DECLINE: u16 = 421;

/// Daemon side: `cnikit ipamd daemon` registers this as its extension.
pub fn dispatch(op: &str, body: &[u8]) -> ipamd::daemon::ExtReply {
    let fail = |status: u16, e: Error| (status, serde_json::to_vec(&e).unwrap_or_default());
    let env: Envelope = serde_json::from_slice(body).map_err(|e| {
        fail(
            400,
            Error::new(ErrorKind::Other, format!("{op}: malformed request: {e}")),
        )
    })?;
    if env.request.name() != op {
        return Err(fail(
            400,
            Error::new(
                ErrorKind::Other,
                format!("{op}: the body holds {}", env.request.name()),
            ),
        ));
    }
    let here = current_netns().map_err(|e| fail(500, e))?;
    if env.netns != here {
        let msg = format!(
            "{op}: the caller's network namespace is not the daemon's; the caller does it itself"
        );
        return Err(fail(DECLINE, Error::new(ErrorKind::Other, msg)));
    }
    match env.request.run_here() {
        Ok(()) => Ok(b"{}".to_vec()),
        Err(e) => {
            let status = match e.kind {
                ErrorKind::Conflict => 409,
                ErrorKind::Mismatch => 422,
                ErrorKind::Unsupported => 501,
                ErrorKind::Other => 500,
            };
            Err(fail(status, e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall::portmap::Proto;

    #[test]
    fn requests_round_trip_and_name_their_op() {
        let att = Attachment::new("n", "c", "eth0");
        let req = Request::PortmapAdd {
            att: att.clone(),
            container: vec!["10.0.0.2/24".parse().expect("net")],
            mappings: vec![Mapping {
                host_ip: None,
                host_port: 80,
                proto: Proto::Udp,
                container_port: 8080,
            }],
            masq: Masquerade {
                snat: true,
                masq_all: false,
            },
        };
        let body = serde_json::to_vec(&Envelope {
            netns: 7,
            request: req,
        })
        .expect("encode");
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("\"op\":\"portmap-add\""), "{text}");
        assert!(text.contains("\"proto\":\"udp\""), "{text}");
        let back: Envelope = serde_json::from_slice(&body).expect("decode");
        assert_eq!(back.request.name(), "firewall.portmap-add");
        assert!(matches!(back.request, Request::PortmapAdd { att: a, .. } if a == att));
    }

    #[test]
    fn dispatch_declines_another_netns_and_checks_the_op() {
        let env = |netns| {
            serde_json::to_vec(&Envelope {
                netns,
                request: Request::MasqDel {
                    att: Attachment::new("n", "c", "eth0"),
                },
            })
            .expect("encode")
        };
        // No real netns has inode 1.
        let (status, _) = dispatch("firewall.masq-del", &env(1)).expect_err("declined");
        assert_eq!(status, DECLINE);
        let (status, _) = dispatch("firewall.masq-add", &env(1)).expect_err("wrong op");
        assert_eq!(status, 400);
        let (status, _) = dispatch("firewall.masq-del", b"{").expect_err("malformed");
        assert_eq!(status, 400);
    }

    #[test]
    fn errors_keep_their_kind_over_the_wire() {
        let e = Error::new(ErrorKind::Conflict, "host port tcp/80 belongs to x");
        let body = serde_json::to_vec(&e).expect("encode");
        let back = decode_error(Path::new("/s"), "op", 409, &body);
        assert_eq!(back.kind, ErrorKind::Conflict);
        assert_eq!(back.message, e.message);
        let other = decode_error(Path::new("/s"), "op", 400, b"nonsense");
        assert_eq!(other.kind, ErrorKind::Other);
        assert!(other.message.contains("400"), "{}", other.message);
    }
}
