//! One attachment as a runtime sees it: a plugin and its configuration, a
//! container ID, a netns and an interface name. Its calls carry the CNI_*
//! variables a runtime sets; the usual steps (ADD, CHECK, DEL) assert
//! success as they go, `call` gives the bare [`Call`] for anything else.

use super::call::{Call, Outcome};
use super::fixture::TestEnv;
use super::json::with_prev;
use super::kernel::wait_ipv6_ready;
use super::names::cid;
use super::process::Netns;
use serde_json::Value;

#[derive(Clone)]
pub struct Attachment<'e> {
    env: &'e TestEnv,
    pub plugin: String,
    pub id: String,
    pub ns: Netns,
    pub ifname: String,
    pub conf: Value,
}

/// An attachment that was ADDed, with its result; it derefs to the attachment.
pub struct Pod<'e> {
    pub att: Attachment<'e>,
    pub result: Value,
}

impl<'e> std::ops::Deref for Pod<'e> {
    type Target = Attachment<'e>;

    fn deref(&self) -> &Attachment<'e> {
        &self.att
    }
}

impl TestEnv {
    /// Container `id` in `ns` as `eth0`, attached by `plugin` with `conf`.
    pub fn attachment(&self, plugin: &str, id: &str, ns: &Netns, conf: &Value) -> Attachment<'_> {
        Attachment {
            env: self,
            plugin: plugin.to_string(),
            id: id.to_string(),
            ns: ns.clone(),
            ifname: "eth0".to_string(),
            conf: conf.clone(),
        }
    }

    /// An attachment in a new netns, container ID `ctr-TAG-…`.
    pub fn new_attachment(&self, plugin: &str, tag: &str, conf: &Value) -> Attachment<'_> {
        self.attachment(plugin, &cid(tag), &self.netns(), conf)
    }

    /// Two attachments with the same config, each in a netns of its own.
    pub fn pair(&self, plugin: &str, conf: &Value) -> [Attachment<'_>; 2] {
        [
            self.new_attachment(plugin, "a", conf),
            self.new_attachment(plugin, "b", conf),
        ]
    }

    /// A new attachment, ADDed, with its IPv6 addresses past DAD.
    pub fn pod(&self, plugin: &str, conf: &Value) -> Pod<'_> {
        let att = self.new_attachment(plugin, "p", conf);
        let result = att.add();
        wait_ipv6_ready(Some(&att.ns.name));
        Pod { att, result }
    }
}

impl<'e> Attachment<'e> {
    /// The same attachment under another interface name.
    pub fn with_ifname(mut self, ifname: &str) -> Self {
        self.ifname = ifname.to_string();
        self
    }

    /// The same container and interface, for another plugin of the chain.
    pub fn chained(&self, plugin: &str, conf: &Value) -> Attachment<'e> {
        Attachment {
            plugin: plugin.to_string(),
            conf: conf.clone(),
            ..self.clone()
        }
    }

    /// The call of `verb` with the runtime's environment and the config.
    pub fn call(&self, verb: &str) -> Call {
        self.env
            .plugin(&self.plugin)
            .attach(verb, &self.id, &self.ns, &self.ifname)
            .conf(&self.conf)
    }

    pub fn try_add(&self) -> Outcome {
        self.call("ADD").run()
    }

    /// ADD, which must succeed; the result.
    pub fn add(&self) -> Value {
        self.try_add().result()
    }

    /// CHECK against `prev` (the ADD's result), which must pass silently.
    pub fn check(&self, prev: &Value) {
        self.call("CHECK")
            .conf(&with_prev(&self.conf, prev))
            .run()
            .ok_silent();
    }

    /// DEL, which must succeed silently.
    pub fn del(&self) {
        self.call("DEL").run().ok_silent();
    }

    /// DEL, and DEL again (runtimes repeat it).
    pub fn del_twice(&self) {
        self.del();
        self.del();
    }

    /// DEL with an empty CNI_NETNS (the spec makes it optional for DEL).
    pub fn del_with_empty_netns(&self) {
        self.call("DEL").netns_path("").run().ok_silent();
    }

    /// DEL with no CNI_NETNS at all, as a runtime sends it once the pod is gone.
    pub fn del_without_netns(&self) {
        self.call("DEL").unset("CNI_NETNS").run().ok_silent();
    }
}
