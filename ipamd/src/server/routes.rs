//! HTTP routing: the daemon's gate (root or the allowed group), then the lease API
//! (`ipam.rs`), hosted services under `/v1/ext/` (`crate::service`), health and metrics.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use crate::api::ErrorBody;
use crate::peer::Peer;
use crate::service::{Services, DECLINED};
use crate::{Error, ErrorKind};

use super::http::{error, json, raw_body, text, with_type, Resp};
use super::registry::Registry;

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
    if let Some(verb) = super::ipam::verb(req.method(), &path) {
        return super::ipam::serve(reg, &peer, verb, &query, req).await;
    }
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/healthz") => text(StatusCode::OK, "text/plain", "ok\n".into()),
        (Method::GET, "/metrics") => {
            let mut body = reg.metrics.render(&reg.usage());
            reg.plugin_calls.render(&mut body);
            body.push_str(&super::pools::render(&reg).await);
            text(StatusCode::OK, "text/plain; version=0.0.4", body)
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
