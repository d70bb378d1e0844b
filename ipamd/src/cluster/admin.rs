//! `cnikit ipamd pool create|show|delete|release-node`: the operator's side of the pools,
//! straight against etcd (no daemon needed).

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::Serialize;

use super::etcd::{patiently, Etcd};
use super::{
    block_key, blocks, blocks_prefix, node_key, pool_key, BlockRecord, EtcdOptions, PoolSpec,
};
use crate::{Error, ErrorKind};

/// One pool command.
#[derive(Debug, Clone)]
pub enum PoolCommand {
    Create {
        name: String,
        cidr: IpNet,
        /// Default: /26 for IPv4, /122 for IPv6 (64 addresses either way).
        block_size: Option<u8>,
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

/// `pool show --json`: `{"name", "cidr", "blockSize", "blocks": [{"cidr", "node", "inUse"}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolShow {
    pub name: String,
    pub cidr: IpNet,
    pub block_size: u8,
    pub blocks: Vec<BlockShow>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockShow {
    pub cidr: IpNet,
    pub node: String,
    pub in_use: u64,
}

/// What a command did, for the CLI to print.
#[derive(Debug, Clone)]
pub enum PoolOutcome {
    Created(PoolShow),
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the tokio runtime", &e))?;
    rt.block_on(async {
        let etcd = Etcd::connect(etcd).await?;
        run(&etcd, cmd).await
    })
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
            cidr,
            block_size,
        } => {
            let what = format!("pool create {name}");
            patiently(&what, || create(etcd, &name, cidr, block_size)).await
        }
        PoolCommand::Show { name } => {
            let (shown, _) = patiently(&format!("pool {name}"), || show(etcd, &name)).await?;
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

async fn create(
    etcd: &Etcd,
    name: &str,
    cidr: IpNet,
    block_size: Option<u8>,
) -> Result<PoolOutcome, Error> {
    super::check_pool(name)?;
    let default = if cidr.addr().is_ipv4() {
        super::DEFAULT_BLOCK_SIZE_V4
    } else {
        super::DEFAULT_BLOCK_SIZE_V6
    };
    let spec = PoolSpec {
        cidr,
        block_size: block_size.unwrap_or(default),
    };
    blocks::check_spec(&spec)?;
    let pools = etcd.list(&format!("{}/pools/", super::PREFIX)).await?;
    for kv in &pools {
        let Some(other) = kv.key.strip_prefix(&format!("{}/pools/", super::PREFIX)) else {
            continue;
        };
        if other.contains('/') {
            continue; // a block, not a pool
        }
        if let Ok(o) = serde_json::from_slice::<PoolSpec>(&kv.value) {
            if other != name
                && (o.cidr.contains(&cidr.network()) || cidr.contains(&o.cidr.network()))
            {
                return Err(Error::invalid(format!(
                    "--cidr {cidr} overlaps pool {other} ({}): one address must belong to one pool",
                    o.cidr
                )));
            }
        }
    }
    let value = encode(&spec)?;
    if etcd.create(&pool_key(name), value, &[]).await?.is_none() {
        let existing = read_spec(etcd, name).await?;
        if existing.as_ref().map(|(s, _)| s) == Some(&spec) {
            // Same pool again: creating is idempotent, so scripts can run it twice.
            return Ok(PoolOutcome::Created(show(etcd, name).await?.0));
        }
        let what = existing
            .map(|(s, _)| format!("{} with --block-size {}", s.cidr, s.block_size))
            .unwrap_or_else(|| "something else".into());
        return Err(Error::new(
            ErrorKind::Conflict,
            format!("pool {name} already exists as {what}; delete it first to change it"),
        ));
    }
    Ok(PoolOutcome::Created(show(etcd, name).await?.0))
}

/// The pool's spec and the create revision of its key.
pub(crate) async fn read_spec(etcd: &Etcd, name: &str) -> Result<Option<(PoolSpec, i64)>, Error> {
    let Some(kv) = etcd.get(&pool_key(name)).await? else {
        return Ok(None);
    };
    let spec: PoolSpec = serde_json::from_slice(&kv.value).map_err(|e| {
        Error::internal(format!(
            "etcd key {} holds no pool spec ({e}); fix or delete it with etcdctl",
            kv.key
        ))
    })?;
    Ok(Some((spec, kv.create_revision)))
}

/// A claimed block as read from etcd.
#[derive(Debug, Clone)]
pub(crate) struct ClaimedBlock {
    pub cidr: IpNet,
    pub record: BlockRecord,
    pub mod_revision: i64,
}

/// The pool's claimed blocks (unparsable keys are reported and skipped: they are not ours).
pub(crate) async fn read_blocks(etcd: &Etcd, name: &str) -> Result<Vec<ClaimedBlock>, Error> {
    let prefix = blocks_prefix(name);
    let mut out = Vec::new();
    for kv in etcd.list(&prefix).await? {
        let cidr = kv.key.strip_prefix(&prefix).and_then(|c| c.parse().ok());
        let record = serde_json::from_slice::<BlockRecord>(&kv.value).ok();
        match (cidr, record) {
            (Some(cidr), Some(record)) => out.push(ClaimedBlock {
                cidr,
                record,
                mod_revision: kv.mod_revision,
            }),
            _ => crate::log_at!(
                crate::log::Level::Warn,
                "etcd key {} is not a block record; ignored",
                kv.key
            ),
        }
    }
    Ok(out)
}

fn not_found(name: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("pool {name} does not exist (create it with `cnikit ipamd pool create {name} --cidr CIDR`)"),
    )
}

async fn show(etcd: &Etcd, name: &str) -> Result<(PoolShow, i64), Error> {
    super::check_pool(name)?;
    let Some((spec, rev)) = read_spec(etcd, name).await? else {
        return Err(not_found(name));
    };
    let mut blocks = read_blocks(etcd, name).await?;
    blocks.sort_by_key(|b| blocks::index_of(&spec, &b.cidr));
    Ok((
        PoolShow {
            name: name.to_string(),
            cidr: spec.cidr,
            block_size: spec.block_size,
            blocks: blocks
                .into_iter()
                .map(|b| BlockShow {
                    cidr: b.cidr,
                    node: b.record.node,
                    in_use: b.record.in_use,
                })
                .collect(),
        },
        rev,
    ))
}

/// Nodes whose session key exists (their daemon runs, or died less than a TTL ago).
async fn live_nodes(etcd: &Etcd) -> Result<Vec<String>, Error> {
    let prefix = node_key("");
    Ok(etcd
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|kv| kv.key.strip_prefix(&prefix).map(str::to_string))
        .collect())
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

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(v).map_err(|e| Error::internal(format!("cannot encode: {e}")))
}
