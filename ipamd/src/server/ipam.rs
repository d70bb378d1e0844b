//! The lease API, the daemon's built-in service: `GET /v1/leases` and `POST /v1/allocate`,
//! `/v1/release`, `/v1/check`, `/v1/gc`, `/v1/status`. Its requests queue work to the
//! networks' writers, which group-commit (one fsync per batch), so it is served on the async
//! side rather than as a blocking hosted service (`crate::service`).
//!
//! Who may do what: every peer here passed the daemon's gate (root or the allowed group).
//! Reading (leases, status, check) is open to both; changing leases (allocate, release,
//! gc) takes root with an effective CAP_NET_ADMIN (`Peer::net_admin`): a group member who
//! could free another pod's lease could get its address handed out twice, and a root
//! process that dropped its capabilities could not attach a pod to the network anyway.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Serialize;

use crate::api::{
    AllocateRequest, AllocateResponse, GcRequest, GcResponse, LeaseKey, LeasesResponse,
    StatusRequest,
};
use crate::peer::Peer;
use crate::store::{unexpected, Op, Reply};
use crate::Error;

use super::http::{body, error, json, status_for, Resp};
use super::registry::Registry;

/// One operation of the lease API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verb {
    Leases,
    Allocate,
    Release,
    Check,
    Gc,
    Status,
}

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Leases => "leases",
            Verb::Allocate => "allocate",
            Verb::Release => "release",
            Verb::Check => "check",
            Verb::Gc => "gc",
            Verb::Status => "status",
        }
    }

    fn changes_leases(self) -> bool {
        matches!(self, Verb::Allocate | Verb::Release | Verb::Gc)
    }
}

/// The verb `method` + `path` asks for; None for a path that is not the lease API's, or a
/// method it does not take there (the router answers those).
pub(super) fn verb(method: &Method, path: &str) -> Option<Verb> {
    let verb = match path {
        "/v1/leases" => Verb::Leases,
        "/v1/allocate" => Verb::Allocate,
        "/v1/release" => Verb::Release,
        "/v1/check" => Verb::Check,
        "/v1/gc" => Verb::Gc,
        "/v1/status" => Verb::Status,
        _ => return None,
    };
    let method_ok = match verb {
        Verb::Leases => method == Method::GET,
        _ => method == Method::POST,
    };
    method_ok.then_some(verb)
}

/// The lease API's permission check (see the module comment).
fn permit(peer: &Peer, verb: Verb) -> Result<(), Error> {
    if verb.changes_leases() && !peer.net_admin() {
        let who = if peer.uid == 0 {
            "root without CAP_NET_ADMIN".to_string()
        } else {
            format!("uid {}", peer.uid)
        };
        return Err(Error::new(
            crate::ErrorKind::Unavailable,
            format!(
                "ipamd refuses {} from {who}: only root with CAP_NET_ADMIN may change leases",
                verb.name(),
            ),
        ));
    }
    Ok(())
}

pub(super) async fn serve(
    reg: Arc<Registry>,
    peer: &Peer,
    verb: Verb,
    query: &str,
    req: Request<Incoming>,
) -> Resp {
    if let Err(e) = permit(peer, verb) {
        reg.metrics
            .observe(verb.name(), "forbidden", Default::default());
        return error(StatusCode::FORBIDDEN, &e);
    }
    let header = req
        .headers()
        .get(crate::api::DATA_DIR_HEADER)
        .map(|v| v.as_bytes());
    if let Err(e) = reg.check_data_dir(header) {
        return error(StatusCode::BAD_REQUEST, &e);
    }
    match verb {
        Verb::Leases => {
            let network = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("network="))
                .map(str::to_string);
            run(reg, verb, async move { Ok(network) }, leases).await
        }
        Verb::Allocate => run(reg, verb, body::<AllocateRequest>(req), allocate).await,
        Verb::Release => run(reg, verb, body::<LeaseKey>(req), release).await,
        Verb::Check => run(reg, verb, body::<LeaseKey>(req), check).await,
        Verb::Gc => run(reg, verb, body::<GcRequest>(req), gc).await,
        Verb::Status => run(reg, verb, body::<StatusRequest>(req), status).await,
    }
}

async fn leases(r: Arc<Registry>, network: Option<String>) -> Result<LeasesResponse, Error> {
    let names = match network {
        Some(n) => {
            crate::attachment::check_network(&n)?;
            vec![n]
        }
        None => r.networks()?,
    };
    let mut leases = Vec::new();
    for n in names {
        match r.call(&n, Op::Leases).await? {
            Reply::Leases(l) => leases.extend(l),
            other => return Err(unexpected(&other)),
        }
    }
    Ok(LeasesResponse { leases })
}

async fn allocate(r: Arc<Registry>, b: AllocateRequest) -> Result<AllocateResponse, Error> {
    b.key.validate()?;
    if !b.pools.is_empty() {
        return super::pools::allocate(r, b).await;
    }
    let network = b.key.network.clone();
    match r.call(&network, Op::Allocate(b)).await? {
        Reply::Allocations(allocations) => Ok(AllocateResponse { allocations }),
        other => Err(unexpected(&other)),
    }
}

async fn release(r: Arc<Registry>, k: LeaseKey) -> Result<serde_json::Value, Error> {
    k.validate()?;
    let op = Op::Release {
        cid: k.container_id,
        ifname: k.ifname,
    };
    r.call(&k.network, op).await.map(|_| serde_json::json!({}))
}

async fn check(r: Arc<Registry>, k: LeaseKey) -> Result<AllocateResponse, Error> {
    k.validate()?;
    let op = Op::Check {
        cid: k.container_id,
        ifname: k.ifname,
    };
    match r.call(&k.network, op).await? {
        Reply::Allocations(allocations) => Ok(AllocateResponse { allocations }),
        other => Err(unexpected(&other)),
    }
}

async fn gc(r: Arc<Registry>, g: GcRequest) -> Result<GcResponse, Error> {
    crate::attachment::check_network(&g.network)?;
    match r.call(&g.network, Op::Gc(g.valid)).await? {
        Reply::Freed(freed) => Ok(GcResponse { freed }),
        other => Err(unexpected(&other)),
    }
}

async fn status(r: Arc<Registry>, s: StatusRequest) -> Result<serde_json::Value, Error> {
    crate::attachment::check_network(&s.network)?;
    if !s.pools.is_empty() {
        return super::pools::status(r, s)
            .await
            .map(|()| serde_json::json!({}));
    }
    r.call(&s.network, Op::Status(s.range_sets))
        .await
        .map(|_| serde_json::json!({}))
}

/// Read the body, run `op` (which queues work to a network's writer), record metrics, and
/// turn the outcome into a response.
async fn run<B, T, F, Fut>(
    reg: Arc<Registry>,
    verb: Verb,
    body: impl std::future::Future<Output = Result<B, (StatusCode, Error)>>,
    op: F,
) -> Resp
where
    T: Serialize,
    F: FnOnce(Arc<Registry>, B) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let started = Instant::now();
    let b = match body.await {
        Ok(b) => b,
        Err((code, e)) => {
            reg.metrics
                .observe(verb.name(), e.kind().as_str(), started.elapsed());
            return error(code, &e);
        }
    };
    let res = op(Arc::clone(&reg), b).await;
    let outcome = match &res {
        Ok(_) => "ok",
        Err(e) => e.kind().as_str(),
    };
    reg.metrics.observe(verb.name(), outcome, started.elapsed());
    match res {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => {
            crate::log_at!(crate::log::Level::Debug, "{}: {e}", verb.name());
            error(status_for(e.kind()), &e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, cap_net_admin: bool) -> Peer {
        Peer {
            gid: 4242,
            ..Peer::with_uid(uid, cap_net_admin)
        }
    }

    #[test]
    fn group_members_read_and_only_root_with_net_admin_changes_leases() {
        for verb in [Verb::Leases, Verb::Status, Verb::Check] {
            assert!(permit(&peer(65534, false), verb).is_ok(), "{verb:?}");
            assert!(permit(&peer(0, false), verb).is_ok(), "{verb:?}");
        }
        for verb in [Verb::Allocate, Verb::Release, Verb::Gc] {
            assert!(permit(&peer(65534, false), verb).is_err(), "{verb:?}");
            // A capability in another uid's hands is not enough either.
            assert!(permit(&peer(65534, true), verb).is_err(), "{verb:?}");
            let e = permit(&peer(0, false), verb).unwrap_err();
            assert!(e.to_string().contains("CAP_NET_ADMIN"), "{e}");
            assert!(permit(&peer(0, true), verb).is_ok(), "{verb:?}");
        }
    }

    #[test]
    fn verbs_by_method_and_path() {
        assert_eq!(verb(&Method::GET, "/v1/leases"), Some(Verb::Leases));
        assert_eq!(verb(&Method::POST, "/v1/gc"), Some(Verb::Gc));
        assert_eq!(verb(&Method::GET, "/v1/gc"), None);
        assert_eq!(verb(&Method::POST, "/healthz"), None);
    }
}
