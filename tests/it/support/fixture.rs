//! [`TestEnv`]: one test's world — a CNI bin dir with our links, a temp dir
//! for IPAM state, and the namespaces, links and daemons it made, all removed
//! on drop.

use super::call::Call;
use super::ipamd::{list_leases, Daemon};
use super::isolation::{host_uplink, require_isolation};
use super::kernel::{ip, sh};
use super::names::{ifname_with, next_id, short_hash, Subnets};
use super::process::{install_links, Netns};
use serde_json::{json, Value};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Where Debian's containernetworking-plugins put the reference plugins.
pub const REF_DIR: &str = "/usr/lib/cni";

/// Every spec version, in order; VERSION must answer with exactly these.
pub const ALL_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The names `cnikit install` links: the library's list of plugins.
pub use cnikit::plugins::NAMES as PLUGINS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipam {
    /// host-local as CNI_PATH finds it: cnikit's for our plugins (the test bin
    /// dir comes first), the reference's for the reference plugins.
    HostLocal,
    /// Our ipamd (no daemon socket → in-process store).
    Ipamd,
    /// Our ipamd with `cnikit ipamd daemon` serving the store (started by
    /// `TestEnv::ipam`, stopped on drop).
    IpamdDaemon,
}

impl Ipam {
    pub const BOTH: [Ipam; 2] = [Ipam::HostLocal, Ipam::Ipamd];

    /// Ipamd, served by its daemon or not.
    pub fn ipamd(daemon: bool) -> Ipam {
        if daemon {
            Ipam::IpamdDaemon
        } else {
            Ipam::Ipamd
        }
    }

    pub fn type_name(self) -> &'static str {
        match self {
            Ipam::HostLocal => "host-local",
            Ipam::Ipamd | Ipam::IpamdDaemon => "ipamd",
        }
    }
}

/// cnikit keeps a network namespace's firewall records by the namespace's inode
/// (`/run/cnikit/firewall/netns-<inode>`), and the kernel gives a deleted namespace's
/// inode to a later one: a new test namespace must not start with the records of another
/// test's deleted one (a repair there would replay them).
fn forget_firewall_records_of(netns: &str) {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(netns).expect("the new netns").ino();
    let _ = std::fs::remove_dir_all(format!("/run/cnikit/firewall/netns-{ino}"));
}

/// cnikit's firewall lock (`/run/cnikit/nftables.lock`) is one file for the whole test
/// host. A test that holds it on purpose (`firewall_lock`) runs alone with the tests that
/// need it promptly (the repairs, which never go ahead without it); those share it.
static FIREWALL_LOCK_USERS: RwLock<()> = RwLock::new(());

/// For a test that needs cnikit's firewall lock promptly: none holds it on purpose meanwhile.
pub fn firewall_lock_wanted() -> RwLockReadGuard<'static, ()> {
    FIREWALL_LOCK_USERS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// For a test that holds cnikit's firewall lock on purpose: no test that needs it runs.
pub fn firewall_lock_held_on_purpose() -> RwLockWriteGuard<'static, ()> {
    FIREWALL_LOCK_USERS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Lock a resource list, surviving a poisoned lock (a panicking test thread).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One test's world: a CNI bin dir with our links, a temp dir for IPAM state,
/// and the namespaces/links/daemons it made (removed on drop). `Sync`: a test
/// may share it with threads (concurrent ADDs).
pub struct TestEnv {
    pub tmp: PathBuf,
    /// `cnikit install --dir` output: bridge, macvlan, ipvlan, portmap, ipamd links.
    pub bin: PathBuf,
    /// The reference plugins.
    pub ref_bin: PathBuf,
    netns: Mutex<Vec<String>>,
    links: Mutex<Vec<String>>,
    daemons: Mutex<Vec<Daemon>>,
}

impl TestEnv {
    /// Check isolation, make the temp dir and install our links into it.
    pub fn new(test: &str) -> TestEnv {
        require_isolation();
        host_uplink();
        let tmp = std::env::temp_dir().join(format!(
            "cnikit-it-{}-{}-{}",
            std::process::id(),
            next_id(),
            test.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("create test temp dir");
        let env = TestEnv {
            bin: tmp.join("bin"),
            ref_bin: PathBuf::from(REF_DIR),
            tmp,
            netns: Mutex::new(Vec::new()),
            links: Mutex::new(Vec::new()),
            daemons: Mutex::new(Vec::new()),
        };
        install_links(&env.bin);
        assert!(
            Path::new(REF_DIR).join("host-local").is_file(),
            "the reference plugins are missing: apt install containernetworking-plugins"
        );
        env
    }

    /// A new test world with one network namespace in it.
    pub fn with_netns(test: &str) -> (TestEnv, Netns) {
        let env = TestEnv::new(test);
        let ns = env.netns();
        (env, ns)
    }

    /// A fresh directory under the test's temp dir.
    pub fn dir(&self, what: &str) -> PathBuf {
        let d = self.tmp.join(format!("{what}-{}", next_id()));
        std::fs::create_dir_all(&d).expect("create dir");
        d
    }

    /// A unique /24 + /64 pair.
    pub fn subnets(&self) -> Subnets {
        Subnets::next()
    }

    /// Create a network namespace, removed on drop.
    pub fn netns(&self) -> Netns {
        let name = format!("cnk-{}", short_hash());
        ip(&["netns", "add", &name]);
        forget_firewall_records_of(&format!("/run/netns/{name}"));
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        lock(&self.netns).push(name.clone());
        Netns {
            path: format!("/run/netns/{name}"),
            name,
        }
    }

    /// Delete a namespace now (to test DEL after the container is gone).
    pub fn del_netns(&self, ns: &Netns) {
        ip(&["netns", "del", &ns.name]);
        lock(&self.netns).retain(|n| n != &ns.name);
    }

    /// Reserve a unique host link name (a bridge the plugin will create, …);
    /// whatever carries it is deleted on drop.
    pub fn link_name(&self, prefix: &str) -> String {
        let name = ifname_with(prefix);
        lock(&self.links).push(name.clone());
        name
    }

    /// A veth pair in the test host namespace, both ends up.
    pub fn veth_pair(&self) -> (String, String) {
        let a = self.link_name("tva");
        let b = self.link_name("tvb");
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        ip(&["link", "set", &a, "up"]);
        ip(&["link", "set", &b, "up"]);
        (a, b)
    }

    /// A netns whose `eth0` is not ours: one end of a veth pair moved into it.
    pub fn netns_with_foreign_eth0(&self) -> Netns {
        let ns = self.netns();
        let (_host_end, peer) = self.veth_pair();
        ip(&["link", "set", &peer, "netns", &ns.name]);
        ip(&["-n", &ns.name, "link", "set", &peer, "name", "eth0"]);
        ns
    }

    /// An `ipam` object of the given kind with per-test state (dataDir, socket).
    pub fn ipam(&self, kind: Ipam, ranges: Value) -> Value {
        let data = self.dir(kind.type_name());
        match kind {
            Ipam::IpamdDaemon => {
                let socket = data.join("ipamd.sock");
                let log = data.with_extension("daemon.log");
                let mut daemon = Daemon::spawn_logging_to(&socket, &data, &[], &[], log);
                daemon.wait_ready();
                lock(&self.daemons).push(daemon);
                json!({"type": "ipamd", "dataDir": data, "socket": socket, "ranges": ranges})
            }
            Ipam::HostLocal => json!({
                "type": "host-local",
                "dataDir": data,
                "ranges": ranges,
            }),
            Ipam::Ipamd => json!({
                "type": "ipamd",
                "dataDir": data,
                // Nothing listens here: the plugin uses the store in-process.
                "socket": data.join("no-daemon.sock"),
                "ranges": ranges,
            }),
        }
    }

    /// The test bin dir holding our links.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// A call of our plugin `name` through its link in the test bin dir, with
    /// CNI_PATH = our dir, then the reference dir.
    pub fn plugin(&self, name: &str) -> Call {
        let path = std::env::join_paths([&self.bin, &self.ref_bin])
            .expect("join CNI_PATH")
            .to_string_lossy()
            .into_owned();
        Call::new(self.bin.join(name)).env("CNI_PATH", &path)
    }

    /// A call of the reference plugin `name`, CNI_PATH = the reference dir only.
    pub fn ref_plugin(&self, name: &str) -> Call {
        Call::new(self.ref_bin.join(name))
            .env("CNI_PATH", REF_DIR)
            .reference()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        lock(&self.daemons).clear();
        for ns in lock(&self.netns).iter() {
            let _ = sh("ip", &["netns", "del", ns]);
        }
        for l in lock(&self.links).iter() {
            let _ = sh("ip", &["link", "del", l]);
        }
        if !std::thread::panicking() || std::env::var_os("CNIKIT_KEEP_TMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// A plugin `dir/name` that fails ADD with an error object (code 11, "NAME
/// refuses") and appends every call's CNI_COMMAND to `log`.
pub fn failing_plugin(dir: &Path, name: &str, log: &Path) {
    let script = format!(
        "#!/bin/sh\ncat > /dev/null\necho \"$CNI_COMMAND\" >> '{}'\n\
         if [ \"$CNI_COMMAND\" = ADD ]; then\n\
         echo '{{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"{name} refuses\",\"details\":\"on purpose\"}}'\n\
         exit 1\nfi\nexit 0\n",
        log.display()
    );
    let path = dir.join(name);
    std::fs::write(&path, script).expect("write plugin");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

impl TestEnv {
    /// Number of leases the IPAM state of `ipam` holds for network `network`.
    pub fn lease_count(&self, ipam: &Value, network: &str) -> usize {
        let data = PathBuf::from(ipam["dataDir"].as_str().expect("ipam.dataDir"));
        match ipam["type"].as_str() {
            // host-local: one file per address, named after it, plus `lock`
            // and `last_reserved_ip.N`.
            Some("host-local") => match std::fs::read_dir(data.join(network)) {
                Err(_) => 0,
                Ok(rd) => rd
                    .filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_str()
                            .is_some_and(|n| n.parse::<IpAddr>().is_ok())
                    })
                    .count(),
            },
            Some("ipamd") => {
                let socket = Path::new(ipam["socket"].as_str().expect("ipam.socket"));
                list_leases(&data, socket, network).len()
            }
            other => panic!("lease_count: unknown ipam type {other:?}"),
        }
    }
}
