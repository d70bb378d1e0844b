//! Lease API requests that name cluster pools (`ipam.pool`/`ipam.pools`): the cluster node
//! decides which of this node's blocks to allocate from, and the registry's stores do the
//! allocation through the journal as for any range. The registry is the node's
//! [`LocalStore`], so the cluster code never reaches into the server.

use std::net::IpAddr;
use std::sync::Arc;

use crate::api::{AllocateRequest, AllocateResponse, Allocation, LeaseKey, StatusRequest};
use crate::cluster::{ClusterOptions, LocalStore, Node, RouteSync};
use crate::config::RangeSet;
use crate::store::{unexpected, Op, Reply};
use crate::{Error, ErrorKind};

use super::registry::Registry;

impl LocalStore for Registry {
    async fn allocate(&self, req: AllocateRequest) -> Result<Vec<Allocation>, Error> {
        let network = req.key.network.clone();
        match self.call(&network, Op::Allocate(req)).await? {
            Reply::Allocations(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    async fn held(&self, key: LeaseKey) -> Result<Vec<Allocation>, Error> {
        let op = Op::Check {
            cid: key.container_id,
            ifname: key.ifname,
        };
        match self.call(&key.network, op).await? {
            Reply::Allocations(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    async fn has_room(&self, network: &str, set: RangeSet) -> Result<bool, Error> {
        match self.call(network, Op::Status(vec![set])).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::Exhausted => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn networks(&self) -> Result<Vec<String>, Error> {
        Registry::networks(self)
    }

    async fn addresses(&self, network: &str) -> Result<Vec<IpAddr>, Error> {
        match self.call(network, Op::Leases).await? {
            Reply::Leases(l) => Ok(l.into_iter().map(|l| l.address).collect()),
            other => Err(unexpected(&other)),
        }
    }
}

/// Join the cluster: set up the etcd client and start the session and usage loops. Runs on
/// the daemon's runtime before it listens; never waits for etcd itself.
pub(crate) async fn start(
    reg: &Arc<Registry>,
    opts: ClusterOptions,
    routes: Option<Arc<dyn RouteSync>>,
) -> Result<(), Error> {
    let node = Arc::new(Node::new(opts).await?);
    crate::cluster::spawn(Arc::clone(&node), Arc::downgrade(reg), routes);
    reg.cluster
        .set(node)
        .map_err(|_| Error::internal("the cluster node was started twice"))
}

fn node(reg: &Registry, pools: &[String]) -> Result<Arc<Node>, Error> {
    reg.cluster.get().cloned().ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "cluster pool(s) {} need this ipamd daemon to run with --etcd-endpoints and --node; it runs without",
                pools.join(", ")
            ),
        )
    })
}

pub(super) async fn allocate(
    reg: Arc<Registry>,
    req: AllocateRequest,
) -> Result<AllocateResponse, Error> {
    check(&req.pools, &req.range_sets)?;
    let node = node(&reg, &req.pools)?;
    let allocations = node.allocate(&*reg, req).await?;
    Ok(AllocateResponse { allocations })
}

pub(super) async fn status(reg: Arc<Registry>, s: StatusRequest) -> Result<(), Error> {
    check(&s.pools, &s.range_sets)?;
    let node = node(&reg, &s.pools)?;
    node.status(&*reg, &s.network, &s.pools).await
}

fn check(pools: &[String], range_sets: &[RangeSet]) -> Result<(), Error> {
    if !range_sets.is_empty() {
        return Err(Error::invalid(
            "a request names both cluster pools and ranges; use one or the other",
        ));
    }
    for p in pools {
        crate::cluster::check_pool(p)?;
    }
    Ok(())
}

/// The cluster part of /metrics (empty without a cluster).
pub(super) async fn render(reg: &Registry) -> String {
    match reg.cluster.get() {
        Some(n) => n.render_metrics().await,
        None => String::new(),
    }
}
