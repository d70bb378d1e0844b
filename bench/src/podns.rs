//! Pod network namespaces, made in-process (what `ip netns add` does,
//! without paying for an `ip` exec in the measurement loop's neighbourhood).

use crate::sandbox::NETNS_DIR;
use std::ffi::CString;
use std::path::PathBuf;

/// A namespace pinned by a bind mount at `/run/netns/<name>`.
pub struct PodNs {
    pub path: PathBuf,
}

impl PodNs {
    /// Create it on a short-lived thread: `unshare(CLONE_NEWNET)` moves only
    /// the calling thread, and that thread ends right after, so no worker
    /// ever keeps running inside a pod namespace.
    pub fn create(name: &str) -> Result<PodNs, String> {
        let path = PathBuf::from(NETNS_DIR).join(name);
        let target = path.clone();
        std::thread::spawn(move || pin_new_netns(&target))
            .join()
            .map_err(|_| "netns thread panicked".to_string())??;
        Ok(PodNs { path })
    }

    pub fn path_str(&self) -> String {
        self.path.display().to_string()
    }

    /// Unpin (the kernel frees the namespace once nothing holds it).
    pub fn delete(self) {
        if let Ok(c) = CString::new(self.path.as_os_str().as_encoded_bytes()) {
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn pin_new_netns(target: &std::path::Path) -> Result<(), String> {
    std::fs::File::create(target).map_err(|e| format!("create {}: {e}", target.display()))?;
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    let src = CString::new("/proc/thread-self/ns/net").map_err(|e| e.to_string())?;
    let dst = CString::new(target.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "bind mount netns: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
