//! Injected I/O failures, for tests only: every write and fsync of the store's files asks
//! [`check`] first, so a test can make chosen ones fail with EIO (what a dying disk
//! returns). Two ways, both absent from a normal build, where `check` is an empty inline
//! function:
//! - unit tests (`cfg(test)`) plan failures under their own temp dir ([`inject`]);
//! - the plugin tests (cargo feature `fault-injection`, which the test command enables)
//!   set `CNIKIT_FAULT_STORE=N` for an ADD: the Nth write or fsync of that process fails.

/// The kind of call a failure is injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Write,
    Fsync,
}

#[cfg(not(any(test, feature = "fault-injection")))]
#[inline(always)]
pub(crate) fn check(_path: &std::path::Path, _call: Call) -> std::io::Result<()> {
    Ok(())
}

#[cfg(any(test, feature = "fault-injection"))]
pub(crate) fn check(path: &std::path::Path, call: Call) -> std::io::Result<()> {
    #[cfg(test)]
    imp::check(path, call)?;
    #[cfg(feature = "fault-injection")]
    by_env::check(path, call)?;
    Ok(())
}

#[cfg(test)]
pub(crate) use imp::{fired, inject};

#[cfg(feature = "fault-injection")]
pub use by_env::nth_add_call;

#[cfg(feature = "fault-injection")]
mod by_env {
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Counts one more call in `calls`: its number when the environment of an ADD has
    /// `var` = that number, so the caller fails it; None otherwise. The store's writes
    /// (`CNIKIT_FAULT_STORE`) and cnikit's netlink sends (`CNIKIT_FAULT_NETLINK`) are
    /// counted this way, each with its own counter.
    pub fn nth_add_call(calls: &AtomicU32, var: &str) -> Option<u32> {
        let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
        let at = std::env::var(var).ok();
        let adding = std::env::var("CNI_COMMAND").is_ok_and(|c| c == "ADD");
        (adding && at.and_then(|v| v.parse::<u32>().ok()) == Some(n)).then_some(n)
    }

    pub(super) fn check(path: &std::path::Path, call: super::Call) -> std::io::Result<()> {
        static CALLS: AtomicU32 = AtomicU32::new(0);
        if let Some(n) = nth_add_call(&CALLS, "CNIKIT_FAULT_STORE") {
            return Err(std::io::Error::other(format!(
                "injected failure of store {call:?} {n} on {} (CNIKIT_FAULT_STORE)",
                path.display()
            )));
        }
        Ok(())
    }
}

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

    pub(super) fn check(path: &Path, call: Call) -> std::io::Result<()> {
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
