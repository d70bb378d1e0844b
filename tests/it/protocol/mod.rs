//! The CNI protocol edge: environment validation, stdin decoding, version
//! rules, field validation, CNI_ARGS — and fuzz-like runs proving that no
//! input makes a plugin panic, die by a signal, or fail without a proper
//! error object.

mod env;
mod fuzz;
mod input;

use crate::support::*;
use serde_json::{json, Value};

/// A valid bridge config (L2 only, no IPAM) on a bridge the test owns.
fn bridge_conf(env: &TestEnv, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "proto",
        "type": "bridge",
        "bridge": env.link_name("pbr"),
    })
}

/// A call of `plugin` with the full valid environment for `verb` (no config yet).
fn full_env(env: &TestEnv, plugin: &str, verb: &str, ns: &Netns) -> Call {
    env.plugin(plugin).attach(verb, "ctr-proto", ns, "eth0")
}
