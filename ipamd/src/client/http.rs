//! A minimal blocking HTTP/1.1 client over a unix socket: one request per connection,
//! written by hand and parsed with `httparse`. The plugin process is short-lived, so no async
//! runtime is started in it.

use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Largest response accepted (a lease listing of a big node fits comfortably).
const MAX_RESPONSE: usize = 64 << 20;

/// Why a call did not produce a response.
#[derive(Debug)]
pub(crate) enum Transport {
    /// Nobody listens (socket file missing, or connection refused): do the work in-process.
    NoDaemon(String),
    /// The daemon accepted and then went away or stopped answering. Every operation is
    /// idempotent per key and serialized by the store lock, so redoing it in-process is safe.
    Died(String),
    /// Anything else (e.g. permission denied on the socket): report it.
    Failed(String),
}

pub(crate) struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

#[cfg(test)]
pub(crate) fn request(
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
    connect_timeout: Duration,
    io_timeout: Duration,
) -> Result<Response, Transport> {
    request_with(
        socket,
        method,
        target,
        &[],
        body,
        connect_timeout,
        io_timeout,
    )
}

/// [`request`] with extra header lines (names and values must be valid HTTP tokens/text).
pub(crate) fn request_with(
    socket: &Path,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    connect_timeout: Duration,
    io_timeout: Duration,
) -> Result<Response, Transport> {
    let mut stream = connect(socket, connect_timeout)?;
    let died = |what: &str, e: io::Error| {
        Transport::Died(format!("ipamd at {} {what}: {e}", socket.display()))
    };
    stream
        .set_read_timeout(Some(io_timeout))
        .and_then(|()| stream.set_write_timeout(Some(io_timeout)))
        .map_err(|e| Transport::Failed(format!("setting socket timeouts: {e}")))?;

    let body = body.unwrap_or_default();
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: ipamd\r\nConnection: close\r\nAccept: application/json\r\n"
    );
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    if method != "GET" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    let mut msg = req.into_bytes();
    msg.extend_from_slice(body);
    stream
        .write_all(&msg)
        .map_err(|e| died("closed the connection while we sent the request", e))?;

    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = stream
            .read(&mut chunk)
            .map_err(|e| died("did not answer", e))?;
        if n == 0 {
            return Err(Transport::Died(format!(
                "ipamd at {} closed the connection before answering",
                socket.display()
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let parsed = resp
            .parse(&buf)
            .map_err(|e| Transport::Failed(format!("ipamd sent a malformed response: {e}")))?;
        let httparse::Status::Complete(head_len) = parsed else {
            if buf.len() > MAX_RESPONSE {
                return Err(Transport::Failed("ipamd response header too large".into()));
            }
            continue;
        };
        let status = resp.code.unwrap_or(0);
        let length = content_length(resp.headers)?;
        let mut body = buf.split_off(head_len);
        read_body(&mut stream, &mut body, length)
            .map_err(|e| died("stopped in the middle of its answer", e))?;
        return Ok(Response { status, body });
    }
}

fn content_length(headers: &[httparse::Header<'_>]) -> Result<Option<usize>, Transport> {
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .filter(|n| *n <= MAX_RESPONSE)
                .ok_or_else(|| Transport::Failed("ipamd sent a bad Content-Length".into()))?;
            return Ok(Some(n));
        }
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Transport::Failed(
                "ipamd sent a chunked response, which this client does not read".into(),
            ));
        }
    }
    Ok(None)
}

/// Read the body: `length` bytes, or (without Content-Length) until the daemon closes, which
/// it does because we asked for `Connection: close`.
fn read_body(stream: &mut UnixStream, body: &mut Vec<u8>, length: Option<usize>) -> io::Result<()> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(len) = length {
            if body.len() >= len {
                body.truncate(len);
                return Ok(());
            }
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return match length {
                None => Ok(()),
                Some(_) => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "response cut short",
                )),
            };
        }
        body.extend_from_slice(&chunk[..n]);
        if body.len() > MAX_RESPONSE {
            return Err(io::Error::other("response too large"));
        }
    }
}

/// Connect with a deadline. std's `UnixStream::connect` blocks without limit when the
/// listener's backlog is full; on Linux a unix-socket connect honours SO_SNDTIMEO, so set
/// that on a socket made by hand before connecting.
fn connect(path: &Path, timeout: Duration) -> Result<UnixStream, Transport> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() {
        return Err(Transport::Failed(format!(
            "socket path {} is empty or too long",
            path.display()
        )));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket(2); the result is checked and owned right away.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Transport::Failed(format!(
            "socket(): {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: fd is a fresh descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let stream = UnixStream::from(owned);
    stream
        .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
        .map_err(|e| Transport::Failed(format!("setting connect timeout: {e}")))?;
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_un of `len` bytes, fd is open.
    let rc = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc == 0 {
        return Ok(stream);
    }
    let err = io::Error::last_os_error();
    let msg = format!("connecting to ipamd at {}: {err}", path.display());
    Err(match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED) => Transport::NoDaemon(msg),
        Some(libc::EAGAIN) | Some(libc::EINPROGRESS) | Some(libc::ETIMEDOUT) => {
            Transport::Died(format!("{msg} (timed out after {timeout:?})"))
        }
        _ => Transport::Failed(msg),
    })
}
