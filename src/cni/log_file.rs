//! `logFile`: a copy of a plugin call's stderr, and one line per call, in a
//! file the operator names in the network configuration. Runtimes often
//! swallow a plugin's stderr (containerd logs only the error's message), so
//! this is where DEL's warnings about input it ignored, and the error itself,
//! can still be read afterwards. The runtime gets stdout and stderr exactly as
//! without it, and a log file that cannot be used never fails the call.
//!
//! How stderr is captured: fd 2 is teed through a pipe for the duration of
//! the call — a thread copies every byte to the real stderr as it arrives and
//! every complete line to the file — then fd 2 is restored and the thread
//! joined before the process exits. The alternative, routing the runner's
//! error and a `warn!` helper at every `eprintln!` through one function, was
//! rejected: stderr is written from many places that know nothing of the
//! configuration (the ipamd crate's client logs, the firewall layer's lock
//! notes, delegated plugins exec'd with our fd 2), and every future
//! `eprintln!` would silently bypass the file. The tee catches all of them
//! with no change outside the runner. The extra thread does no namespace work
//! (only the main thread enters container namespaces), and it exists only
//! when `logFile` is set.
//!
//! Lines, each one `write(2)` on an `O_APPEND` file so concurrent calls do
//! not tear each other's lines (the pid tells calls apart):
//!
//! ```text
//! 2025-01-02T03:04:05.123Z bridge[812] stderr: DEL: ignoring a configuration …
//! 2025-01-02T03:04:05.130Z bridge[812] DEL containerID=abc ifname=eth0: ok
//! 2025-01-02T03:04:05.131Z bridge[813] ADD containerID=def ifname=eth0: error 7: …
//! ```

use super::error::Error;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the end of a call waits for the tee thread to copy what is left
/// in the pipe. Only a delegate that left a process holding our stderr could
/// make it wait at all; the call's answer is already on stdout by then.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// One call's log: cheap to clone (the panic hook keeps a clone).
#[derive(Clone)]
pub struct CallLog(Arc<Shared>);

struct Shared {
    file: File,
    /// `plugin[pid]`.
    who: String,
    /// `COMMAND containerID=… ifname=…`.
    call: String,
    /// Taken by the first `finish`.
    tee: Mutex<Option<Tee>>,
    /// The call's line is written once.
    finished: AtomicBool,
}

/// fd 2 redirected into a pipe whose reader is the copying thread.
struct Tee {
    /// The stderr the process was started with.
    saved: OwnedFd,
    /// Signalled by the thread when it has copied everything.
    done: Receiver<()>,
}

impl CallLog {
    /// The log of this call when the configuration on stdin sets `logFile`
    /// (key matched as Go does); `None` when it does not, or when the file
    /// cannot be used (then a note on stderr says why).
    pub fn start(plugin: &str, stdin: &[u8]) -> Option<CallLog> {
        let path = log_file_of(stdin)?;
        let file = match open(&path) {
            Ok(f) => f,
            Err(why) => {
                eprintln!("logFile {path:?}: {why}; this call is not logged there");
                return None;
            }
        };
        let log = CallLog(Arc::new(Shared {
            file,
            who: format!("{}[{}]", clean(plugin), std::process::id()),
            call: call_from_env(),
            tee: Mutex::new(None),
            finished: AtomicBool::new(false),
        }));
        match Tee::start(&log) {
            Ok(tee) => *log.0.tee.lock().unwrap_or_else(PoisonError::into_inner) = tee,
            Err(e) => eprintln!(
                "logFile {path:?}: cannot capture stderr ({e}); only the outcome is logged there"
            ),
        }
        Some(log)
    }

    /// End the call: give fd 2 back, wait for the copy of what it carried,
    /// then append the call's line. Only the first call does anything (the
    /// panic hook and the normal exit may both get here).
    pub fn finish(&self, outcome: Result<(), &Error>) {
        let tee = self
            .0
            .tee
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(tee) = tee {
            tee.stop();
        }
        if self.0.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        let result = match outcome {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error {}: {}", e.code, clean(&e.msg)),
        };
        self.append(&format!("{}: {result}", self.0.call));
    }

    /// One line, prefixed with the time and the caller, in one write.
    fn append(&self, text: &str) {
        let line = format!("{} {} {text}\n", rfc3339(SystemTime::now()), self.0.who);
        // A full disk or a vanished file must not fail the call; the runtime
        // still has stderr.
        let _ = (&self.0.file).write_all(line.as_bytes());
    }
}

impl Tee {
    /// Redirect fd 2 into a pipe read by a new thread. `Ok(None)`: there is
    /// no stderr to tee (fd 2 closed).
    fn start(log: &CallLog) -> io::Result<Option<Tee>> {
        // SAFETY: F_GETFD only queries the descriptor.
        if unsafe { libc::fcntl(2, libc::F_GETFD) } < 0 {
            return Ok(None);
        }
        // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor we then own.
        let saved = cvt(unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) })?;
        // SAFETY: `saved` is a fresh descriptor owned by nobody else.
        let saved = unsafe { OwnedFd::from_raw_fd(saved) };
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills `fds` with two new descriptors; CLOEXEC keeps
        // them out of exec'd delegates (they get fd 2 itself).
        cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
        // SAFETY: both are fresh descriptors we own from here on.
        let (reader, writer) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut out = File::from(saved.try_clone()?);
        let (tx, done) = mpsc::channel();
        let copy_log = log.clone();
        std::thread::Builder::new()
            .name("logfile-tee".into())
            .spawn(move || {
                copy(reader, &mut out, &copy_log);
                let _ = tx.send(());
            })?;
        // SAFETY: dup2 onto fd 2; the pipe's writer stays open as fd 2 (no
        // CLOEXEC there, so exec'd delegates write into it too).
        cvt(unsafe { libc::dup2(writer.as_raw_fd(), 2) })?;
        drop(writer);
        Ok(Some(Tee { saved, done }))
    }

    /// Put the original stderr back, which closes the pipe's last writer of
    /// ours; the thread then drains the pipe and ends.
    fn stop(self) {
        // SAFETY: dup2 of a descriptor we own onto fd 2.
        unsafe { libc::dup2(self.saved.as_raw_fd(), 2) };
        let _ = self.done.recv_timeout(DRAIN_WAIT);
    }
}

/// The tee thread: every chunk to the real stderr at once, complete lines to
/// the file, until the pipe's writers are all gone.
fn copy(mut reader: File, out: &mut File, log: &CallLog) {
    let mut lines = Lines::default();
    let mut buf = [0u8; 8192];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // The runtime's stderr comes first and must never depend on the file.
        let _ = out.write_all(&buf[..n]);
        for line in lines.push(&buf[..n]) {
            log.append(&format!("stderr: {line}"));
        }
    }
    if let Some(rest) = lines.rest() {
        log.append(&format!("stderr: {rest}"));
    }
}

/// Splits a byte stream into lines (without their newline).
#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.partial.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            out.push(
                String::from_utf8_lossy(&line[..i])
                    .trim_end_matches('\r')
                    .to_string(),
            );
        }
        out
    }

    /// What is left without a final newline.
    fn rest(&mut self) -> Option<String> {
        if self.partial.is_empty() {
            return None;
        }
        Some(String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned())
    }
}

/// `logFile` of the configuration (top level), if it is a non-empty string.
fn log_file_of(stdin: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(stdin).ok()?;
    let path = super::gojson::field(value.as_object()?, "logFile")?.as_str()?;
    (!path.is_empty()).then(|| path.to_string())
}

/// `COMMAND containerID=… ifname=…` from the environment as the runtime set
/// it (read raw: a call with a bad environment is worth logging too).
fn call_from_env() -> String {
    let var = |k: &str| match std::env::var(k) {
        Ok(v) if !v.is_empty() => clean(&v),
        _ => "-".to_string(),
    };
    format!(
        "{} containerID={} ifname={}",
        var("CNI_COMMAND"),
        var("CNI_CONTAINERID"),
        var("CNI_IFNAME")
    )
}

/// Open `path` for appending: absolute paths only, never through a symbolic
/// link, only a regular file with no other hard links and owned by us (so a
/// planted link or file cannot make a root plugin append to, or leak into,
/// someone else's file); a new file gets mode 0600 whatever the umask.
pub fn open(path: &str) -> Result<File, String> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err("must be an absolute path".into());
    }
    // Checked before opening: opening a FIFO or a device can block or act.
    if let Ok(meta) = std::fs::symlink_metadata(p) {
        if meta.file_type().is_symlink() {
            return Err("is a symbolic link; refusing to follow it".into());
        }
        if !meta.is_file() {
            return Err("is not a regular file".into());
        }
    }
    let options = |create: bool| {
        let mut o = File::options();
        o.append(true)
            .create_new(create)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
        o
    };
    let (file, created) = match options(true).open(p) {
        Ok(f) => (f, true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            (options(false).open(p).map_err(|e| why(&e))?, false)
        }
        Err(e) => return Err(why(&e)),
    };
    let meta = file.metadata().map_err(|e| why(&e))?;
    if !meta.is_file() {
        return Err("is not a regular file".into());
    }
    if created {
        // The umask may have taken bits away (or, at 000, none): be explicit.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| why(&e))?;
        return Ok(file);
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!("is owned by uid {}, not by uid {me}", meta.uid()));
    }
    if meta.nlink() > 1 {
        return Err("has other hard links; refusing to append to it".into());
    }
    Ok(file)
}

fn why(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return "is a symbolic link; refusing to follow it".into();
    }
    format!("cannot open it: {e}")
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Control characters escaped, so one value cannot forge or break lines.
fn clean(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// `2025-01-02T03:04:05.123Z` (RFC 3339, UTC, milliseconds).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
#[path = "log_file_tests.rs"]
mod tests;
