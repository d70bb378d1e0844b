//! IPAM delegation as the interface plugins do it: ADD that gives back what it
//! took when a later step fails, and the other verbs only when there is IPAM.

use crate::cni::delegate;
use crate::cni::{CniResult, Command, Error, Request};

/// IPAM ADD. When it fails, IPAM DEL follows (the spec asks it of a plugin
/// whose delegate's ADD failed), so that an IPAM plugin that allocated part
/// of what it was asked for can let go of it.
pub fn ipam_add(req: &Request) -> Result<CniResult, Error> {
    ipam_rollback_on_error(req, || delegate::ipam(req, Command::Add)).map(Option::unwrap_or_default)
}

/// Run `step`; if it fails, release what IPAM gave out for this attachment so
/// a failed ADD leaves no reservation behind (nothing to do without IPAM).
pub fn ipam_rollback_on_error<T>(
    req: &Request,
    step: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    step().inspect_err(|_| {
        if req.conf.ipam_type.is_none() {
            return;
        }
        if let Err(e) = delegate::ipam(req, Command::Del) {
            eprintln!("cleanup after failed ADD: {e}");
        }
    })
}

/// Run the IPAM plugin for `command` when the config has one (STATUS, GC,
/// CHECK and DEL of plugins whose only other state is in the netns).
pub fn ipam_if_configured(req: &Request, command: Command) -> Result<(), Error> {
    if req.conf.ipam_type.is_some() {
        delegate::ipam(req, command)?;
    }
    Ok(())
}

/// The reference's rule for interface plugins whose only source of addresses
/// is IPAM (dummy, vlan): refuse a configuration without it, before ADD makes anything.
pub fn require_ipam(req: &Request, plugin: &str) -> Result<(), Error> {
    match req.conf.ipam_type {
        Some(_) => Ok(()),
        None => Err(Error::invalid_config(format!(
            "{plugin} interface requires an IPAM configuration (an \"ipam\" section with a type)"
        ))),
    }
}
