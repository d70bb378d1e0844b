//! What a setup holds on its host, read back from where each plugin set
//! keeps it: counted once with the residents attached (so a check that sees
//! nothing is not mistaken for a clean one) and once after their DEL, when
//! every count must be 0. Runs on the calling thread's host namespace.

use crate::sandbox::{NETNS_DIR, STATE};
use crate::setup::{conflist, Impl, Plugins, Variant};
use crate::soak::check::{self, Check};
use serde_json::Value;
use std::path::Path;

/// Every check of one setup, in the namespace of the calling thread.
pub fn read(key: (Variant, Impl), plugins: &Plugins) -> Vec<Check> {
    let (variant, imp) = key;
    let list = conflist(variant, imp);
    let network = list["name"].as_str().unwrap_or_default().to_string();
    let first = &list["plugins"][0];
    let bridge = match imp {
        Impl::Floor => crate::setup::FLOOR_BRIDGE.to_string(),
        _ => first["bridge"].as_str().unwrap_or_default().to_string(),
    };
    let ipam = &first["ipam"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out = vec![check::check("host links", check::links(&bridge))];
    match imp {
        Impl::Floor => {}
        Impl::Reference | Impl::Upstream => {
            let dir = Path::new(&text(&ipam["dataDir"])).join(&network);
            out.push(check::check("leases", host_local_leases(&dir)));
            if imp == Impl::Reference {
                out.push(check::check("iptables", iptables(&network)));
            } else {
                out.push(check::check(
                    "nft rules",
                    check::nft_commented_rules(UPSTREAM_TABLES),
                ));
            }
        }
        Impl::Cnikit | Impl::CnikitDaemon => {
            let (socket, data_dir) = (text(&ipam["socket"]), text(&ipam["dataDir"]));
            let leases = check::leases_at(&plugins.cnikit_bin, &network, &socket, &data_dir);
            out.push(check::check("leases", leases));
            // The host is this setup's alone: every element is one of ours.
            out.push(check::check("nft elements", check::nft_elements()));
        }
    }
    if imp != Impl::Floor {
        let cache = Path::new(STATE).join(format!("cache-{}", imp.name()));
        let prefix = format!("{network}-");
        out.push(check::check("cache", with_prefix(&cache, &prefix)));
    }
    let pins = with_prefix(Path::new(NETNS_DIR), &netns_prefix(key));
    out.push(check::check("netns", pins));
    out
}

/// The tables of the upstream plugins' nftables backends (bridge's ipMasq,
/// portmap): every rule in them that names a container is per attachment.
const UPSTREAM_TABLES: &[&str] = &["cni_plugins_masquerade", "cni_hostport"];

/// Resident pod namespaces are `r-<impl>-<variant>-<i>`.
pub fn netns_prefix((variant, imp): (Variant, Impl)) -> String {
    format!("r-{}-{}-", imp.short(), variant.name())
}

fn with_prefix(dir: &Path, prefix: &str) -> Result<Vec<String>, String> {
    let all = check::dir_entries(dir)?;
    Ok(all.into_iter().filter(|n| n.starts_with(prefix)).collect())
}

/// host-local keeps one file per leased address next to its lock and its
/// `last_reserved_ip.N` files.
fn host_local_leases(dir: &Path) -> Result<Vec<String>, String> {
    let all = check::dir_entries(dir)?;
    Ok(all
        .into_iter()
        .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
        .collect())
}

/// The reference's per-container iptables state: rules whose comment names
/// the network (ipMasq and portmap tag theirs with it), and the per-container
/// chains `CNI-<hash>` and `CNI-DN-<hash>` (the shared CNI-HOSTPORT-* stay).
fn iptables(network: &str) -> Result<Vec<String>, String> {
    let out = check::stdout_of("iptables-save", &[])?;
    let quoted = format!("\\\"{network}\\\"");
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| {
            l.contains(&quoted) || (l.starts_with(":CNI-") && !l.starts_with(":CNI-HOSTPORT-"))
        })
        .map(str::to_string)
        .collect())
}
