//! The daemon's HTTP/1.1 server on a unix socket (tokio + hyper).

mod conns;
mod http;
mod ipam;
mod metrics;
mod plugin_calls;
mod pools;
mod registry;
mod routes;

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
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

use conns::Conns;

pub(crate) use http::decode as decode_body;
pub(crate) use plugin_calls::receive as receive_plugin_calls;
pub(crate) use pools::start as start_cluster;
pub(crate) use registry::Registry;
#[cfg(test)]
pub(crate) use registry::MAX_OPEN_STORES;

/// A client must send a complete request head this fast (also bounds idle keep-alive).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once. A new one beyond that closes the longest-idle one, so idle
/// connections cannot keep clients waiting; only when all are busy does it wait.
pub(crate) const MAX_CONNECTIONS: usize = 1024;
/// How long a connection closed to make room may take to finish writing an answer.
const CLOSE_GRACE: Duration = Duration::from_millis(100);
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
    let conns = Arc::new(Conns::default());
    // At shutdown, requests in service are finished (up to DRAIN_TIMEOUT), not cut short.
    let shutting_down = Arc::new(AtomicBool::new(false));
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(64 * 1024);
    tokio::pin!(shutdown);
    loop {
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
        let permit = match Arc::clone(&limit).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                conns.close_longest_idle();
                tokio::select! {
                    p = Arc::clone(&limit).acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let (id, conn_state) = conns.register();
        let reg = Arc::clone(&reg);
        let services = services.clone();
        let builder = builder.clone();
        let conns = Arc::clone(&conns);
        let shutting_down = Arc::clone(&shutting_down);
        // Identifying the peer takes a few syscalls (credentials, pidfd, capabilities,
        // namespaces): done in the connection's own task, so the accept loop never waits on it.
        tokio::spawn(async move {
            let peer = match Peer::of(&stream) {
                Ok(p) => Some(p),
                Err(e) => {
                    log_at!(Level::Warn, "cannot identify peer (SO_PEERCRED): {e}");
                    None
                }
            };
            let st = Arc::clone(&conn_state);
            let svc = service_fn(move |req| {
                let reg = Arc::clone(&reg);
                let peer = peer.clone();
                let services = services.clone();
                let busy = st.busy();
                async move {
                    let resp = routes::handle(reg, services, peer, req).await;
                    drop(busy);
                    Ok::<_, Infallible>(resp)
                }
            });
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            let res = tokio::select! {
                r = conn.as_mut() => r,
                () = conn_state.close.notified() => {
                    if conn_state.never_used() {
                        Ok(())
                    } else {
                        conn.as_mut().graceful_shutdown();
                        let grace = if shutting_down.load(Ordering::SeqCst) { DRAIN_TIMEOUT } else { CLOSE_GRACE };
                        tokio::time::timeout(grace, conn).await.unwrap_or(Ok(()))
                    }
                }
            };
            if let Err(e) = res {
                log_at!(Level::Debug, "connection: {e}");
            }
            conns.remove(id);
            drop(permit);
        });
    }
    drop(listener);
    shutting_down.store(true, Ordering::SeqCst);
    conns.close_all();
    let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN_TIMEOUT, limit.acquire_many(all))
        .await
        .is_err()
    {
        log_at!(
            Level::Warn,
            "shutdown: gave up waiting for in-flight requests after {DRAIN_TIMEOUT:?}"
        );
    }
}
