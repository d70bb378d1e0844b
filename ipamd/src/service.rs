//! Typed services the daemon hosts besides the lease API, e.g. cnikit's firewall.
//!
//! A service is served under `POST /v1/ext/<name>.<op>`: `<name>` picks the service in the
//! [`Services`] registry, the body is the service's [`Service::Request`] and `<op>` must be
//! what [`Endpoint::op`] names for it (it labels the metrics). The service decides who may
//! use it ([`Service::permit`]) and answers with its own response and error types. The
//! server only routes: it knows no service by name.
//!
//! Versions. A request's body may carry the version of the request protocol its sender
//! speaks, as a field [`PROTOCOL_FIELD`] beside the service's own request (see [`body`]);
//! a body without it is version 1 (cnikit 0.1.0 sent none). A daemon declines (421) a
//! request of a newer version than its own [`PROTOCOL`] before reading it, so a newer
//! plugin that meets an older daemon (e.g. during a package upgrade) does the work itself
//! instead of having it done the old way or refused. A daemon that predates versions
//! ignores the field; it answers 400 to an operation it does not know, which callers with
//! an in-process fallback treat the same way (`cnikit`'s firewall backend does).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use crate::peer::Peer;

/// Status of a refusal that sends the caller back to doing the work itself (see the
/// client's fallback policy in `client/daemon.rs`).
pub const DECLINED: u16 = 421;

/// Why a service did not do a request.
#[derive(Debug)]
pub enum Refusal<E> {
    /// Not this daemon's to do (e.g. the caller lives in another network namespace): the
    /// caller does it itself, as when no daemon listens. Answered with [`DECLINED`].
    Declined(E),
    /// The request failed; answered with this HTTP status and the error as the body.
    Failed(u16, E),
}

/// Where a service's request travels: `/v1/ext/<SERVICE>.<op>`. The request type says it,
/// so that client and server name it from one place.
pub trait Endpoint {
    /// The `<name>` of `/v1/ext/<name>.<op>`: picks the service.
    const SERVICE: &'static str;
    /// The `<op>` this request travels under.
    fn op(&self) -> &'static str;
}

pub trait Service: Send + Sync + 'static {
    type Request: Endpoint + Serialize + DeserializeOwned + Send + 'static;
    type Response: Serialize + DeserializeOwned;
    type Error: Serialize + DeserializeOwned;

    /// Whether `peer` may have `req` done. Every peer reaching a service already passed the
    /// daemon's own gate (root or the allowed group).
    fn permit(&self, peer: &Peer, req: &Self::Request) -> Result<(), Refusal<Self::Error>>;

    /// Does the request, on a blocking thread.
    fn handle(&self, req: Self::Request) -> Result<Self::Response, Refusal<Self::Error>>;

    /// A service error for a request that could not be read.
    fn malformed(message: String) -> Self::Error;
}

/// The target a request of `S` is sent to.
pub fn target<S: Service>(req: &S::Request) -> String {
    format!("/v1/ext/{}.{}", S::Request::SERVICE, req.op())
}

/// The version of the request protocol this build sends and reads. 1: no version in the
/// body (cnikit 0.1.0). 2: versioned bodies; a daemon declines newer ones. Raise it when a
/// hosted service's request changes meaning under the same operation name, so that older
/// daemons (of version 2 or later) leave such requests to the caller.
pub const PROTOCOL: u32 = 2;

/// The body field that carries the protocol version: reserved, a service's request has no
/// top-level field of this name (the daemon takes it out before reading the request).
pub const PROTOCOL_FIELD: &str = "protocol";

/// The status a daemon answers when it cannot read a request (malformed, or an operation it
/// does not know, which is how a daemon that predates [`PROTOCOL`] answers a newer one).
pub const UNREADABLE: u16 = 400;

/// The body of a request to `S`: the request with [`PROTOCOL_FIELD`] set to [`PROTOCOL`]
/// beside its fields (a request that is not a JSON object travels as it is: version 1).
/// A daemon of any version reads it: one that predates versions ignores the field.
pub fn body<S: Service>(req: &S::Request) -> serde_json::Result<Vec<u8>> {
    let mut value = serde_json::to_value(req)?;
    if let serde_json::Value::Object(fields) = &mut value {
        fields.insert(PROTOCOL_FIELD.to_string(), PROTOCOL.into());
    }
    serde_json::to_vec(&value)
}

/// What the server makes of one call: status, JSON body, metrics outcome.
pub(crate) struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    pub outcome: &'static str,
}

/// A service with its types erased to bytes, for the registry.
trait Hosted: Send + Sync {
    fn call(&self, op: &str, peer: &Peer, body: &[u8]) -> Answer;
}

struct Host<S>(S);

impl<S: Service> Hosted for Host<S> {
    fn call(&self, op: &str, peer: &Peer, body: &[u8]) -> Answer {
        let refused = |r: Refusal<S::Error>| {
            let (status, e, outcome) = match r {
                Refusal::Declined(e) => (DECLINED, e, "declined"),
                Refusal::Failed(status, e) => (status, e, "error"),
            };
            Answer {
                status,
                body: serde_json::to_vec(&e).unwrap_or_default(),
                outcome,
            }
        };
        let invalid = |msg: String| Answer {
            outcome: "invalid",
            ..refused(Refusal::Failed(UNREADABLE, S::malformed(msg)))
        };
        let req = match decode::<S>(op, body) {
            Ok(r) => r,
            Err(Unread::Newer(msg)) => return refused(Refusal::Declined(S::malformed(msg))),
            Err(Unread::Malformed(msg)) => return invalid(msg),
        };
        if let Err(r) = self.0.permit(peer, &req) {
            return refused(r);
        }
        match self.0.handle(req) {
            Ok(resp) => Answer {
                status: 200,
                body: serde_json::to_vec(&resp).unwrap_or_default(),
                outcome: "ok",
            },
            Err(r) => refused(r),
        }
    }
}

/// Why a body was not read as a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Unread {
    /// Of a newer protocol than [`PROTOCOL`]: not read at all (declined, 421).
    Newer(String),
    /// Not a request of `S` under this operation ([`UNREADABLE`]).
    Malformed(String),
}

/// The request of `S` in `body`, which must be one that travels under `op` and of a
/// protocol no newer than ours; the error says why not. Everything the server does with the
/// bytes before the service's permission check (and what the `daemon_request` fuzz target
/// runs). The protocol field is taken out before the request is read, so a request type
/// that denies unknown fields reads versioned bodies too.
pub fn decode<S: Service>(op: &str, body: &[u8]) -> Result<S::Request, Unread> {
    let malformed =
        |e: serde_json::Error| Unread::Malformed(format!("{op}: malformed request: {e}"));
    let mut value: serde_json::Value = serde_json::from_slice(body).map_err(malformed)?;
    if let serde_json::Value::Object(fields) = &mut value {
        if let Some(v) = fields.remove(PROTOCOL_FIELD) {
            let version = v.as_u64().filter(|v| *v >= 1).ok_or_else(|| {
                Unread::Malformed(format!("{op}: {PROTOCOL_FIELD} {v} is not a version"))
            })?;
            if version > u64::from(PROTOCOL) {
                return Err(Unread::Newer(format!(
                    "{op}: the request is of protocol {version}, newer than this daemon's ({PROTOCOL}); the caller does it itself"
                )));
            }
        }
    }
    let req: S::Request = serde_json::from_value(value).map_err(malformed)?;
    if req.op() != op {
        return Err(Unread::Malformed(format!(
            "{op}: the body holds {}",
            req.op()
        )));
    }
    Ok(req)
}

/// The services a daemon hosts, by name.
#[derive(Clone, Default)]
pub struct Services(BTreeMap<&'static str, Arc<dyn Hosted>>);

impl Services {
    pub fn new() -> Services {
        Services::default()
    }

    /// Hosts `service` under its name (replacing one of the same name).
    pub fn with<S: Service>(mut self, service: S) -> Services {
        self.0.insert(S::Request::SERVICE, Arc::new(Host(service)));
        self
    }

    /// Whether `target` (`<name>.<op>`) names a hosted service.
    pub(crate) fn hosts(&self, target: &str) -> bool {
        self.split(target).is_some()
    }

    fn split<'a>(&self, target: &'a str) -> Option<(&Arc<dyn Hosted>, &'a str)> {
        let (name, op) = target.split_once('.')?;
        Some((self.0.get(name)?, op))
    }

    /// Runs the call (on the caller's thread: the server calls this on a blocking one).
    pub(crate) fn call(&self, target: &str, peer: &Peer, body: &[u8]) -> Option<Answer> {
        let (service, op) = self.split(target)?;
        Some(service.call(op, peer, body))
    }
}

impl fmt::Debug for Services {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// A request that is an object and denies fields it does not know.
    #[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(tag = "op", deny_unknown_fields)]
    enum Ask {
        #[serde(rename = "echo")]
        Echo { text: String },
    }

    struct Test;

    impl Endpoint for Ask {
        const SERVICE: &'static str = "test";
        fn op(&self) -> &'static str {
            "echo"
        }
    }

    impl Service for Test {
        type Request = Ask;
        type Response = String;
        type Error = String;
        fn permit(&self, _: &Peer, _: &Ask) -> Result<(), Refusal<String>> {
            Ok(())
        }
        fn handle(&self, Ask::Echo { text }: Ask) -> Result<String, Refusal<String>> {
            Ok(text)
        }
        fn malformed(message: String) -> String {
            message
        }
    }

    fn hi() -> Ask {
        Ask::Echo { text: "hi".into() }
    }

    fn answer(body: &[u8]) -> (u16, String, &'static str) {
        let services = Services::new().with(Test);
        let a = services
            .call("test.echo", &Peer::with_uid(0, true), body)
            .expect("hosted");
        (a.status, String::from_utf8(a.body).unwrap(), a.outcome)
    }

    #[test]
    fn a_body_carries_our_protocol_and_reads_back() {
        let body = body::<Test>(&hi()).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value[PROTOCOL_FIELD], PROTOCOL);
        assert_eq!(decode::<Test>("echo", &body), Ok(hi()));
        assert_eq!(answer(&body), (200, "\"hi\"".into(), "ok"));
    }

    #[test]
    fn a_body_without_protocol_is_version_1_and_served() {
        let body = br#"{"op":"echo","text":"hi"}"#;
        assert_eq!(decode::<Test>("echo", body), Ok(hi()));
        assert_eq!(answer(body).0, 200);
        let v1 = br#"{"op":"echo","text":"hi","protocol":1}"#;
        assert_eq!(decode::<Test>("echo", v1), Ok(hi()));
    }

    #[test]
    fn a_newer_protocol_is_declined_before_it_is_read() {
        let newer = PROTOCOL + 1;
        // Even when its operation is one this daemon does not know.
        let body = format!(r#"{{"op":"echo-twice","text":"hi","protocol":{newer}}}"#);
        match decode::<Test>("echo", body.as_bytes()) {
            Err(Unread::Newer(msg)) => assert!(msg.contains("does it itself"), "{msg}"),
            other => panic!("{other:?}"),
        }
        let (status, msg, outcome) = answer(body.as_bytes());
        assert_eq!((status, outcome), (DECLINED, "declined"), "{msg}");
    }

    #[test]
    fn an_unknown_operation_of_our_protocol_is_unreadable() {
        let body = format!(r#"{{"op":"echo-twice","text":"hi","protocol":{PROTOCOL}}}"#);
        assert!(matches!(
            decode::<Test>("echo", body.as_bytes()),
            Err(Unread::Malformed(_))
        ));
        let (status, _, outcome) = answer(body.as_bytes());
        assert_eq!((status, outcome), (UNREADABLE, "invalid"));
    }

    #[test]
    fn a_protocol_that_is_no_version_is_malformed() {
        for bad in [r#""2""#, "0", "-1", "1.5", "null"] {
            let body = format!(r#"{{"op":"echo","text":"hi","protocol":{bad}}}"#);
            assert!(
                matches!(
                    decode::<Test>("echo", body.as_bytes()),
                    Err(Unread::Malformed(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_body_of_another_op_is_malformed() {
        let body = body::<Test>(&hi()).unwrap();
        assert!(matches!(
            decode::<Test>("other", &body),
            Err(Unread::Malformed(_))
        ));
    }
}
