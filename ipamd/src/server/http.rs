//! Request bodies in, JSON responses out: every error as an `ErrorBody` with a status code
//! that matches its kind (clients rely on the body's `kind`, people on the code).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::ErrorBody;
use crate::{Error, ErrorKind};

/// Requests are a key and a few ranges; anything bigger is not a client of ours.
const MAX_BODY: usize = 1 << 20;
/// A client that sent its headers must send the body promptly.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) type Resp = Response<Full<Bytes>>;

pub(super) async fn body<B: DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<B, (StatusCode, Error)> {
    let bytes = raw_body(req).await?;
    decode(&bytes)
}

/// A lease API request body that has arrived whole; apart from the async read, this is all
/// [`body`] does (and what the `daemon_request` fuzz target runs).
pub(crate) fn decode<B: DeserializeOwned>(bytes: &[u8]) -> Result<B, (StatusCode, Error)> {
    serde_json::from_slice(bytes).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            Error::invalid(format!("malformed request body: {e}")),
        )
    })
}

pub(super) async fn raw_body(req: Request<Incoming>) -> Result<Bytes, (StatusCode, Error)> {
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

pub(super) fn status_for(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidConfig => StatusCode::BAD_REQUEST,
        ErrorKind::Conflict | ErrorKind::Exhausted => StatusCode::CONFLICT,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Io | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub(super) fn error(code: StatusCode, e: &Error) -> Resp {
    json(code, &ErrorBody::from(e))
}

pub(super) fn json<T: Serialize>(code: StatusCode, v: &T) -> Resp {
    match serde_json::to_vec(v) {
        Ok(b) => with_type(code, "application/json", b.into()),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("cannot encode answer: {e}\n"),
        ),
    }
}

pub(super) fn text(code: StatusCode, ctype: &'static str, body: String) -> Resp {
    with_type(code, ctype, body.into())
}

pub(super) fn with_type(code: StatusCode, ctype: &'static str, body: Bytes) -> Resp {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}
