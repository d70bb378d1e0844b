//! The reclaimer: one live daemon gives back the blocks of nodes whose session has been
//! gone for their pool's `reclaimAfter`, and finishes drains.
//!
//! Which daemon: the one holding `/cnikit/reclaimer`, a key created only if absent and
//! attached to its session's lease (etcd's own election recipe: the key goes when the
//! holder's lease does, and the next daemon to look takes it). Every write it makes
//! compares that key's lease, so a daemon that lost the role cannot act on a stale view.
//!
//! Each look reads every pool and block in one list; the pool-wide /metrics gauges are
//! that reading, so no other daemon reads the whole pool for them.
//!
//! How: a node that owns blocks and has no session key gets an absence marker
//! (`/cnikit/absent/<node>`, written only while the session key is absent; the node
//! deletes it when it starts its next session). Once the marker is `reclaimAfter` old, each
//! block of the node is rewritten as quarantined in a transaction that holds only if the
//! session key is still absent, the marker and the block are unchanged. So a node that
//! comes back a moment before keeps every block, and nothing is reclaimed twice.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::admin::finish_drains;
use super::etcd::{Guard, Write};
use super::node::Node;
use super::records::{encode, now_ms, Absence, BlockRecord};
use super::show::{absences, live_nodes, read_all, view, ClaimedBlock};
use super::{absent_key, block_key, node_key, reclaimer_key, LocalStore};
use crate::log::Level;
use crate::{log_at, Error};

/// How often the reclaimer looks (the bound on a reclaim is `reclaimAfter` + TTL
/// + 10 s: two looks, one to see the absence and one to reclaim, fit in it).
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// How soon a look that failed is tried again (as the session loop does). A look is
/// several etcd calls (the role, the pools and blocks, the sessions, the markers, the
/// writes) and fails whole if one does: while members restart, the calls the client sends
/// to one fail for a second or two after it is back, and a whole [`LOOK_EVERY`] after each
/// such failure would push reclaims past their bound.
const LOOK_AGAIN: Duration = Duration::from_millis(500);

pub(crate) async fn reclaim_loop<S: LocalStore>(node: Arc<Node>, store: Weak<S>) {
    // Daemons that do not hold the role look again each third of the session TTL: one
    // etcd call per node that often, and a dead reclaimer replaced within that.
    let idle = (node.opts.session_ttl / 3).max(LOOK_EVERY);
    while store.strong_count() > 0 {
        let pause = match look(&node).await {
            Ok(true) => LOOK_EVERY,
            Ok(false) => idle,
            Err(e) => {
                log_at!(Level::Warn, "node {}: reclaim: {e}", node.name());
                LOOK_AGAIN
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// One look; whether this node holds the role.
async fn look(node: &Node) -> Result<bool, Error> {
    let session = node.session.load(Ordering::SeqCst);
    if session == 0 || node.standing.fenced().is_some() {
        return Ok(false);
    }
    if !take_role(node, session).await? {
        return Ok(false);
    }
    let blocks = read_all(&node.etcd).await?;
    let live = live_nodes(&node.etcd).await?;
    let absent = absences(&node.etcd).await?;
    let at = now_ms();
    node.views.replace(
        (blocks.iter())
            .map(|(name, spec, claimed)| view(name, spec, claimed.clone(), &live, &absent, at))
            .collect(),
    );
    let owners: HashSet<&str> = blocks
        .iter()
        .flat_map(|(_, _, c)| c.iter())
        .filter(|c| c.record.reclaimed.is_none() && !c.record.node.is_empty())
        .map(|c| c.record.node.as_str())
        .collect();
    for n in owners.iter().filter(|n| !live.contains(**n)) {
        match absent.get(*n) {
            None => mark_absent(node, session, n).await?,
            Some(&(since, marker)) => {
                for (pool, spec, claimed) in &blocks {
                    let due = spec.reclaim_after > 0
                        && now_ms().saturating_sub(since)
                            >= spec.reclaim_after.saturating_mul(1000);
                    if due {
                        reclaim_node(node, session, (pool, n, marker), claimed).await?;
                    }
                }
            }
        }
    }
    forget_markers(node, session, &absent, &owners, &live).await?;
    for (pool, spec, _) in &blocks {
        if !spec.draining.is_empty() {
            for cidr in finish_drains(&node.etcd, pool).await? {
                log_at!(
                    Level::Info,
                    "pool {pool}: drained {cidr} has no block left; it left the pool"
                );
            }
        }
    }
    Ok(true)
}

/// Hold the reclaimer key (create it on our lease if absent); whether we hold it.
async fn take_role(node: &Node, session: i64) -> Result<bool, Error> {
    let key = reclaimer_key();
    if let Some(kv) = node.etcd.get(&key).await? {
        return Ok(kv.lease == session);
    }
    let value = serde_json::json!({ "node": node.name() })
        .to_string()
        .into_bytes();
    let took = node.etcd.create_on_lease(&key, value, session).await?;
    if took {
        log_at!(
            Level::Info,
            "node {}: reclaiming the blocks of nodes gone for their pool's reclaimAfter",
            node.name()
        );
    }
    Ok(took)
}

fn as_reclaimer(session: i64) -> Guard {
    Guard::Lease(reclaimer_key(), session)
}

async fn mark_absent(node: &Node, session: i64, gone: &str) -> Result<(), Error> {
    let marker = encode(&Absence { since_ms: now_ms() })?;
    let guards = [
        Guard::Absent(node_key(gone)),
        Guard::Absent(absent_key(gone)),
        as_reclaimer(session),
    ];
    let writes = vec![Write::Put(absent_key(gone), marker, 0)];
    if node
        .etcd
        .write_if("mark", &absent_key(gone), &guards, writes)
        .await?
        .is_some()
    {
        log_at!(
            Level::Info,
            "node {gone} owns blocks and has no etcd session; counting its absence from now"
        );
    }
    Ok(())
}

/// Quarantine every block `gone` owns in `pool`, each only if `gone` is still without a
/// session, its marker unchanged (`marker` is its mod revision) and the block unchanged.
async fn reclaim_node(
    node: &Node,
    session: i64,
    (pool, gone, marker): (&str, &str, i64),
    claimed: &[ClaimedBlock],
) -> Result<(), Error> {
    for c in claimed
        .iter()
        .filter(|c| c.record.node == gone && c.record.reclaimed.is_none())
    {
        let key = block_key(pool, &c.cidr);
        let guards = [
            Guard::Absent(node_key(gone)),
            Guard::ModRevision(absent_key(gone), marker),
            Guard::ModRevision(key.clone(), c.mod_revision),
            as_reclaimer(session),
        ];
        let record = encode(&BlockRecord::quarantined(gone, now_ms()))?;
        let writes = vec![Write::Put(key.clone(), record, 0)];
        if node
            .etcd
            .write_if("reclaim", &key, &guards, writes)
            .await?
            .is_some()
        {
            node.counters.reclaimed.fetch_add(1, Ordering::Relaxed);
            log_at!(
                Level::Warn,
                "pool {pool}: reclaimed block {} from node {gone} (no etcd session for the pool's reclaimAfter; it had {} address(es) in use); quarantined: claimed again only when no free block is left",
                c.cidr,
                c.record.in_use
            );
        }
    }
    Ok(())
}

/// Delete the markers of nodes that hold no block any more (or are back: their own session
/// start deletes the marker, this only tidies after a crash in between).
async fn forget_markers(
    node: &Node,
    session: i64,
    absent: &HashMap<String, (u64, i64)>,
    owners: &HashSet<&str>,
    live: &HashSet<String>,
) -> Result<(), Error> {
    for (gone, (_, marker)) in absent {
        if owners.contains(gone.as_str()) && !live.contains(gone) {
            continue;
        }
        let guards = [
            Guard::ModRevision(absent_key(gone), *marker),
            as_reclaimer(session),
        ];
        let writes = vec![Write::Delete(absent_key(gone))];
        node.etcd
            .write_if("forget", &absent_key(gone), &guards, writes)
            .await?;
    }
    Ok(())
}
