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
}

impl DaemonClusterArgs {
    /// None when no etcd is configured.
    pub fn options(&self) -> Result<Option<ClusterOptions>, String> {
        if self.etcd.etcd_endpoints.is_empty() {
            if self.node.is_some() {
                return Err("--node needs --etcd-endpoints".into());
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
        }))
    }
}

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create a cluster pool (idempotent for the same CIDR and block size).
    Create {
        name: String,
        #[arg(long)]
        cidr: IpNet,
        /// Prefix length of each block (default 26 for IPv4, 122 for IPv6).
        #[arg(long)]
        block_size: Option<u8>,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// List the pool's claimed blocks: CIDR, owning node, addresses in use.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
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
            cidr,
            block_size,
            etcd,
        } => (
            etcd,
            PoolCommand::Create {
                name,
                cidr,
                block_size,
            },
            false,
        ),
        PoolCmd::Show { name, json, etcd } => (etcd, PoolCommand::Show { name }, json),
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
                "pool {} {} (blocks /{}) created",
                p.name, p.cidr, p.block_size
            );
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

fn print_pool(p: &PoolShow) {
    println!(
        "pool {} {} blocks /{}: {} claimed",
        p.name,
        p.cidr,
        p.block_size,
        p.blocks.len()
    );
    println!("{:<44} {:<30} IN USE", "BLOCK", "NODE");
    for b in &p.blocks {
        println!("{:<44} {:<30} {}", b.cidr.to_string(), b.node, b.in_use);
    }
}
