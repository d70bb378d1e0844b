//! The cluster's /metrics families (Prometheus text): etcd calls, the session, claims and
//! reclaims, and per-pool capacity to alert on.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use super::etcd;
use super::node::Node;
use super::show::Usage;
use crate::prometheus::{family, histogram, single};

/// The cluster's counters, name and help, in the order `render_metrics` reads them.
const COUNTERS: [(&str, &str); 6] = [
    ("ipamd_cluster_block_claims_total", "Blocks claimed in etcd."),
    ("ipamd_cluster_block_releases_total", "Empty blocks given back."),
    (
        "ipamd_cluster_blocks_lost_total",
        "Blocks found no longer this node's in etcd (reclaimed while it was cut off, or release-node --force).",
    ),
    (
        "ipamd_cluster_blocks_reclaimed_total",
        "Blocks this node, as the reclaimer, took back from nodes gone for their pool's reclaimAfter.",
    ),
    ("ipamd_cluster_etcd_requests_total", "etcd calls."),
    ("ipamd_cluster_etcd_errors_total", "etcd calls that failed or timed out."),
];

/// A per-pool gauge: name, help, and its value in a pool's usage.
type Gauge = (&'static str, &'static str, fn(&Usage) -> u64);

impl Node {
    /// The cluster's /metrics families (Prometheus text).
    pub(crate) async fn render_metrics(&self) -> String {
        let owned = self.blocks_owned().await;
        let st = &self.etcd.stats;
        let mut out = String::new();
        let help = "Pool blocks this node allocates from.";
        single(&mut out, "ipamd_cluster_blocks_owned", "gauge", help, owned);
        let c = &self.counters;
        let values = [
            &c.claims,
            &c.releases,
            &c.lost,
            &c.reclaimed,
            &st.calls,
            &st.errors,
        ];
        for ((name, help), v) in COUNTERS.into_iter().zip(values) {
            single(&mut out, name, "counter", help, v.load(Relaxed));
        }
        let name = "ipamd_cluster_etcd_latency_seconds";
        family(&mut out, name, "histogram", "Latency of etcd calls.");
        // Buckets before the count: a call is counted before its bucket, so a call that
        // ends during the scrape cannot make a bucket exceed +Inf.
        let buckets: Vec<(f64, u64)> = (st.buckets.iter().zip(etcd::BUCKETS_MS))
            .map(|(b, le_ms)| (le_ms as f64 / 1000.0, b.load(Relaxed)))
            .collect();
        let calls = st.calls.load(Relaxed);
        let sum = st.latency_us.load(Relaxed) as f64 / 1e6;
        histogram(&mut out, name, "", buckets, calls, sum);
        let up = u8::from(self.session.load(Relaxed) != 0);
        let help = "1 while this node holds an etcd session.";
        single(&mut out, "ipamd_cluster_session_up", "gauge", help, up);
        let fenced = u8::from(self.fenced(&self.bindings()).is_some());
        let help = "1 while this node hands out no new address from its blocks of pools that reclaim (its session could have expired, or its blocks are not yet confirmed).";
        single(&mut out, "ipamd_cluster_fenced", "gauge", help, fenced);
        let help = "Routes to other nodes' blocks this node keeps (--route-blocks).";
        let routes = self.counters.routes.load(Relaxed);
        single(
            &mut out,
            "ipamd_cluster_block_routes",
            "gauge",
            help,
            routes,
        );
        self.render_pools(&mut out).await;
        out
    }

    /// Per-pool gauges, labelled `pool="NAME"`: the pool-wide figures of every pool from the
    /// daemon that reclaims (its last look, at most 10 s old; other daemons leave them out),
    /// this node's owned and lost blocks of the pools it allocates from.
    async fn render_pools(&self, out: &mut String) {
        let bindings = self.bindings();
        let mut pools: Vec<&str> = bindings.iter().map(|b| b.pool.as_str()).collect();
        pools.sort_unstable();
        pools.dedup();
        let mut owned = Vec::new();
        for pool in &pools {
            let mut n = 0;
            for b in bindings.iter().filter(|b| b.pool == *pool) {
                n += b.blocks.read().await.len();
            }
            owned.push((*pool, n as u64));
        }
        let views = self.views.fresh();
        let lost = self.lost_blocks();
        let gauges: [Gauge; 6] = [
            (
                "ipamd_pool_addresses",
                "Leasable addresses of the pool's CIDRs that are not draining.",
                |u| u.addresses,
            ),
            (
                "ipamd_pool_addresses_allocated",
                "Addresses leased in the pool, as the nodes last pushed them.",
                |u| u.allocated,
            ),
            (
                "ipamd_pool_addresses_free",
                "Addresses of the pool not leased.",
                |u| u.free,
            ),
            (
                "ipamd_pool_blocks_free",
                "Blocks never used or given back: what claims take first.",
                |u| u.blocks_free,
            ),
            (
                "ipamd_pool_blocks_quarantined",
                "Blocks reclaimed from dead nodes, claimed only when no free block is left.",
                |u| u.blocks_quarantined,
            ),
            (
                "ipamd_pool_blocks",
                "Blocks of the pool's CIDRs that are not draining.",
                |u| u.blocks,
            ),
        ];
        for (name, help, value) in &gauges {
            family(out, name, "gauge", help);
            for (pool, u) in &views {
                let pool = pool.as_str();
                let _ = writeln!(out, "{name}{{pool=\"{pool}\"}} {}", value(u));
            }
        }
        family(
            out,
            "ipamd_pool_blocks_owned",
            "gauge",
            "Blocks of the pool this node allocates from.",
        );
        for (pool, n) in &owned {
            let _ = writeln!(out, "ipamd_pool_blocks_owned{{pool=\"{pool}\"}} {n}");
        }
        let help = "Blocks of the pool this node lost (reclaimed while it was cut off from etcd) in which it still holds leases.";
        family(out, "ipamd_pool_blocks_lost", "gauge", help);
        for pool in &pools {
            let n = lost
                .iter()
                .filter(|l| l.pool == *pool && l.held > 0)
                .count();
            let _ = writeln!(out, "ipamd_pool_blocks_lost{{pool=\"{pool}\"}} {n}");
        }
    }
}
