//! The differential tests' shared steps (bridge, ptp): the same calls to cnikit's plugin
//! or the reference's, and their results compared by shape.

use super::call::Call;
use super::fixture::TestEnv;
use super::json::keys;
use serde_json::{json, Value};

/// `name` of the reference plugins (`reference`) or of cnikit.
pub fn plugin_or_reference(env: &TestEnv, name: &str, reference: bool) -> Call {
    if reference {
        env.ref_plugin(name)
    } else {
        env.plugin(name)
    }
}

/// A result with MACs and the random host veth name (`interfaces[host_veth]`) blanked out.
pub fn result_shape(r: &Value, host_veth: usize) -> Value {
    let mut r = r.clone();
    if let Some(ifs) = r["interfaces"].as_array_mut() {
        for i in ifs.iter_mut() {
            if i.get("mac").is_some() {
                i["mac"] = json!("<mac>");
            }
        }
        ifs[host_veth]["name"] = json!("<veth>");
    }
    r
}

/// `ours` and `theirs` (the reference's result) have the same top-level keys, the same
/// fields in each interface, and, MACs and the host veth's name aside, the same content.
pub fn assert_same_result_shape(ours: &Value, theirs: &Value, host_veth: usize) {
    assert_eq!(
        keys(ours),
        keys(theirs),
        "top-level keys\nref:  {theirs}\nours: {ours}"
    );
    for (i, (a, b)) in theirs["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .zip(ours["interfaces"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(
            keys(a),
            keys(b),
            "interfaces[{i}] fields\nref:  {theirs}\nours: {ours}"
        );
    }
    assert_eq!(
        result_shape(ours, host_veth),
        result_shape(theirs, host_veth),
        "result shape\nref:  {theirs}\nours: {ours}"
    );
}
