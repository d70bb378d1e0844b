//! One "host" network namespace per setup (variant × implementation), used
//! with `--resident`: resident pods must be the only ones on their node, as
//! on a real node that runs one plugin set. In the shared sandbox namespace
//! the implementations would see each other's residents: cnikit and
//! cnikit-daemon share the `cnikit` nftables table, and every host veth of
//! every set would sit in one namespace. The setups also take turns with
//! their residents (`resident::run`), since the pod netns themselves are the
//! machine's. Without residents the setups share the sandbox's namespace, as
//! they always did.
//!
//! Entering is `setns` of the calling (main) thread: threads it spawns and
//! the processes those exec inherit the namespace, so workers, plugins and
//! the daemon started from there all run in the setup's host. The one daemon
//! runs in the full cnikit-daemon host; the bare one reaches it for IPAM over
//! its unix socket (a path, not bound to a network namespace) and has no
//! firewall work to send it.

use crate::setup::{Impl, Variant};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;

pub struct Hosts {
    /// The sandbox's own namespace, to come back to.
    home: File,
    hosts: HashMap<(Variant, Impl), File>,
}

/// Back in the sandbox's namespace when dropped.
pub struct Entered<'a> {
    home: Option<&'a File>,
}

impl Hosts {
    /// No host namespaces: every setup runs in the sandbox's (the default).
    pub fn shared() -> Result<Hosts, String> {
        Ok(Hosts {
            home: current()?,
            hosts: HashMap::new(),
        })
    }

    /// A fresh namespace per setup, loopback up in each.
    pub fn isolated(keys: &[(Variant, Impl)]) -> Result<Hosts, String> {
        let mut hosts = Hosts::shared()?;
        for &key in keys {
            let ns = std::thread::spawn(new_netns)
                .join()
                .map_err(|_| "host netns thread panicked".to_string())??;
            hosts.hosts.insert(key, ns);
            let _in = hosts.enter(key)?;
            crate::sandbox::loopback_up()?;
        }
        Ok(hosts)
    }

    /// Move the calling thread into the setup's host (no-op when shared).
    pub fn enter(&self, key: (Variant, Impl)) -> Result<Entered<'_>, String> {
        let Some(ns) = self.hosts.get(&key) else {
            return Ok(Entered { home: None });
        };
        setns(ns)?;
        Ok(Entered {
            home: Some(&self.home),
        })
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Some(home) = self.home {
            // Cannot fail for a namespace we were in; if it did, the next
            // enter() still sets the thread's namespace explicitly.
            let _ = setns(home);
        }
    }
}

fn current() -> Result<File, String> {
    File::open("/proc/thread-self/ns/net").map_err(|e| format!("open own netns: {e}"))
}

/// On a short-lived thread, so the caller's namespace never changes; the
/// descriptor keeps the namespace alive after the thread ends.
fn new_netns() -> Result<File, String> {
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    current()
}

fn setns(ns: &File) -> Result<(), String> {
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
