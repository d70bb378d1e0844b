//! The daemon's HTTP/1.1 server on a unix socket (tokio + hyper).

mod http;
mod ipam;
mod metrics;
mod registry;
mod routes;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::log::Level;
use crate::log_at;
use crate::peer::Peer;
use crate::service::Services;

pub(crate) use registry::Registry;
#[cfg(test)]
pub(crate) use registry::MAX_OPEN_STORES;

/// A client must send a complete request head this fast (also bounds idle keep-alive).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 1024;
/// How long shutdown waits for in-flight requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// Accept and serve connections until `shutdown` resolves, then stop accepting and let
/// in-flight requests finish (each request's record is written whole by its blocking task).
pub(crate) async fn serve(
    listener: UnixListener,
    reg: Arc<Registry>,
    services: Services,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(64 * 1024);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&limit).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            res = listener.accept() => match res {
                Ok((s, _)) => s,
                Err(e) => {
                    // E.g. EMFILE: back off instead of spinning.
                    log_at!(Level::Warn, "accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let peer = match Peer::of(&stream) {
            Ok(p) => Some(p),
            Err(e) => {
                log_at!(Level::Warn, "cannot identify peer (SO_PEERCRED): {e}");
                None
            }
        };
        let reg = Arc::clone(&reg);
        let services = services.clone();
        let svc = service_fn(move |req| {
            let reg = Arc::clone(&reg);
            let peer = peer.clone();
            let services = services.clone();
            async move { Ok::<_, Infallible>(routes::handle(reg, services, peer, req).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                log_at!(Level::Debug, "connection: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => {
            log_at!(Level::Warn, "shutdown: gave up waiting for in-flight requests after {DRAIN_TIMEOUT:?}");
        }
    }
}
