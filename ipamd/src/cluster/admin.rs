//! `cnikit ipamd pool create|show|delete|release-node`: the operator's side of the pools,
//! straight against etcd (no daemon needed).

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::etcd::{patiently, with_etcd, Etcd, Guard, Write};
use super::records::{encode, PoolSpec};
use super::show::{live_nodes, not_found, read_blocks, read_pools, read_spec, show, PoolShow};
use super::{block_key, blocks, node_key, pool_key, poolset_key, EtcdOptions};
use crate::{Error, ErrorKind};

/// One pool command.
#[derive(Debug, Clone)]
pub enum PoolCommand {
    Create {
        name: String,
        cidrs: Vec<IpNet>,
        /// Default: /26 for IPv4, /122 for IPv6 (64 addresses either way).
        block_size: Option<u8>,
        /// Seconds; 0 = manual only.
        reclaim_after: u64,
    },
    Update {
        name: String,
        add_cidrs: Vec<IpNet>,
        drain_cidrs: Vec<IpNet>,
        reclaim_after: Option<u64>,
    },
    Show {
        name: String,
    },
    Delete {
        name: String,
    },
    ReleaseNode {
        name: String,
        node: String,
        force: bool,
    },
}

/// What a command did, for the CLI to print.
#[derive(Debug, Clone)]
pub enum PoolOutcome {
    Created(PoolShow),
    Updated(PoolShow),
    Shown(PoolShow),
    Deleted {
        name: String,
        freed: usize,
    },
    Released {
        name: String,
        node: String,
        freed: Vec<IpNet>,
    },
}

/// Run one command against etcd, on a runtime of its own (the CLI is synchronous).
pub fn pool_command(etcd: &EtcdOptions, cmd: PoolCommand) -> Result<PoolOutcome, Error> {
    with_etcd(etcd, |etcd| async move { run(&etcd, cmd).await })
}

/// Every command waits out an election in progress (etcd answering nothing for a
/// while) rather than reporting it: each is safe to run again from the start. A create
/// again finds its pool, the same, and says it is made; a delete again that finds the
/// pool gone after a try had sent the delete reports that delete; a release again frees
/// what is left, and lists what the earlier tries freed (but for a block whose delete
/// was applied and its answer lost: it is not listed, though free).
async fn run(etcd: &Etcd, cmd: PoolCommand) -> Result<PoolOutcome, Error> {
    match cmd {
        PoolCommand::Create {
            name,
            cidrs,
            block_size,
            reclaim_after,
        } => {
            let spec = new_spec(cidrs, block_size, reclaim_after)?;
            let what = format!("pool create {name}");
            patiently(&what, || create(etcd, &name, &spec)).await
        }
        PoolCommand::Update {
            name,
            add_cidrs,
            drain_cidrs,
            reclaim_after,
        } => {
            let change = Change {
                add: add_cidrs,
                drain: drain_cidrs,
                reclaim_after,
            };
            patiently(&format!("pool update {name}"), || {
                update(etcd, &name, &change)
            })
            .await?;
            // Drains with no block left finish now; the others when their last block goes.
            patiently(&format!("pool update {name}"), || {
                finish_drains(etcd, &name)
            })
            .await?;
            let shown = patiently(&format!("pool {name}"), || show(etcd, &name)).await?;
            Ok(PoolOutcome::Updated(shown))
        }
        PoolCommand::Show { name } => {
            let shown = patiently(&format!("pool {name}"), || show(etcd, &name)).await?;
            Ok(PoolOutcome::Shown(shown))
        }
        PoolCommand::Delete { name } => {
            let deleting = std::cell::Cell::new(None);
            let deleted = patiently(&format!("pool delete {name}"), || {
                delete(etcd, &name, &deleting)
            })
            .await;
            match (deleted, deleting.get()) {
                // An earlier try sent the delete and lost its answer: it was the delete.
                (Err(e), Some(freed)) if e.kind() == ErrorKind::NotFound => {
                    Ok(PoolOutcome::Deleted { name, freed })
                }
                (other, _) => other,
            }
        }
        PoolCommand::ReleaseNode { name, node, force } => {
            let freed = std::cell::RefCell::new(Vec::new());
            let what = format!("pool release-node {name} {node}");
            patiently(&what, || release_node(etcd, (&name, &node), force, &freed)).await?;
            Ok(PoolOutcome::Released {
                name,
                node,
                freed: freed.into_inner(),
            })
        }
    }
}

fn new_spec(
    cidrs: Vec<IpNet>,
    block_size: Option<u8>,
    reclaim_after: u64,
) -> Result<PoolSpec, Error> {
    let Some(first) = cidrs.first() else {
        return Err(Error::invalid("pool create needs --cidr"));
    };
    let default = if first.addr().is_ipv4() {
        super::DEFAULT_BLOCK_SIZE_V4
    } else {
        super::DEFAULT_BLOCK_SIZE_V6
    };
    let spec = PoolSpec {
        cidrs,
        block_size: block_size.unwrap_or(default),
        reclaim_after,
        draining: Vec::new(),
    };
    blocks::check_spec(&spec)?;
    Ok(spec)
}

/// Refuse `spec` for pool `name` if one of its CIDRs overlaps another pool's; returns the
/// version of the pool-set key read first, which the write then compares: a create or
/// update of another pool in between (the only way a new overlap can appear) fails it.
async fn check_overlaps(etcd: &Etcd, name: &str, spec: &PoolSpec) -> Result<i64, Error> {
    let version = etcd.get(&poolset_key()).await?.map_or(0, |kv| kv.version);
    for (other, o) in read_pools(etcd).await? {
        if other == name {
            continue;
        }
        for c in &spec.cidrs {
            if let Some(oc) = o.cidrs.iter().find(|oc| blocks::overlap(c, oc)) {
                return Err(Error::invalid(format!(
                    "--cidr {c} overlaps pool {other} ({oc}): one address must belong to one pool"
                )));
            }
        }
    }
    Ok(version)
}

/// Write the pool's spec if the pool key is as `pool_guard` says and no pool was created or
/// updated since `poolset` was read; whether it was written.
async fn write_spec(
    etcd: &Etcd,
    name: &str,
    spec: &PoolSpec,
    pool_guard: Guard,
    poolset: i64,
) -> Result<bool, Error> {
    let guards = [pool_guard, Guard::Version(poolset_key(), poolset)];
    let writes = vec![
        Write::Put(poolset_key(), Vec::new(), 0),
        Write::Put(pool_key(name), encode(spec)?, 0),
    ];
    let key = pool_key(name);
    Ok(etcd
        .write_if("write", &key, &guards, writes)
        .await?
        .is_some())
}

async fn create(etcd: &Etcd, name: &str, spec: &PoolSpec) -> Result<PoolOutcome, Error> {
    super::check_pool(name)?;
    for _ in 0..5 {
        let poolset = check_overlaps(etcd, name, spec).await?;
        if write_spec(etcd, name, spec, Guard::Absent(pool_key(name)), poolset).await? {
            return Ok(PoolOutcome::Created(show(etcd, name).await?));
        }
        let Some((existing, _)) = read_spec(etcd, name).await? else {
            continue; // another pool changed meanwhile: check the overlaps again
        };
        if existing == *spec {
            // Same pool again: creating is idempotent, so scripts can run it twice.
            return Ok(PoolOutcome::Created(show(etcd, name).await?));
        }
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "pool {name} already exists as {} with --block-size {} and --reclaim-after {}; change it with `cnikit ipamd pool update`",
                existing.cidr_list(),
                existing.block_size,
                existing.reclaim_after
            ),
        ));
    }
    Err(busy(name))
}

fn busy(name: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("pool {name}: other pools kept changing while writing it; try again"),
    )
}

/// What `pool update` changes.
struct Change {
    add: Vec<IpNet>,
    drain: Vec<IpNet>,
    reclaim_after: Option<u64>,
}

impl Change {
    fn apply(&self, spec: &mut PoolSpec) -> Result<(), Error> {
        for c in &self.add {
            if spec.cidrs.contains(c) {
                // Adding a draining CIDR again takes it back into service.
                spec.draining.retain(|d| d != c);
            } else {
                spec.cidrs.push(*c);
            }
        }
        for c in &self.drain {
            if !spec.cidrs.contains(c) {
                return Err(Error::invalid(format!(
                    "--drain-cidr {c} is not one of the pool's CIDRs ({})",
                    spec.cidr_list()
                )));
            }
            if !spec.draining.contains(c) {
                spec.draining.push(*c);
            }
        }
        if let Some(r) = self.reclaim_after {
            spec.reclaim_after = r;
        }
        blocks::check_spec(spec)
    }
}

async fn update(etcd: &Etcd, name: &str, change: &Change) -> Result<(), Error> {
    super::check_pool(name)?;
    for _ in 0..5 {
        let Some((mut spec, rev)) = read_spec(etcd, name).await? else {
            return Err(not_found(name));
        };
        let before = spec.clone();
        change.apply(&mut spec)?;
        if spec == before {
            return Ok(());
        }
        let poolset = check_overlaps(etcd, name, &spec).await?;
        let guard = Guard::ModRevision(pool_key(name), rev);
        if write_spec(etcd, name, &spec, guard, poolset).await? {
            return Ok(());
        }
    }
    Err(busy(name))
}

/// Remove from the pool each draining CIDR no block lies in any more, after deleting the
/// quarantined blocks there (nothing claims them again). A claim cannot add a block to a
/// CIDR whose drain was written before its read of the blocks: claims compare the pool
/// key's revision. Returns the CIDRs removed.
pub(crate) async fn finish_drains(etcd: &Etcd, name: &str) -> Result<Vec<IpNet>, Error> {
    let Some((mut spec, rev)) = read_spec(etcd, name).await? else {
        return Ok(Vec::new());
    };
    if spec.draining.is_empty() {
        return Ok(Vec::new());
    }
    let claimed = read_blocks(etcd, name).await?;
    let mut done = Vec::new();
    for d in spec.draining.clone() {
        let mut left = false;
        for b in claimed.iter().filter(|b| d.contains(&b.cidr)) {
            let gone = b.record.reclaimed.is_some()
                && etcd
                    .delete_if(&block_key(name, &b.cidr), b.mod_revision)
                    .await?;
            left |= !gone;
        }
        if !left {
            done.push(d);
        }
    }
    // A pool keeps at least one CIDR (draining, then): its spec needs one.
    if done.len() == spec.cidrs.len() {
        done.pop();
    }
    if done.is_empty() {
        return Ok(done);
    }
    spec.cidrs.retain(|c| !done.contains(c));
    spec.draining.retain(|c| !done.contains(c));
    let guards = [Guard::ModRevision(pool_key(name), rev)];
    let writes = vec![Write::Put(pool_key(name), encode(&spec)?, 0)];
    let written = etcd
        .write_if("drain", &pool_key(name), &guards, writes)
        .await?;
    Ok(if written.is_some() { done } else { Vec::new() })
}

/// `deleting`: set to the number of blocks going with the pool just before the delete is
/// sent (see `run`).
async fn delete(
    etcd: &Etcd,
    name: &str,
    deleting: &std::cell::Cell<Option<usize>>,
) -> Result<PoolOutcome, Error> {
    super::check_pool(name)?;
    let Some(kv) = etcd.get(&pool_key(name)).await? else {
        return Err(not_found(name));
    };
    let blocks = read_blocks(etcd, name).await?;
    let live = live_nodes(etcd).await?;
    // A live node may hand out an address from an empty-looking block at any moment
    // (inUse lags): only blocks of nodes without a session, and empty, go with the pool.
    let mut held: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for b in &blocks {
        if b.record.in_use > 0 || live.contains(&b.record.node) {
            let e = held.entry(b.record.node.clone()).or_default();
            e.0 += 1;
            e.1 += b.record.in_use;
        }
    }
    if !held.is_empty() {
        let list: Vec<String> = held
            .iter()
            .map(|(n, (blocks, used))| {
                format!("{n} ({blocks} block(s), {used} address(es) in use)")
            })
            .collect();
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "pool {name} is in use by {}: remove their pods (empty blocks go back after the daemons' --block-release-after), or release-node a node that is gone",
                list.join(", ")
            ),
        ));
    }
    deleting.set(Some(blocks.len()));
    if !etcd
        .delete_tree_if(&pool_key(name), kv.mod_revision)
        .await?
    {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!("pool {name} changed while deleting it; try again"),
        ));
    }
    Ok(PoolOutcome::Deleted {
        name: name.to_string(),
        freed: blocks.len(),
    })
}

/// Adds the blocks it frees to `freed` as it goes (a try again after an election adds
/// the rest).
async fn release_node(
    etcd: &Etcd,
    (name, node): (&str, &str),
    force: bool,
    freed: &std::cell::RefCell<Vec<IpNet>>,
) -> Result<(), Error> {
    super::check_pool(name)?;
    super::check_node(node)?;
    if read_spec(etcd, name).await?.is_none() {
        return Err(not_found(name));
    }
    if let Some(session) = etcd.get(&node_key(node)).await? {
        if !force {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "node {node} still holds its etcd session (lease {:x}): its daemon runs or stopped less than --etcd-session-ttl ago, and its pods may use these addresses; stop it, wait for the TTL, or pass --force if the node is gone for good",
                    session.lease
                ),
            ));
        }
    }
    for b in read_blocks(etcd, name).await? {
        if b.record.node != node {
            continue;
        }
        // Only the record read here: a block re-claimed meanwhile is someone else's.
        if etcd
            .delete_if(&block_key(name, &b.cidr), b.mod_revision)
            .await?
        {
            freed.borrow_mut().push(b.cidr);
        }
    }
    Ok(())
}
