//! `cnikit ipamd daemon` of the cnikit-daemon set, run inside the sandbox on
//! the default socket (the one the plugins' firewall operations go to without
//! `daemonSocket`). The churn benchmark starts it once; the soak also stops
//! and restarts it, gracefully or not.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const SOCKET: &str = "/run/cnikit/ipamd.sock";
pub const DATA_DIR: &str = "/run/cnikit-bench/ipamd-daemon";

struct Running {
    child: Child,
    cnikit: PathBuf,
    log: Option<PathBuf>,
    level: &'static str,
    extra: Vec<String>,
}

static DAEMON: Mutex<Option<Running>> = Mutex::new(None);

fn slot() -> std::sync::MutexGuard<'static, Option<Running>> {
    DAEMON.lock().unwrap_or_else(|e| e.into_inner())
}

/// Start the daemon (unless one runs) and wait until it accepts. Its stderr
/// goes to `log` (appended, so a restarted daemon adds to it) or ours; `extra` are more
/// of its flags.
///
/// The daemon gets SIGKILL when the thread that started it ends
/// (PR_SET_PDEATHSIG is per thread), so call this from the main thread.
pub fn start(cnikit: &Path, log: Option<&Path>, extra: &[String]) -> Result<(), String> {
    start_at(cnikit, log, "warn", extra)
}

/// [`start`] with the daemon logging at `level`: the repair benchmark reads
/// the info line each repair writes.
pub fn start_at(
    cnikit: &Path,
    log: Option<&Path>,
    level: &'static str,
    extra: &[String],
) -> Result<(), String> {
    let mut slot = slot();
    if slot.is_some() {
        return Ok(());
    }
    *slot = Some(spawn(cnikit, log, level, extra)?);
    drop(slot);
    wait_listening(Duration::from_secs(10))
}

fn spawn(
    cnikit: &Path,
    log: Option<&Path>,
    level: &'static str,
    extra: &[String],
) -> Result<Running, String> {
    let mut cmd = Command::new(cnikit);
    cmd.args(["ipamd", "daemon", "--log-level", level, "--socket"])
        .arg(SOCKET)
        .arg("--data-dir")
        .arg(DATA_DIR)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if let Some(path) = log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        cmd.stderr(file);
    }
    // SAFETY: the hook only makes an async-signal-safe call (see `die_with_parent`).
    unsafe { cmd.pre_exec(die_with_parent) };
    let child = cmd
        .spawn()
        .map_err(|e| format!("starting cnikit ipamd daemon: {e}"))?;
    Ok(Running {
        child,
        cnikit: cnikit.to_path_buf(),
        log: log.map(Path::to_path_buf),
        level,
        extra: extra.to_vec(),
    })
}

/// Run in the daemon's process before exec: it dies with the benchmark, even on SIGKILL.
fn die_with_parent() -> std::io::Result<()> {
    // SAFETY: prctl is async-signal-safe and takes no pointers here.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    Ok(())
}

fn wait_listening(limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while std::os::unix::net::UnixStream::connect(SOCKET).is_err() {
        if Instant::now() > deadline {
            return Err(format!("cnikit ipamd daemon never listened on {SOCKET}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The running daemon's pid.
pub fn pid() -> Option<u32> {
    slot().as_ref().map(|r| r.child.id())
}

/// How a restart went.
pub struct Restarted {
    pub new_pid: u32,
    /// From the signal until the old daemon was reaped.
    pub exit: Duration,
    /// From the signal until the new daemon accepted a connection: the
    /// window in which plugins found no daemon.
    pub down: Duration,
    /// The old daemon's wait status, e.g. "exit status: 0" or "signal: 9".
    pub status: String,
}

/// Stop the daemon with `signal` and, `pause` after it was reaped, start a
/// new one like it.
pub fn restart(signal: libc::c_int, pause: Duration) -> Result<Restarted, String> {
    let mut slot = slot();
    let Some(mut old) = slot.take() else {
        return Err("no daemon to restart".into());
    };
    let t0 = Instant::now();
    let status = kill_and_wait(&mut old.child, signal)?;
    let exit = t0.elapsed();
    std::thread::sleep(pause);
    let new = spawn(&old.cnikit, old.log.as_deref(), old.level, &old.extra)?;
    let new_pid = new.child.id();
    *slot = Some(new);
    drop(slot);
    wait_listening(Duration::from_secs(10))?;
    Ok(Restarted {
        new_pid,
        exit,
        down: t0.elapsed(),
        status: status.to_string(),
    })
}

fn kill_and_wait(
    child: &mut Child,
    signal: libc::c_int,
) -> Result<std::process::ExitStatus, String> {
    // SAFETY: kill(2) on our own child's pid, not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    child
        .wait()
        .map_err(|e| format!("waiting for the daemon: {e}"))
}

/// Stop the daemon (SIGTERM), if one was started; returns its wait status.
pub fn stop() -> Option<String> {
    let mut slot = slot();
    let mut old = slot.take()?;
    kill_and_wait(&mut old.child, libc::SIGTERM)
        .map(|s| s.to_string())
        .ok()
}
