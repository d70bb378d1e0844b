//! Spec section 3, "Deriving execution configuration from plugin
//! configuration": what one plugin receives on stdin.

use serde_json::{Map, Value};

/// What the runtime injects beside the plugin's own configuration.
#[derive(Debug, Default, Clone, Copy)]
pub struct Inject<'a> {
    pub name: &'a str,
    pub version: &'a str,
    /// The capability arguments of the attachment; `None` for STATUS/GC,
    /// which are not per attachment.
    pub cap_args: Option<&'a Map<String, Value>>,
    pub prev_result: Option<&'a Value>,
    /// GC's attachments still in use (`cni.dev/valid-attachments`).
    pub valid_attachments: Option<&'a Value>,
}

/// The request configuration for one plugin: `cniVersion` and `name` from the
/// list, `runtimeConfig` = the capabilities the plugin declares ∩ the
/// capability arguments given (only when not empty, as libcni), `prevResult`,
/// `capabilities` removed; every other key passed through unchanged.
pub fn request_config(plugin: &Map<String, Value>, inject: &Inject) -> Map<String, Value> {
    let mut out = Map::with_capacity(plugin.len() + 3);
    out.insert(
        "cniVersion".into(),
        Value::String(inject.version.to_string()),
    );
    out.insert("name".into(), Value::String(inject.name.to_string()));
    for (k, v) in plugin {
        if !matches!(k.as_str(), "cniVersion" | "name" | "capabilities") {
            out.insert(k.clone(), v.clone());
        }
    }
    if let Some(rc) = runtime_config(plugin, inject.cap_args) {
        out.insert("runtimeConfig".into(), Value::Object(rc));
    }
    if let Some(prev) = inject.prev_result {
        out.insert("prevResult".into(), prev.clone());
    }
    if let Some(valid) = inject.valid_attachments {
        out.insert("cni.dev/valid-attachments".into(), valid.clone());
        // libcni sends the list under the pre-release key too; plugins written
        // against it read only that one.
        out.insert("cni.dev/attachments".into(), valid.clone());
    }
    out
}

/// `capabilities` entries set to `true` that the runtime has an argument for.
fn runtime_config(
    plugin: &Map<String, Value>,
    cap_args: Option<&Map<String, Value>>,
) -> Option<Map<String, Value>> {
    let args = cap_args?;
    let caps = plugin.get("capabilities")?.as_object()?;
    let rc: Map<String, Value> = caps
        .iter()
        .filter(|(_, on)| on.as_bool() == Some(true))
        .filter_map(|(cap, _)| args.get(cap).map(|v| (cap.clone(), v.clone())))
        .collect();
    (!rc.is_empty()).then_some(rc)
}
