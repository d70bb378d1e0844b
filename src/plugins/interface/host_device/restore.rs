//! A device going back to the host: from the pod under its original name (or a free
//! one derived from it when the name was taken meanwhile), and a device the kernel
//! returned by itself when the pod's netns went away, renamed back.

use super::conf::{find_host_link, Selector};
use super::is_name_taken;
use crate::cni::Error;
use crate::netlink::{Link, NetNs, Netlink};

/// The original name a device carries in its alias, when the alias is one (an ifname).
pub(super) fn original_name(link: &Link) -> Option<String> {
    let alias = link.alias.as_deref().filter(|a| !a.is_empty())?;
    crate::cni::env::validate_ifname(alias).ok()?;
    Some(alias.to_string())
}

/// `<name>_%d` within IFNAMSIZ: the kernel picks the first free `<name>_<n>`.
pub(super) fn clash_pattern(name: &str) -> String {
    let mut cut = name.len().min(12);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_%d", &name[..cut])
}

/// Moves pod link `link` (through `cont`, the pod's socket) to `host_ns` as `original`,
/// its alias cleared; when `original` is taken there, as the first free `<original>_<n>`
/// with the alias kept (it still names the device's own name). The name it got.
pub(super) fn return_to_host(
    cont: &mut Netlink,
    link: &Link,
    original: &str,
    host_ns: &NetNs,
) -> Result<String, Error> {
    let mut host = Netlink::open_in(host_ns)?;
    if host.link_by_name(original)?.is_none() {
        match cont.move_link_to(link.index, host_ns, original, "") {
            Ok(()) => return Ok(original.to_string()),
            Err(e) if is_name_taken(&e) => {}
            Err(e) => return Err(e.into()),
        }
        // Taken meanwhile. Either nothing moved, or the device is on the host under
        // its pod name (the rename after the move failed).
        if cont
            .link_by_index(link.index)?
            .filter(|l| l.name == link.name)
            .is_none()
        {
            return rename_stranded(&mut host, &link.name, original);
        }
    }
    cont.move_link_to(link.index, host_ns, &clash_pattern(original), original)?;
    named_after(&mut host, original)
}

/// The device on the host under its pod name `pod_name`, alias `original`: renamed to
/// a free `<original>_<n>` (it is down: it just moved).
fn rename_stranded(host: &mut Netlink, pod_name: &str, original: &str) -> Result<String, Error> {
    let Some(l) = host.link_by_name(pod_name)? else {
        return named_after(host, original);
    };
    host.rename(l.index, &clash_pattern(original))?;
    named_after(host, original)
}

/// The host link whose alias is `original` and whose name is `original_<n>`.
fn named_after(host: &mut Netlink, original: &str) -> Result<String, Error> {
    let prefix = clash_pattern(original).trim_end_matches("%d").to_string();
    let found = host
        .links()?
        .into_iter()
        .find(|l| l.alias.as_deref() == Some(original) && l.name.starts_with(&prefix));
    Ok(found.map_or_else(|| format!("{prefix}?"), |l| l.name))
}

/// DEL with the pod's netns gone. The kernel moves a physical device of a dying netns to
/// the initial netns under its pod name (`dev<n>` if that is taken), alias and all;
/// virtual devices (veth, …) are destroyed with it. Here, in the plugin's netns (the
/// initial one for a runtime on the host), the device `sel` names is renamed back from
/// its alias when it is such a returned device: named `ifname` or `dev<n>`, with an
/// alias that differs from its name. Best effort: DEL does not fail on it.
pub(super) fn restore_refunded(sel: &Selector, ifname: &str) {
    if let Err(e) = try_restore(sel, ifname) {
        eprintln!("DEL: returning the device to its own name: {e}");
    }
}

fn try_restore(sel: &Selector, ifname: &str) -> Result<(), Error> {
    let mut host = Netlink::open()?;
    let candidate = match sel {
        // The device is not under its own name now: look for its alias.
        Selector::Name(name) => host
            .links()?
            .into_iter()
            .find(|l| l.alias.as_deref() == Some(name.as_str()) && l.name != *name),
        other => find_host_link(&mut host, other).ok(),
    };
    let Some(link) = candidate else {
        return Ok(());
    };
    let Some(original) = original_name(&link).filter(|o| *o != link.name) else {
        return Ok(());
    };
    if !(link.name == ifname || is_kernel_fallback_name(&link.name)) {
        return Ok(());
    }
    if host.link_by_name(&original)?.is_some() {
        eprintln!(
            "DEL: {original} is taken on the host; its device stays {} (alias {original})",
            link.name
        );
        return Ok(());
    }
    if link.up {
        host.set_down(link.index)?;
    }
    host.rename(link.index, &original)?;
    host.set_alias(link.index, "")?;
    Ok(())
}

/// `dev<n>`: the name the kernel gives a returned device whose name is taken.
fn is_kernel_fallback_name(name: &str) -> bool {
    name.strip_prefix("dev")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clash_names_fit_ifnamsiz() {
        assert_eq!(clash_pattern("eth1"), "eth1_%d");
        assert_eq!(clash_pattern("enp129s0f1v127"), "enp129s0f1v1_%d");
        assert!(is_kernel_fallback_name("dev3"));
        assert!(!is_kernel_fallback_name("dev"));
        assert!(!is_kernel_fallback_name("devx1"));
    }
}
