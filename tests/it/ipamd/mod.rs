//! The `ipamd` IPAM plugin end to end: the real binary run exactly as a
//! runtime runs an IPAM plugin (CNI_* environment, config on stdin), with the
//! lease daemon `cnikit ipamd daemon` as a child process or with no daemon at
//! all (the plugin then works on the store in-process).
//!
//! The plugin alone never enters a netns, so CNI_NETNS is just a path string
//! here. Every test has its own dataDir and socket under the test's temp dir;
//! most semantic tests run twice, `<test>::daemon` and `<test>::in_process`.

mod allocation;
mod concurrency;
mod config;
mod daemon;
mod index;
mod integrity;
mod plugin_calls;

use crate::support::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The network name of every test configuration.
const NET: &str = "ipamd-it";
/// CNI_NETNS of IPAM-only calls: the ipamd plugin never opens it.
const NO_NETNS: &str = "/var/run/netns/ipam-only";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A daemon serves the socket.
    Daemon,
    /// Nothing listens: every call works on the store in-process.
    InProcess,
}

/// One test's ipamd world: the plugin bin dir, a dataDir, a socket path,
/// (in `Mode::Daemon`) the daemon, and a /24 + /64 of its own.
struct Fix {
    env: TestEnv,
    data: PathBuf,
    sock: PathBuf,
    daemon: Option<Daemon>,
    nets: Subnets,
}

impl Fix {
    fn new(test: &str, mode: Mode) -> Fix {
        let env = TestEnv::new(test);
        let dir = env.dir("ipamd");
        let nets = env.subnets();
        let mut f = Fix {
            env,
            data: dir.join("data"),
            sock: dir.join("d.sock"),
            daemon: None,
            nets,
        };
        if mode == Mode::Daemon {
            f.start_daemon(&[], &[]);
        }
        f
    }

    fn start_daemon(&mut self, extra: &[&str], env: &[(&str, &Path)]) {
        self.daemon = Some(Daemon::start(&self.sock, &self.data, extra, env));
    }

    fn stop_daemon(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
    }

    fn ipam(&self, ranges: Value) -> Value {
        json!({
            "type": "ipamd",
            "dataDir": self.data,
            "socket": self.sock,
            "ranges": ranges,
        })
    }

    fn conf(&self, version: &str, ipam: Value) -> Value {
        json!({
            "cniVersion": version,
            "name": NET,
            "type": "ipamd",
            "ipam": ipam,
        })
    }

    /// A 1.0.0 config over one v4 subnet.
    fn conf_v4(&self, subnet: &str) -> Value {
        self.conf("1.0.0", self.ipam(json!([[{ "subnet": subnet }]])))
    }

    /// A 1.0.0 config over the fixture's own /24.
    fn conf_24(&self) -> Value {
        self.conf_v4(&self.nets.v4)
    }

    /// A 1.0.0 config over the first 8 addresses of the fixture's /24
    /// (.2–.6 allocatable), and that subnet.
    fn conf_29(&self) -> (Value, String) {
        let subnet = self.nets.v4.replace("/24", "/29");
        (self.conf_v4(&subnet), subnet)
    }

    fn call(&self, cmd: &str, cid: &str, ifname: &str, conf: &Value) -> Call {
        self.env
            .plugin("ipamd")
            .attach_at(cmd, cid, NO_NETNS)
            .ifname(ifname)
            .conf(conf)
    }

    fn add(&self, cid: &str, conf: &Value) -> Outcome {
        self.call("ADD", cid, "eth0", conf).run()
    }

    fn del(&self, cid: &str, conf: &Value) -> Outcome {
        self.call("DEL", cid, "eth0", conf).run()
    }

    /// STATUS / GC: no container, no interface, no netns.
    fn net_call(&self, cmd: &str, conf: &Value) -> Outcome {
        self.env.plugin("ipamd").command(cmd).conf(conf).run()
    }

    /// Leases of network NET, from the daemon if one runs, else from the files.
    fn leases(&self) -> Vec<Lease> {
        list_leases(&self.data, &self.sock, NET)
    }
}

/// The bare address of the single IP of an ADD result.
fn only_addr(r: &Value) -> IpAddr {
    let a = result_addresses(r);
    assert_eq!(a.len(), 1, "expected one address: {r}");
    addr(&a[0])
}

/// An address, with or without prefix, parsed.
fn addr(cidr: &str) -> IpAddr {
    bare(cidr)
        .parse()
        .unwrap_or_else(|_| panic!("{cidr:?} is not an address"))
}

/// Run the same test in both modes: `name::daemon` and `name::in_process`.
macro_rules! both_modes {
    ($name:ident) => {
        mod $name {
            #[test]
            fn daemon() {
                super::$name(super::Mode::Daemon, concat!(stringify!($name), "_d"));
            }
            #[test]
            fn in_process() {
                super::$name(super::Mode::InProcess, concat!(stringify!($name), "_p"));
            }
        }
    };
}
use both_modes;
