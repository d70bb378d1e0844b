//! Reading results and building configurations.

use serde_json::Value;

/// `result.ips[].address` strings.
pub fn result_addresses(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|ip| ip["address"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The bare address (no prefix) of the first result IP of a family.
pub fn first_addr(result: &Value, v6: bool) -> String {
    result_addresses(result)
        .into_iter()
        .find(|a| a.contains(':') == v6)
        .map(|a| bare(&a).to_string())
        .unwrap_or_else(|| {
            panic!(
                "result has no {} address: {result}",
                if v6 { "IPv6" } else { "IPv4" }
            )
        })
}

/// "10.0.0.2/24" → "10.0.0.2".
pub fn bare(cidr: &str) -> &str {
    cidr.split('/').next().unwrap_or_default()
}

/// The config with `prevResult` set, for CHECK / chained calls.
pub fn with_prev(conf: &Value, prev: &Value) -> Value {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c
}

/// `conf` with every key of the object `extra` set (replacing what was there).
pub fn merged(mut conf: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().expect("object") {
        conf[k] = v.clone();
    }
    conf
}

/// Sorted keys of a JSON object.
pub fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}
