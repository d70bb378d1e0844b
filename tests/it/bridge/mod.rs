//! bridge plugin, end to end on the kernel: the version matrix with real
//! traffic (IPv4 and IPv6) for both IPAMs, DEL robustness, rollback of failed
//! ADDs, port flags / MTU / MAC, IPv6 only where a pod has it (no multicast from
//! the rest), and a differential run against the reference /usr/lib/cni/bridge.

mod del;
mod differential;
pub(crate) mod ipv6;
mod matrix;
mod options;

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const NET: &str = "itnet";

/// A gateway bridge config: isGateway + isDefaultGateway on `bridge`.
fn conf(version: &str, bridge: &str, ipam: Value) -> Value {
    json!({
        "cniVersion": version,
        "name": NET,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "isDefaultGateway": true,
        "ipam": ipam,
    })
}

/// A 1.0.0 gateway bridge config on a new bridge over IPAM of `kind` with
/// the ranges `ranges` picks from new subnets: the config, the bridge, the subnets.
fn network(env: &TestEnv, kind: Ipam, ranges: fn(&Subnets) -> Value) -> (Value, String, Subnets) {
    let nets = env.subnets();
    let br = env.link_name("cbr");
    let c = conf("1.0.0", &br, env.ipam(kind, ranges(&nets)));
    (c, br, nets)
}

/// An attachment `ctr-TAG-…` on a new bridge over a v4 ipamd range, the
/// config having the `extra` keys: the attachment, the bridge, the subnets.
fn v4_attachment<'e>(
    env: &'e TestEnv,
    tag: &str,
    extra: Value,
) -> (Attachment<'e>, String, Subnets) {
    let (c, br, nets) = network(env, Ipam::Ipamd, Subnets::v4_ranges);
    let att = env.new_attachment("bridge", tag, &merged(c, extra));
    (att, br, nets)
}

/// ADD one container (dual-stack IPAM of `kind` on a new bridge): the
/// attachment, its result and the bridge.
fn add_one(env: &TestEnv, kind: Ipam) -> (Attachment<'_>, Value, String) {
    let (c, br, _) = network(env, kind, Subnets::dual_ranges);
    let att = env.new_attachment("bridge", "del", &c);
    let r = att.add();
    assert_eq!(env.lease_count(&c["ipam"], NET), 2);
    (att, r, br)
}

/// The IPAM object of an attachment's config.
fn ipam_of<'a>(att: &'a Attachment) -> &'a Value {
    &att.conf["ipam"]
}

/// The host end of the veth (`interfaces[1]` of a result).
fn host_veth(r: &Value) -> &str {
    r["interfaces"][1]["name"].as_str().expect("host veth")
}
