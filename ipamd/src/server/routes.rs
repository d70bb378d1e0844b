//! HTTP routing: JSON in, JSON out, every error as an `ErrorBody` with a status code that
//! matches its kind (clients rely on the body's `kind`, people on the code).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{
    AllocateRequest, AllocateResponse, ErrorBody, GcRequest, GcResponse, LeaseKey, LeasesResponse,
    StatusRequest,
};
use crate::peer::Peer;
use crate::service::{Services, DECLINED};
use crate::store::{unexpected, Op, Reply};
use crate::{Error, ErrorKind};

use super::registry::Registry;

/// Requests are a key and a few ranges; anything bigger is not a client of ours.
const MAX_BODY: usize = 1 << 20;
/// A client that sent its headers must send the body promptly.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) type Resp = Response<Full<Bytes>>;

pub(crate) async fn handle(
    reg: Arc<Registry>,
    services: Services,
    peer: Option<Peer>,
    req: Request<Incoming>,
) -> Resp {
    let peer = match peer {
        Some(p) if p.allowed(reg.allowed_gid) => p,
        other => return refuse(&reg, other.as_ref()),
    };
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    if let Some(target) = path.strip_prefix("/v1/ext/") {
        let target = target.to_string();
        return ext(reg, services, peer, target, req).await;
    }
    if path.starts_with("/v1/") {
        let header = req
            .headers()
            .get(crate::api::DATA_DIR_HEADER)
            .map(|v| v.as_bytes());
        if let Err(e) = reg.check_data_dir(header) {
            return error(StatusCode::BAD_REQUEST, &e);
        }
    }
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/healthz") => text(StatusCode::OK, "text/plain", "ok\n".into()),
        (Method::GET, "/metrics") => {
            let body = reg.metrics.render(&reg.usage());
            text(StatusCode::OK, "text/plain; version=0.0.4", body)
        }
        (Method::GET, "/v1/leases") => {
            let network = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("network="))
                .map(str::to_string);
            run(
                reg,
                "leases",
                async move { Ok(network) },
                |r, network| async move {
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
                },
            )
            .await
        }
        (Method::POST, "/v1/allocate") => {
            run(
                reg,
                "allocate",
                body::<AllocateRequest>(req),
                |r, b| async move {
                    b.key.validate()?;
                    let network = b.key.network.clone();
                    match r.call(&network, Op::Allocate(b)).await? {
                        Reply::Allocations(allocations) => Ok(AllocateResponse { allocations }),
                        other => Err(unexpected(&other)),
                    }
                },
            )
            .await
        }
        (Method::POST, "/v1/release") => {
            run(reg, "release", body::<LeaseKey>(req), |r, k| async move {
                k.validate()?;
                let op = Op::Release {
                    cid: k.container_id,
                    ifname: k.ifname,
                };
                r.call(&k.network, op).await.map(|_| serde_json::json!({}))
            })
            .await
        }
        (Method::POST, "/v1/check") => {
            run(reg, "check", body::<LeaseKey>(req), |r, k| async move {
                k.validate()?;
                let op = Op::Check {
                    cid: k.container_id,
                    ifname: k.ifname,
                };
                match r.call(&k.network, op).await? {
                    Reply::Allocations(allocations) => Ok(AllocateResponse { allocations }),
                    other => Err(unexpected(&other)),
                }
            })
            .await
        }
        (Method::POST, "/v1/gc") => {
            run(reg, "gc", body::<GcRequest>(req), |r, g| async move {
                crate::attachment::check_network(&g.network)?;
                match r.call(&g.network, Op::Gc(g.valid)).await? {
                    Reply::Freed(freed) => Ok(GcResponse { freed }),
                    other => Err(unexpected(&other)),
                }
            })
            .await
        }
        (Method::POST, "/v1/status") => {
            run(
                reg,
                "status",
                body::<StatusRequest>(req),
                |r, s| async move {
                    crate::attachment::check_network(&s.network)?;
                    r.call(&s.network, Op::Status(s.range_sets))
                        .await
                        .map(|_| serde_json::json!({}))
                },
            )
            .await
        }
        (
            _,
            "/healthz" | "/metrics" | "/v1/leases" | "/v1/allocate" | "/v1/release" | "/v1/check"
            | "/v1/gc" | "/v1/status",
        ) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            &Error::invalid(format!("method {} not allowed on {path}", req.method())),
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            &Error::new(ErrorKind::NotFound, format!("no such endpoint {path}")),
        ),
    }
}

/// Read the body, run `op` (which queues work to a network's writer), record metrics, and
/// turn the outcome into a response.
async fn run<B, T, F, Fut>(
    reg: Arc<Registry>,
    verb: &'static str,
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
                .observe(verb, e.kind().as_str(), started.elapsed());
            return error(code, &e);
        }
    };
    let res = op(Arc::clone(&reg), b).await;
    let outcome = match &res {
        Ok(_) => "ok",
        Err(e) => e.kind().as_str(),
    };
    reg.metrics.observe(verb, outcome, started.elapsed());
    match res {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => {
            crate::log_at!(crate::log::Level::Debug, "{verb}: {e}");
            error(status_for(e.kind()), &e)
        }
    }
}

/// The daemon's own gate, before any route or service: root, or the allowed group. This is
/// the lease API's whole permission check; hosted services add their own.
fn refuse(reg: &Registry, peer: Option<&Peer>) -> Resp {
    let who = match peer {
        Some(p) => format!("uid {} gid {}", p.uid, p.gid),
        None => "an unidentified peer".to_string(),
    };
    let only = match reg.allowed_gid {
        Some(g) => format!("root or group {g}"),
        None => "root".to_string(),
    };
    json(
        StatusCode::FORBIDDEN,
        &ErrorBody {
            kind: ErrorKind::Unavailable,
            message: format!("ipamd refuses {who}: only {only} may use it"),
        },
    )
}

/// `POST /v1/ext/<name>.<op>`: a hosted service (see [`crate::service`]), on a blocking
/// thread. A target no service answers to is declined, so the caller does the work itself.
async fn ext(
    reg: Arc<Registry>,
    services: Services,
    peer: Peer,
    target: String,
    req: Request<Incoming>,
) -> Resp {
    let started = Instant::now();
    if req.method() != Method::POST {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            &Error::invalid(format!(
                "method {} not allowed on /v1/ext/{target}",
                req.method()
            )),
        );
    }
    if !services.hosts(&target) {
        let e = Error::new(
            ErrorKind::NotFound,
            format!("this ipamd daemon serves no {target:?}"),
        );
        let code = StatusCode::from_u16(DECLINED).unwrap_or(StatusCode::NOT_FOUND);
        return error(code, &e);
    }
    let bytes = match raw_body(req).await {
        Ok(b) => b,
        Err((code, e)) => {
            reg.metrics
                .observe_ext(&target, "invalid", started.elapsed());
            return error(code, &e);
        }
    };
    let name = target.clone();
    let res = tokio::task::spawn_blocking(move || services.call(&name, &peer, &bytes)).await;
    let (code, body, outcome) = match res {
        Ok(Some(a)) => {
            let code = StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (code, a.body, a.outcome)
        }
        Ok(None) => (StatusCode::INTERNAL_SERVER_ERROR, Vec::new(), "error"),
        Err(e) => {
            crate::log_at!(crate::log::Level::Error, "ext {target}: {e}");
            let body = serde_json::to_vec(&ErrorBody::from(&Error::internal(format!(
                "service call {target} failed: {e}"
            ))))
            .unwrap_or_default();
            (StatusCode::INTERNAL_SERVER_ERROR, body, "panic")
        }
    };
    reg.metrics.observe_ext(&target, outcome, started.elapsed());
    with_type(code, "application/json", body.into())
}

async fn body<B: DeserializeOwned>(req: Request<Incoming>) -> Result<B, (StatusCode, Error)> {
    let bytes = raw_body(req).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            Error::invalid(format!("malformed request body: {e}")),
        )
    })
}

async fn raw_body(req: Request<Incoming>) -> Result<Bytes, (StatusCode, Error)> {
    let limited = Limited::new(req.into_body(), MAX_BODY);
    let collected = tokio::time::timeout(BODY_TIMEOUT, limited.collect())
        .await
        .map_err(|_| {
            (
                StatusCode::REQUEST_TIMEOUT,
                Error::invalid(format!("request body not received within {BODY_TIMEOUT:?}")),
            )
        })?
        .map_err(|e| {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                Error::invalid(format!(
                    "cannot read request body (limit {MAX_BODY} bytes): {e}"
                )),
            )
        })?;
    Ok(collected.to_bytes())
}

fn status_for(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidConfig => StatusCode::BAD_REQUEST,
        ErrorKind::Conflict | ErrorKind::Exhausted => StatusCode::CONFLICT,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Io | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn error(code: StatusCode, e: &Error) -> Resp {
    json(code, &ErrorBody::from(e))
}

fn json<T: Serialize>(code: StatusCode, v: &T) -> Resp {
    match serde_json::to_vec(v) {
        Ok(b) => with_type(code, "application/json", b.into()),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("cannot encode answer: {e}\n"),
        ),
    }
}

fn text(code: StatusCode, ctype: &'static str, body: String) -> Resp {
    with_type(code, ctype, body.into())
}

fn with_type(code: StatusCode, ctype: &'static str, body: Bytes) -> Resp {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}
