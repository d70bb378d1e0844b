//! `cnikit ipamd pool …` and the daemon's cluster flags: clap front ends of the ipamd
//! crate's cluster module.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use ipamd::cluster::{ClusterOptions, EtcdOptions, PoolCommand, PoolOutcome, PoolShow};
use ipnet::IpNet;

/// How to reach etcd (pool commands and the daemon).
#[derive(Args, Debug, Clone)]
pub struct EtcdArgs {
    /// etcd client URLs, comma-separated (http://10.0.0.1:2379,…).
    #[arg(long, value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// CA certificate (PEM) of a TLS-secured etcd.
    #[arg(long)]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for etcd's --client-cert-auth.
    #[arg(long)]
    pub etcd_cert_file: Option<PathBuf>,
    /// Key (PEM) of --etcd-cert-file.
    #[arg(long)]
    pub etcd_key_file: Option<PathBuf>,
    /// Bound of every etcd call, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub etcd_timeout: f64,
}

impl EtcdArgs {
    fn options(&self) -> Result<EtcdOptions, String> {
        if self.etcd_endpoints.is_empty() {
            return Err("--etcd-endpoints is required".into());
        }
        if !(self.etcd_timeout > 0.0 && self.etcd_timeout <= 600.0) {
            return Err(format!(
                "--etcd-timeout {} must be between 0 and 600 seconds",
                self.etcd_timeout
            ));
        }
        Ok(EtcdOptions {
            ca_file: self.etcd_ca_file.clone(),
            cert_file: self.etcd_cert_file.clone(),
            key_file: self.etcd_key_file.clone(),
            timeout: Duration::from_secs_f64(self.etcd_timeout),
            ..EtcdOptions::new(self.etcd_endpoints.clone())
        })
    }
}

/// Where this node's leases are: the daemon's socket, or its store files without it
/// (`ipamd leases`, `pool check`).
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    #[arg(long, default_value = ipamd::config::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    #[arg(long, default_value = ipamd::config::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

impl StoreArgs {
    pub fn client(&self) -> ipamd::client::Client {
        ipamd::client::Client::new(&self.socket, &self.data_dir)
    }
}

/// The daemon's cluster flags; without --etcd-endpoints it serves local ranges only.
#[derive(Args, Debug, Clone)]
pub struct DaemonClusterArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// This node's name in the pools (default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// TTL of this node's etcd session, kept alive while the daemon runs.
    #[arg(long, default_value_t = ipamd::cluster::DEFAULT_SESSION_TTL)]
    pub etcd_session_ttl: u64,
    /// Give a block back to its pool after it held no lease for this long.
    #[arg(long, default_value_t = ipamd::cluster::DEFAULT_BLOCK_RELEASE_AFTER)]
    pub block_release_after: u64,
    /// Keep a route in the main table to every other node's blocks via that node's
    /// address (nodes on one L2 segment; docs/cluster-pools.md).
    #[arg(long)]
    pub route_blocks: bool,
    /// This node's address that other nodes route its blocks to; at most one per family
    /// (default with --route-blocks: the address on the default route's interface).
    #[arg(long = "node-address")]
    pub node_addresses: Vec<std::net::IpAddr>,
}

impl DaemonClusterArgs {
    /// None when no etcd is configured.
    pub fn options(&self) -> Result<Option<ClusterOptions>, String> {
        if self.etcd.etcd_endpoints.is_empty() {
            if self.node.is_some() || self.route_blocks || !self.node_addresses.is_empty() {
                return Err(
                    "--node, --route-blocks and --node-address need --etcd-endpoints".into(),
                );
            }
            return Ok(None);
        }
        if !(2..=3600).contains(&self.etcd_session_ttl) {
            return Err(format!(
                "--etcd-session-ttl {} must be between 2 and 3600 seconds",
                self.etcd_session_ttl
            ));
        }
        let node = match &self.node {
            Some(n) => {
                ipamd::cluster::check_node(n).map_err(|e| format!("--node: {e}"))?;
                n.clone()
            }
            None => ipamd::cluster::hostname().map_err(|e| e.to_string())?,
        };
        Ok(Some(ClusterOptions {
            etcd: self.etcd.options()?,
            node,
            session_ttl: Duration::from_secs(self.etcd_session_ttl),
            block_release_after: Duration::from_secs(self.block_release_after),
            node_addresses: self.node_addresses()?,
        }))
    }
}

impl DaemonClusterArgs {
    /// The addresses published with the session: given, or found with --route-blocks.
    fn node_addresses(&self) -> Result<Vec<std::net::IpAddr>, String> {
        crate::block_routes::check_node_addresses(&self.node_addresses)?;
        match (self.node_addresses.is_empty(), self.route_blocks) {
            (true, true) => crate::block_routes::default_node_addresses(),
            _ => Ok(self.node_addresses.clone()),
        }
    }

    /// The kernel side of --route-blocks, when asked for.
    pub fn block_routes(&self) -> Option<std::sync::Arc<dyn ipamd::cluster::RouteSync>> {
        self.route_blocks
            .then(|| std::sync::Arc::new(crate::block_routes::KernelRoutes) as _)
    }
}

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create a cluster pool (idempotent for the same settings).
    Create {
        name: String,
        /// The pool's address space; repeat for several CIDRs of one family.
        #[arg(long = "cidr", required = true)]
        cidrs: Vec<IpNet>,
        /// Prefix length of each block (default 26 for IPv4, 122 for IPv6).
        #[arg(long)]
        block_size: Option<u8>,
        /// Reclaim a node's blocks once its etcd session has been gone this many
        /// seconds (0: only by `release-node`).
        #[arg(long, default_value_t = 0)]
        reclaim_after: u64,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Change a pool live: add CIDRs, drain CIDRs, set the reclaim policy.
    Update {
        name: String,
        /// A CIDR to add (no overlap with any pool); nodes claim from it at their next claim.
        #[arg(long = "add-cidr")]
        add_cidrs: Vec<IpNet>,
        /// A CIDR to drain: no new block from it, its blocks take no new lease, and it
        /// leaves the pool when its last block is released.
        #[arg(long = "drain-cidr")]
        drain_cidrs: Vec<IpNet>,
        /// Seconds a node's session must be gone before its blocks are reclaimed (0: manual).
        #[arg(long)]
        reclaim_after: Option<u64>,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// The pool's CIDRs, usage, and blocks with owner, state and addresses in use.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Check the pool against etcd and this node's leases (read as `ipamd leases` reads
    /// them); exits 1 when anything is found.
    Check {
        name: String,
        /// This node's name in the pools (default: the host name).
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Delete a pool; refused while any block is in use.
    Delete {
        name: String,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Free the blocks of a node that is gone for good (refused while its etcd session
    /// lives, unless --force).
    ReleaseNode {
        name: String,
        #[arg(long)]
        node: String,
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
}

pub fn run(cmd: PoolCmd) -> Result<(), String> {
    let (etcd, cmd, json) = match cmd {
        PoolCmd::Create {
            name,
            cidrs,
            block_size,
            reclaim_after,
            etcd,
        } => {
            let create = PoolCommand::Create {
                name,
                cidrs,
                block_size,
                reclaim_after,
            };
            (etcd, create, false)
        }
        PoolCmd::Update {
            name,
            add_cidrs,
            drain_cidrs,
            reclaim_after,
            etcd,
        } => {
            if add_cidrs.is_empty() && drain_cidrs.is_empty() && reclaim_after.is_none() {
                return Err("pool update needs --add-cidr, --drain-cidr or --reclaim-after".into());
            }
            let update = PoolCommand::Update {
                name,
                add_cidrs,
                drain_cidrs,
                reclaim_after,
            };
            (etcd, update, false)
        }
        PoolCmd::Show { name, json, etcd } => (etcd, PoolCommand::Show { name }, json),
        PoolCmd::Check {
            name,
            node,
            json,
            store,
            etcd,
        } => return check(&etcd, &name, node, json, &store),
        PoolCmd::Delete { name, etcd } => (etcd, PoolCommand::Delete { name }, false),
        PoolCmd::ReleaseNode {
            name,
            node,
            force,
            etcd,
        } => (etcd, PoolCommand::ReleaseNode { name, node, force }, false),
    };
    let outcome = ipamd::cluster::pool_command(&etcd.options()?, cmd).map_err(|e| e.to_string())?;
    match outcome {
        PoolOutcome::Created(p) => {
            println!(
                "pool {} {} (blocks /{}, reclaim after {}) created",
                p.name,
                cidrs(&p.cidrs),
                p.block_size,
                reclaim(p.reclaim_after)
            );
        }
        PoolOutcome::Updated(p) => {
            println!("pool {} updated", p.name);
            print_pool(&p);
        }
        PoolOutcome::Shown(p) if json => {
            let text = serde_json::to_string_pretty(&p).map_err(|e| e.to_string())?;
            println!("{text}");
        }
        PoolOutcome::Shown(p) => print_pool(&p),
        PoolOutcome::Deleted { name, freed } => {
            println!("pool {name} deleted ({freed} block record(s) of stopped nodes removed)");
        }
        PoolOutcome::Released { name, node, freed } => {
            let list: Vec<String> = freed.iter().map(ToString::to_string).collect();
            println!(
                "pool {name}: released {} block(s) of node {node}{}{}",
                freed.len(),
                if list.is_empty() { "" } else { ": " },
                list.join(", ")
            );
        }
    }
    Ok(())
}

fn cidrs(list: &[IpNet]) -> String {
    let all: Vec<String> = list.iter().map(ToString::to_string).collect();
    all.join(",")
}

fn reclaim(seconds: u64) -> String {
    if seconds == 0 {
        "manual (release-node)".into()
    } else {
        format!("{seconds} s without a session")
    }
}

fn print_pool(p: &PoolShow) {
    let u = &p.usage;
    let draining = if p.draining.is_empty() {
        String::new()
    } else {
        format!(" (draining {})", cidrs(&p.draining))
    };
    println!(
        "pool {} {}{draining} blocks /{}, reclaim {}",
        p.name,
        cidrs(&p.cidrs),
        p.block_size,
        reclaim(p.reclaim_after)
    );
    println!(
        "usage: {} of {} addresses allocated ({:.1} %), {} free; blocks: {} of {} owned, {} quarantined, {} free",
        u.allocated,
        u.addresses,
        u.percent,
        u.free,
        u.blocks_owned,
        u.blocks,
        u.blocks_quarantined,
        u.blocks_free
    );
    println!(
        "{:<44} {:<24} {:<12} {:>6}  STATE",
        "BLOCK", "NODE", "NETWORK", "IN USE"
    );
    for b in &p.blocks {
        let mut state = b.state.clone();
        if let Some(s) = b.absent_for_seconds {
            state.push_str(&format!(" (no session for {s} s)"));
        }
        if let Some(from) = &b.reclaimed_from {
            state.push_str(&format!(" (from {from})"));
        }
        if b.draining {
            state.push_str(", draining");
        }
        println!(
            "{:<44} {:<24} {:<12} {:>6}  {state}",
            b.cidr.to_string(),
            b.node,
            b.network,
            b.in_use
        );
    }
}

/// `pool check`: the report, and exit status 1 when it found anything.
fn check(
    etcd: &EtcdArgs,
    name: &str,
    node: Option<String>,
    json: bool,
    store: &StoreArgs,
) -> Result<(), String> {
    let node = match node {
        Some(n) => n,
        None => ipamd::cluster::hostname().map_err(|e| e.to_string())?,
    };
    let client = store.client();
    let report =
        ipamd::cluster::check_pool_store(&etcd.options()?, name, &node, || client.leases(None))
            .map_err(|e| e.to_string())?;
    if json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        for f in &report.findings {
            println!("{}: {}", f.kind, f.detail);
        }
        println!(
            "pool {} from node {}: {} block(s), {} lease(s) here, {} finding(s)",
            report.pool,
            report.node,
            report.blocks,
            report.leases,
            report.findings.len()
        );
    }
    if report.findings.is_empty() {
        Ok(())
    } else {
        std::process::exit(1)
    }
}
