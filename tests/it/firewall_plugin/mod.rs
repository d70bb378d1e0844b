//! The firewall plugin chained after bridge, on a "node" that looks like
//! one: a network namespace of its own (the plugins run inside it with `ip
//! netns exec`, so its iptables and nftables are theirs) with iptables-nft
//! rules of other software, FORWARD policy drop (IPv4 and IPv6), an unrelated
//! nftables table, and an uplink to an "outside" namespace that routes the
//! pod subnets back to the node.
//!
//! Shown: pod traffic to the outside passes with our plugin and with the
//! reference's, and fails without either; connections from outside to the
//! pod stay dropped; `iptables -S` keeps working (iptables-nft 1.8.9) and
//! lists the rules, `iptables -L -v` counts their packets; both plugins
//! share one jump and chain; `same-bridge` and `isolated` isolation; CHECK;
//! DEL and GC leave nothing of the pod; and the same on a node without
//! iptables, in cnikit's own table.

mod iptables;
mod isolation;
mod own_table;

use crate::support::*;
use serde_json::{json, Value};

/// The outside namespace's address on the node's uplink, and the node's.
pub(super) const OUTSIDE: &str = "198.51.100.2";
pub(super) const NODE_UPLINK: &str = "198.51.100.1";
pub(super) const OUTSIDE6: &str = "2001:db8:51::2";
pub(super) const NODE_UPLINK6: &str = "2001:db8:51::1";
/// Where the outside's servers listen.
pub(super) const TCP_PORT: u16 = 7000;

/// One test's world: the node and the outside, connected; `iptables`: whether
/// the node runs iptables-nft (policy drop and other software's rules) or
/// nothing.
pub(super) struct World {
    pub node: Netns,
    pub outside: Netns,
    _servers: Servers,
    /// Last: dropped after the servers in its namespaces.
    pub env: TestEnv,
}

/// Run `cmd ARGS` inside netns `ns`; success, stdout and stderr.
pub(super) fn in_ns(ns: &Netns, cmd: &str, args: &[&str]) -> (bool, String, String) {
    let mut full = vec!["netns", "exec", &ns.name, cmd];
    full.extend_from_slice(args);
    sh("ip", &full)
}

/// Like [`in_ns`], which must succeed; stdout.
pub(super) fn must(ns: &Netns, cmd: &str, args: &[&str]) -> String {
    let (ok, out, err) = in_ns(ns, cmd, args);
    assert!(ok, "{cmd} {args:?} in {}: {err}", ns.name);
    out
}

impl World {
    pub(super) fn new(test: &str, iptables: bool) -> World {
        let env = TestEnv::new(test);
        let (node, outside) = (env.netns(), env.netns());
        let (up, down) = (ifname_with("fwup"), ifname_with("fwdn"));
        ip(&[
            "link",
            "add",
            &up,
            "netns",
            &node.name,
            "type",
            "veth",
            "peer",
            "name",
            &down,
            "netns",
            &outside.name,
        ]);
        for (ns, dev, v4, v6) in [
            (&node, &up, NODE_UPLINK, NODE_UPLINK6),
            (&outside, &down, OUTSIDE, OUTSIDE6),
        ] {
            ip(&["-n", &ns.name, "link", "set", dev, "up"]);
            ip(&[
                "-n",
                &ns.name,
                "addr",
                "add",
                &format!("{v4}/24"),
                "dev",
                dev,
            ]);
            ip(&[
                "-n",
                &ns.name,
                "-6",
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                dev,
                "nodad",
            ]);
        }
        ip(&[
            "-n",
            &outside.name,
            "route",
            "add",
            "10.0.0.0/8",
            "via",
            NODE_UPLINK,
        ]);
        ip(&[
            "-n",
            &outside.name,
            "-6",
            "route",
            "add",
            "fd00::/8",
            "via",
            NODE_UPLINK6,
        ]);
        if iptables {
            for cmd in ["iptables-nft", "ip6tables-nft"] {
                // Another program's rules (a Docker-like bridge, ssh) and the drop policy.
                must(&node, cmd, &["-P", "FORWARD", "DROP"]);
                must(
                    &node,
                    cmd,
                    &[
                        "-A", "FORWARD", "-i", "docker0", "-o", "docker0", "-j", "ACCEPT",
                    ],
                );
                must(
                    &node,
                    cmd,
                    &["-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"],
                );
            }
            must(
                &node,
                "iptables-nft",
                &[
                    "-t",
                    "nat",
                    "-A",
                    "POSTROUTING",
                    "-s",
                    "172.17.0.0/16",
                    "-j",
                    "MASQUERADE",
                ],
            );
        }
        must(&node, "nft", &["add table inet other; add chain inet other c { type filter hook input priority 10; }"]);
        let servers = Servers::start(&outside.path, "outside", TCP_PORT, TCP_PORT);
        World {
            env,
            node,
            outside,
            _servers: servers,
        }
    }

    /// A new network of a unique name starting with `prefix`, and its gateway
    /// bridge's config ([`World::bridge`]).
    pub(super) fn network(&self, prefix: &str) -> (String, Value) {
        let net = format!("{prefix}-{}", short_hash());
        let (bridge, _) = self.bridge(&net);
        (net, bridge)
    }

    /// A gateway bridge of a new network (dual-stack ipamd) and its name.
    pub(super) fn bridge(&self, net: &str) -> (Value, String) {
        let br = ifname_with("fwpb");
        let nets = self.env.subnets();
        let ipam = self.env.ipam(Ipam::Ipamd, nets.dual_ranges());
        let conf = json!({
            "cniVersion": "1.0.0", "name": net, "type": "bridge", "bridge": br,
            "isGateway": true, "isDefaultGateway": true, "ipam": ipam,
        });
        (conf, br)
    }

    /// `plugin` (ours, or the reference's when `reference`) run in the node.
    pub(super) fn call(
        &self,
        reference: bool,
        plugin: &str,
        verb: &str,
        id: &str,
        pod: &Netns,
        conf: &Value,
    ) -> Outcome {
        let call = if reference {
            self.env.ref_plugin(plugin)
        } else {
            self.env.plugin(plugin)
        };
        call.attach(verb, id, pod, "eth0")
            .conf(conf)
            .exec_in(&self.node)
            .run()
    }

    /// A pod on `bridge`: its id, netns and result.
    pub(super) fn pod(&self, bridge: &Value) -> (String, Netns, Value) {
        let (id, ns) = (cid("fw"), self.env.netns());
        let result = self.call(false, "bridge", "ADD", &id, &ns, bridge).result();
        wait_ipv6_ready(Some(&ns.name));
        (id, ns, result)
    }

    /// Whether the pod reaches the outside over TCP (v4, or v6).
    pub(super) fn reaches_outside(&self, pod: &Netns, v6: bool) -> bool {
        let addr = if v6 {
            sock(OUTSIDE6, TCP_PORT)
        } else {
            sock(OUTSIDE, TCP_PORT)
        };
        tcp_ask(Some(&pod.path), &addr).is_some_and(|a| a.starts_with("outside"))
    }

    /// Asserts the pod reaches the outside in both families.
    pub(super) fn assert_passes(&self, pod: &Netns) {
        assert!(
            self.reaches_outside(pod, false),
            "IPv4 pod traffic is still dropped"
        );
        assert!(
            self.reaches_outside(pod, true),
            "IPv6 pod traffic is still dropped"
        );
    }

    /// Asserts the node's drop policy stops the pod's IPv4 traffic (`when`: at what point).
    pub(super) fn assert_dropped(&self, pod: &Netns, when: &str) {
        assert!(
            !self.reaches_outside(pod, false),
            "{when}: the pod's traffic passes the drop policy"
        );
    }

    /// The firewall plugin (ours, or the reference's) for the pod `id` in
    /// `pod` of network `net`, with no options, chained after `prev`.
    pub(super) fn firewall(
        &self,
        reference: bool,
        verb: &str,
        net: &str,
        id: &str,
        pod: &Netns,
        prev: &Value,
    ) -> Outcome {
        let conf = fw_conf(net, json!({}), prev);
        self.call(reference, "firewall", verb, id, pod, &conf)
    }

    /// The firewall plugin's GC with `conf`, run in the node; it must pass silently.
    pub(super) fn gc(&self, conf: &Value) {
        self.env
            .plugin("firewall")
            .command("GC")
            .conf(conf)
            .exec_in(&self.node)
            .run()
            .ok_silent();
    }

    pub(super) fn iptables(&self, args: &[&str]) -> String {
        must(&self.node, "iptables-nft", args)
    }

    /// `nft list table inet cnikit` in the node: cnikit's own table.
    pub(super) fn own_table(&self) -> String {
        must(&self.node, "nft", &["list", "table", "inet", "cnikit"])
    }
}

/// The firewall plugin's config for network `net`, chained after `prev`.
pub(super) fn fw_conf(net: &str, extra: Value, prev: &Value) -> Value {
    merged(
        json!({"cniVersion": "1.0.0", "name": net, "type": "firewall", "prevResult": prev}),
        extra,
    )
}

/// `iptables -S` (and `ip6tables -S`) in the node: it must work — exit 0,
/// no "incompatible" table — and it returns the listing.
pub(super) fn listing(w: &World, cmd: &str) -> String {
    let (ok, out, err) = in_ns(&w.node, cmd, &["-S"]);
    assert!(
        ok && !out.contains("incompatible") && !err.contains("incompatible"),
        "{cmd} -S: {out}{err}"
    );
    out
}
