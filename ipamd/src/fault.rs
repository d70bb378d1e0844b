//! Injected I/O failures, for tests only: every write and fsync of the store's files asks
//! [`check`] first, so a test can make chosen ones under its own directory fail with EIO
//! (what a dying disk returns). Outside `cfg(test)` `check` is an empty inline function.

/// The kind of call a failure is injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Write,
    Fsync,
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn check(_path: &std::path::Path, _call: Call) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
pub(crate) use imp::{check, fired, inject};

#[cfg(test)]
mod imp {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use super::Call;

    struct Plan {
        dir: PathBuf,
        call: Call,
        /// Matching calls to let through before failing.
        skip: u32,
        /// Matching calls to fail after that.
        fail: u32,
        fired: u32,
    }

    // Tests run on many threads at once; each one's plans only match paths under its own
    // temp dir, so they do not see each other's failures.
    static PLANS: Mutex<Vec<Plan>> = Mutex::new(Vec::new());

    fn plans() -> std::sync::MutexGuard<'static, Vec<Plan>> {
        PLANS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Let `skip` calls of `call` on paths under `dir` through, then fail the next `fail`
    /// ones (replacing any earlier plan for `dir` and `call`).
    pub(crate) fn inject(dir: &Path, call: Call, skip: u32, fail: u32) {
        let mut p = plans();
        p.retain(|x| !(x.dir == dir && x.call == call));
        p.push(Plan {
            dir: dir.to_path_buf(),
            call,
            skip,
            fail,
            fired: 0,
        });
    }

    /// How many failures the plan for `dir` and `call` has injected so far.
    pub(crate) fn fired(dir: &Path, call: Call) -> u32 {
        plans()
            .iter()
            .find(|x| x.dir == dir && x.call == call)
            .map_or(0, |x| x.fired)
    }

    pub(crate) fn check(path: &Path, call: Call) -> std::io::Result<()> {
        let mut p = plans();
        let Some(plan) = p
            .iter_mut()
            .find(|x| x.call == call && path.starts_with(&x.dir))
        else {
            return Ok(());
        };
        if plan.skip > 0 {
            plan.skip -= 1;
            return Ok(());
        }
        if plan.fail == 0 {
            return Ok(());
        }
        plan.fail -= 1;
        plan.fired += 1;
        Err(std::io::Error::from_raw_os_error(libc::EIO))
    }
}
