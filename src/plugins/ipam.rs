//! The IPAM plugins: one plugin, [`Ipam`], over two places to keep leases. `ipamd` is a
//! thin client of the lease daemon (or, with no daemon running, of the same store
//! in-process; see the `ipamd` crate); `host-local` keeps the reference's lease files
//! (host_local.rs). Configuration keys are host-local's, so migrating is a change of
//! `type`.

use crate::cni::{Attachment, CniResult, Code, Dns, Error, IpConfig, Plugin, Request, Route};
use ipamd::api::{AllocateRequest, Allocation};
use ipamd::client::Client;
use ipamd::config::{IpamConfig, RouteSpec};
use ipnet::IpNet;
use std::fmt::Display;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::path::Path;

/// An IPAM plugin keeping its leases in `L`.
pub struct Ipam<L>(PhantomData<fn() -> L>);

impl<L> Ipam<L> {
    pub const PLUGIN: Ipam<L> = Ipam(PhantomData);
}

/// The `ipamd` plugin.
pub type Ipamd = Ipam<DaemonLeases>;

/// One call's leases, as the IPAM plugin's commands use them. Each store parses the
/// `ipam` object itself: their keys differ (pools and the daemon's socket are ipamd's).
pub trait Leases: Sized {
    /// The plugin's name, for log lines.
    const NAME: &'static str;
    /// A held lease as CHECK names it.
    type Lease: Display;

    fn new(req: &Request) -> Result<Self, Error>;
    /// The call DEL makes when `new` refuses the configuration: releasing needs only
    /// where the leases are, not the ranges.
    fn del_fallback(req: &Request) -> Self;
    fn resolv_conf(&self) -> Option<&Path>;
    fn routes(&self) -> &[RouteSpec];
    fn allocate(
        &self,
        key: Attachment,
        requested: Vec<IpAddr>,
    ) -> Result<Vec<Allocation>, ipamd::Error>;
    fn held(&self, key: &Attachment) -> Result<Vec<Self::Lease>, ipamd::Error>;
    fn address(lease: &Self::Lease) -> IpAddr;
    fn release(&self, key: &Attachment) -> Result<(), ipamd::Error>;
    /// Whether ADD could allocate in `network` now.
    fn status(&self, network: &str) -> Result<(), ipamd::Error>;
    /// Frees the leases of `network` held by no attachment in `valid`; how many.
    fn gc(&self, network: &str, valid: &[Attachment]) -> Result<usize, ipamd::Error>;
    /// Where `network`'s leases are, as errors and log lines name it.
    fn place(&self, network: &str) -> String;
}

impl<L: Leases> Plugin for Ipam<L> {
    // ---------------------------------------------------------------- ADD
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let call = L::new(req)?;
        // Read resolvConf first: failing after the allocation would leave leases.
        let dns = read_dns(call.resolv_conf())?;
        let allocations = call.allocate(req.attachment(), requested_ips(req)?)?;
        Ok(add_result(allocations, call.routes(), dns))
    }

    // ---------------------------------------------------------------- CHECK
    /// The attachment holds a lease (the reference's check), and every lease it holds is
    /// among prevResult's addresses when there is one.
    fn check(&self, req: &Request) -> Result<(), Error> {
        let call = L::new(req)?;
        let held = call.held(&req.attachment())?;
        if held.is_empty() {
            return Err(Error::new(
                Code::AddressUnavailable,
                format!(
                    "CHECK: no lease for container {} interface {} in {}",
                    req.container_id(),
                    req.ifname(),
                    call.place(&req.conf.name),
                ),
            ));
        }
        let Some(prev) = &req.conf.prev_result else {
            return Ok(());
        };
        let in_prev = |a: IpAddr| prev.ips.iter().any(|ip| ip.address.addr() == a);
        match held.iter().find(|lease| !in_prev(L::address(lease))) {
            Some(lost) => Err(Error::new(
                Code::AddressUnavailable,
                format!("CHECK: lease {lost} is not among prevResult's addresses"),
            )),
            None => Ok(()),
        }
    }

    // ---------------------------------------------------------------- DEL
    /// Releases the attachment's leases, whatever the rest of the configuration says.
    fn del(&self, req: &Request) -> Result<(), Error> {
        if req.conf.name.is_empty() {
            // No ADD can have succeeded without a network name: nothing to release.
            return Ok(());
        }
        let call = req.conf_or_del_fallback(L::new, L::del_fallback)?;
        call.release(&req.attachment())?;
        Ok(())
    }

    // ---------------------------------------------------------------- STATUS
    /// Any failure means "cannot serve ADD now": code 50, with the reason.
    fn status(&self, req: &Request) -> Result<(), Error> {
        L::new(req)?
            .status(&req.conf.name)
            .map_err(|e| Error::new(Code::NotAvailable, e.to_string()))
    }

    // ---------------------------------------------------------------- GC
    fn gc(&self, req: &Request) -> Result<(), Error> {
        let call = L::new(req)?;
        let freed = call.gc(&req.conf.name, &gc_valid_attachments(req)?)?;
        if freed > 0 {
            eprintln!(
                "{}: GC freed {freed} lease(s) in {}",
                L::NAME,
                call.place(&req.conf.name)
            );
        }
        Ok(())
    }
}

/// ipamd's leases: the parsed `ipam` object and the daemon's client.
pub struct DaemonLeases {
    conf: IpamConfig,
    client: Client,
}

impl Leases for DaemonLeases {
    const NAME: &'static str = "ipamd";
    /// With its prefix length, as the store keeps it.
    type Lease = IpNet;

    fn new(req: &Request) -> Result<DaemonLeases, Error> {
        let ipam = ipam_object(req)?;
        let mut conf = IpamConfig::from_json(ipam)?;
        // Capability ipRanges replaces the configured range sets (CONVENTIONS).
        if let Some(ranges) = req.conf.runtime_config("ipRanges") {
            if ranges.as_array().is_some_and(|a| !a.is_empty()) {
                conf.range_sets = IpamConfig::ranges_from_json(ranges)?;
                // The runtime's ranges replace the configured ones, pools included.
                conf.pools.clear();
            }
        }
        if req.conf.name.is_empty() {
            return Err(Error::invalid_config(
                "the network configuration needs a \"name\"",
            ));
        }
        let client = Client::new(&conf.socket, &conf.data_dir);
        Ok(DaemonLeases { conf, client })
    }

    /// DEL with an `ipam` section `new` refuses: a release needs only where
    /// the store is, and ranges are irrelevant to it.
    fn del_fallback(req: &Request) -> DaemonLeases {
        let ipam = req.conf.raw.get("ipam");
        let path = |key: &str, default: &str| -> std::path::PathBuf {
            ipam.and_then(|i| i.get(key))
                .and_then(serde_json::Value::as_str)
                .unwrap_or(default)
                .into()
        };
        let conf = IpamConfig {
            range_sets: Vec::new(),
            pools: Vec::new(),
            routes: Vec::new(),
            data_dir: path("dataDir", ipamd::config::DEFAULT_DATA_DIR),
            socket: path("socket", ipamd::config::DEFAULT_SOCKET),
            resolv_conf: None,
        };
        let client = Client::new(&conf.socket, &conf.data_dir);
        DaemonLeases { conf, client }
    }

    fn resolv_conf(&self) -> Option<&Path> {
        self.conf.resolv_conf.as_deref()
    }

    fn routes(&self) -> &[RouteSpec] {
        &self.conf.routes
    }

    fn allocate(
        &self,
        key: Attachment,
        requested: Vec<IpAddr>,
    ) -> Result<Vec<Allocation>, ipamd::Error> {
        self.client.allocate(&AllocateRequest {
            key,
            range_sets: self.conf.range_sets.clone(),
            requested,
            pools: self.conf.pools.clone(),
        })
    }

    fn held(&self, key: &Attachment) -> Result<Vec<IpNet>, ipamd::Error> {
        let leases = self.client.check(key)?;
        Ok(leases.into_iter().map(|lease| lease.address).collect())
    }

    fn address(lease: &IpNet) -> IpAddr {
        lease.addr()
    }

    fn release(&self, key: &Attachment) -> Result<(), ipamd::Error> {
        self.client.release(key)
    }

    fn status(&self, network: &str) -> Result<(), ipamd::Error> {
        if self.conf.pools.is_empty() {
            self.client.status(network, &self.conf.range_sets)
        } else {
            self.client.status_pools(network, &self.conf.pools)
        }
    }

    fn gc(&self, network: &str, valid: &[Attachment]) -> Result<usize, ipamd::Error> {
        self.client.gc(network, valid)
    }

    fn place(&self, network: &str) -> String {
        format!("network {network}")
    }
}

/// The configuration's `ipam` object, which every command but DEL needs.
pub(super) fn ipam_object(req: &Request) -> Result<&serde_json::Value, Error> {
    let ipam = req.conf.raw.get("ipam");
    ipam.ok_or_else(|| Error::invalid_config("missing \"ipam\" section"))
}

/// `ipam.resolvConf` read into the result's `dns`, or none.
fn read_dns(resolv_conf: Option<&Path>) -> Result<Dns, Error> {
    Ok(match resolv_conf {
        Some(path) => ipamd::config::parse_resolv_conf(path)?,
        None => Dns::default(),
    })
}

/// ADD's result: the allocated addresses with their gateways, the configured routes
/// and `dns`; no interfaces.
fn add_result(allocations: Vec<Allocation>, routes: &[RouteSpec], dns: Dns) -> CniResult {
    CniResult {
        interfaces: Vec::new(),
        ips: allocations
            .into_iter()
            .map(|a| IpConfig {
                address: a.address,
                gateway: a.gateway,
                interface: None,
            })
            .collect(),
        routes: routes.iter().map(|r| Route::new(r.dst, r.gw)).collect(),
        dns,
    }
}

/// GC's list of attachments still in use, which an IPAM plugin needs: without it every
/// lease of the network would look stale.
fn gc_valid_attachments(req: &Request) -> Result<Vec<Attachment>, Error> {
    req.conf.valid_attachments()?.ok_or_else(|| {
        Error::invalid_config("GC needs cni.dev/valid-attachments (or cni.dev/attachments)")
    })
}

/// Explicitly requested addresses: `CNI_ARGS IP=a,b`, `args.cni.ips`,
/// `runtimeConfig.ips` (capability `ips`), in that order, without duplicates.
fn requested_ips(req: &Request) -> Result<Vec<IpAddr>, Error> {
    let mut out: Vec<IpAddr> = Vec::new();
    let mut push = |raw: &str, key: &str| -> Result<(), Error> {
        // Accept "10.0.0.5" and "10.0.0.5/24" (CONVENTIONS uses both).
        let addr = raw.split('/').next().unwrap_or(raw).trim();
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| Error::invalid_config(format!("{key}: {raw:?} is not an IP address")))?;
        if !out.contains(&ip) {
            out.push(ip);
        }
        Ok(())
    };
    if let Some(list) = req.args.get("IP") {
        for raw in list.split(',').filter(|s| !s.is_empty()) {
            push(raw, "CNI_ARGS IP")?;
        }
    }
    for (key, value) in [
        ("args.cni.ips", req.conf.args_cni("ips")),
        ("runtimeConfig.ips", req.conf.runtime_config("ips")),
    ] {
        let Some(value) = value else { continue };
        let Some(list) = value.as_array() else {
            return Err(Error::invalid_config(format!(
                "{key} must be a list of addresses"
            )));
        };
        for item in list {
            let raw = item
                .as_str()
                .ok_or_else(|| Error::invalid_config(format!("{key}: {item} is not a string")))?;
            push(raw, key)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::cni::gojson::{assert_known, struct_fields};

    /// The `ipam` object is walked by hand in the ipamd crate; these are its
    /// typed parts, and the keys either plugin reads by hand are in `gojson::KEYS`.
    #[test]
    fn ipam_keys_get_go_matching() {
        assert_known(&[
            struct_fields::<ipamd::config::Range>(),
            struct_fields::<ipamd::config::RouteSpec>(),
            &[
                "subnet",
                "ranges",
                "pool",
                "pools",
                "routes",
                "dataDir",
                "socket",
                "resolvConf",
                "ipRanges",
                "ips",
            ],
        ]);
    }
}
