//! What is compared: the same network configuration list run by the same
//! runtime code (src/runtime, as `cnikit net` runs it) over two plugin sets,
//! and the kernel floor that does the attach work in-process.

use crate::daemon;
use crate::sandbox::STATE;
use cnikit::netlink::{BridgePort, BridgeSpec, NetNs, Netlink, Route, VethSpec};
use cnikit::runtime::{Attachment, ConfList, Runtime};
use ipnet::IpNet;
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Impl {
    /// Debian's containernetworking-plugins: bridge + host-local + portmap.
    Reference,
    /// cnikit through its symlinks: bridge + ipamd + portmap.
    Cnikit,
    /// The same with `cnikit ipamd daemon` running: it serves the leases and
    /// applies the firewall changes (its netfilter socket never closes).
    CnikitDaemon,
    /// The kernel work of a bridge attach in one process: no exec, no IPAM.
    Floor,
    /// The newest upstream reference plugins (`--upstream-dir`) with their
    /// nftables backends: what a user would pick today instead of Debian's.
    Upstream,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// bridge (isGateway, ipMasq, hairpinMode) + IPAM + portmap, one host port per pod.
    Full,
    /// bridge (isGateway, hairpinMode) + IPAM: no NAT at all.
    Bare,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Reference => "reference",
            Impl::Cnikit => "cnikit",
            Impl::CnikitDaemon => "cnikit-daemon",
            Impl::Floor => "floor",
            Impl::Upstream => "upstream",
        }
    }

    /// For bridge names (at most 15 bytes with the rest).
    pub fn short(self) -> &'static str {
        match self {
            Impl::Reference => "ref",
            Impl::Cnikit => "cni",
            Impl::CnikitDaemon => "cnd",
            Impl::Floor => "flo",
            Impl::Upstream => "up",
        }
    }
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Full => "full",
            Variant::Bare => "bare",
        }
    }
}

/// One (variant, implementation) ready to run pods.
pub enum Setup {
    Chain(Box<Chain>),
    Floor(Floor),
}

pub struct Chain {
    runtime: Runtime,
    list: ConfList,
    with_ports: bool,
}

pub struct Floor {
    bridge_index: u32,
    gateway: Ipv4Addr,
}

/// Where to find the plugins of each set.
pub struct Plugins {
    pub cnikit_bin: PathBuf,
    pub reference_dir: PathBuf,
    pub upstream_dir: PathBuf,
    /// More flags of the cnikit-daemon set's daemon (`--daemon-arg`).
    pub daemon_args: Vec<String>,
}

impl Setup {
    pub fn new(variant: Variant, imp: Impl, plugins: &Plugins) -> Result<Setup, String> {
        match imp {
            Impl::Floor => Floor::new().map(Setup::Floor),
            Impl::CnikitDaemon => {
                daemon::start(&plugins.cnikit_bin, None, &plugins.daemon_args)?;
                Chain::new(variant, imp, plugins).map(|c| Setup::Chain(Box::new(c)))
            }
            Impl::Cnikit | Impl::Reference | Impl::Upstream => {
                Chain::new(variant, imp, plugins).map(|c| Setup::Chain(Box::new(c)))
            }
        }
    }

    /// ADD `pod` (its netns at `netns`).
    pub fn add(&self, pod: Pod, netns: &str) -> Result<(), String> {
        match self {
            Setup::Chain(c) => c.add(&c.attachment_of(pod, netns)),
            Setup::Floor(f) => f.add(&floor_link(pod), floor_address(pod)?, netns),
        }
    }

    pub fn del(&self, pod: Pod, netns: &str) -> Result<(), String> {
        match self {
            Setup::Chain(c) => c.del(&c.attachment_of(pod, netns)),
            Setup::Floor(f) => f.del(netns),
        }
    }
}

/// A pod of the benchmark: churned ones come and go, residents stay.
#[derive(Debug, Clone, Copy)]
pub enum Pod {
    Churn(u64),
    /// `i` < [`MAX_RESIDENTS`].
    Resident(u32),
}

/// Host ports of churned pods: `CHURN_PORTS.0 + n % CHURN_PORTS.1`.
const CHURN_PORTS: (u64, u64) = (10000, 50000);
/// Resident pod i maps `RESIDENT_PORT + 2i` and `RESIDENT_PORT + 2i + 1`:
/// above every churn port, so a resident's mapping never collides with a
/// churned pod's.
pub const RESIDENT_PORT: u32 = 60000;
/// As many residents as that port block holds.
pub const MAX_RESIDENTS: u32 = (65536 - RESIDENT_PORT) / 2;
const _: () = assert!(CHURN_PORTS.0 + CHURN_PORTS.1 <= RESIDENT_PORT as u64);
/// Ports one Linux bridge can take (BR_MAX_PORTS − 1: port 0 is reserved).
pub const BRIDGE_MAX_PORTS: usize = 1023;

// ------------------------------------------------------------ chains

/// The prefix of every setup's range: it holds more pods than a bridge can
/// take, so residents plus the churn's pods in flight always fit.
const PREFIX: u8 = 16;
const _: () = assert!((1usize << (32 - PREFIX)) - 3 >= BRIDGE_MAX_PORTS);

/// A distinct /16 per setup, so nothing is shared between the compared sets.
fn subnet(variant: Variant, imp: Impl) -> u8 {
    match (variant, imp) {
        (Variant::Full, Impl::Reference) => 80,
        (Variant::Full, Impl::CnikitDaemon) => 84,
        (Variant::Full, Impl::Upstream) => 86,
        (Variant::Full, _) => 81,
        (Variant::Bare, Impl::Reference) => 82,
        (Variant::Bare, Impl::CnikitDaemon) => 85,
        (Variant::Bare, Impl::Upstream) => 87,
        (Variant::Bare, _) => 83,
    }
}

/// The list both plugin sets run; only the IPAM type (and its state dir)
/// differs, exactly as a user migrating from host-local would change it.
pub fn conflist(variant: Variant, imp: Impl) -> Value {
    let tag = format!("{}-{}", imp.short(), variant.name());
    let net = subnet(variant, imp);
    let ipam = match imp {
        Impl::Reference | Impl::Upstream => {
            json!({"type": "host-local", "dataDir": format!("{STATE}/host-local"),
            "ranges": [[{"subnet": format!("10.{net}.0.0/{PREFIX}")}]]})
        }
        Impl::CnikitDaemon => json!({"type": "ipamd", "dataDir": daemon::DATA_DIR,
            "socket": daemon::SOCKET,
            "ranges": [[{"subnet": format!("10.{net}.0.0/{PREFIX}")}]]}),
        _ => json!({"type": "ipamd", "dataDir": format!("{STATE}/ipamd"),
            // Nothing listens there: the embedded store, no daemon.
            "socket": format!("{STATE}/ipamd.sock"),
            "ranges": [[{"subnet": format!("10.{net}.0.0/{PREFIX}")}]]}),
    };
    let full = variant == Variant::Full;
    let mut plugins = vec![json!({
        "type": "bridge", "bridge": format!("br-{tag}"), "isGateway": true,
        "ipMasq": full, "hairpinMode": true, "ipam": ipam,
    })];
    if full {
        plugins.push(json!({"type": "portmap", "capabilities": {"portMappings": true}}));
    }
    if imp == Impl::Upstream {
        // Their nftables backends are opt-in; iptables is what 1.1.1 measures.
        plugins[0]["ipMasqBackend"] = json!("nftables");
        if let Some(portmap) = plugins.get_mut(1) {
            portmap["backend"] = json!("nftables");
        }
    }
    if imp == Impl::Cnikit {
        // The firewall work in-process too: not the daemon that cnikit-daemon
        // runs on the default socket.
        for p in &mut plugins {
            p["daemonSocket"] = json!(format!("{STATE}/no-daemon.sock"));
        }
    }
    json!({"cniVersion": "1.0.0", "name": format!("bench-{tag}"), "plugins": plugins})
}

impl Chain {
    fn new(variant: Variant, imp: Impl, plugins: &Plugins) -> Result<Chain, String> {
        let bin_dir = match imp {
            Impl::Reference => plugins.reference_dir.clone(),
            Impl::Upstream => plugins.upstream_dir.clone(),
            _ => link_cnikit(&plugins.cnikit_bin)?,
        };
        let bytes = serde_json::to_vec(&conflist(variant, imp)).map_err(|e| e.to_string())?;
        let list = ConfList::from_list_bytes(&bytes, Path::new("(benchmark)"))
            .map_err(|e| e.to_string())?;
        let cache = PathBuf::from(STATE).join(format!("cache-{}", imp.name()));
        let mut runtime = Runtime::new(vec![bin_dir], cache);
        runtime.forward_stderr = false;
        Ok(Chain {
            runtime,
            list,
            with_ports: variant == Variant::Full,
        })
    }

    fn attachment_of(&self, pod: Pod, netns: &str) -> Attachment {
        match pod {
            Pod::Churn(n) => self.churn_pod(n, netns),
            Pod::Resident(i) => self.resident(i, netns),
        }
    }

    /// A churned pod: one unique host port, as a pod with one hostPort has.
    fn churn_pod(&self, n: u64, netns: &str) -> Attachment {
        let port = CHURN_PORTS.0 + n % CHURN_PORTS.1;
        let ports = json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]);
        self.attachment(format!("bench-{n}"), netns, ports)
    }

    /// A resident pod: two host ports from its own block.
    fn resident(&self, i: u32, netns: &str) -> Attachment {
        let port = RESIDENT_PORT + 2 * i;
        let ports = json!([
            {"hostPort": port, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": port + 1, "containerPort": 443, "protocol": "tcp"},
        ]);
        self.attachment(format!("resident-{i}"), netns, ports)
    }

    /// The same attachment (ID, netns, capability args) for ADD and DEL, as
    /// a runtime passes them again at teardown; the runtime adds the cached
    /// result as DEL's prevResult.
    fn attachment(&self, container_id: String, netns: &str, ports: Value) -> Attachment {
        let mut att = Attachment {
            container_id,
            netns: netns.to_string(),
            ifname: "eth0".into(),
            ..Attachment::default()
        };
        if self.with_ports {
            att.cap_args.insert("portMappings".into(), ports);
        }
        att
    }

    fn add(&self, att: &Attachment) -> Result<(), String> {
        self.runtime
            .add(&self.list, att)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn del(&self, att: &Attachment) -> Result<(), String> {
        self.runtime.del(&self.list, att).map_err(|e| e.to_string())
    }
}

/// A CNI bin dir with cnikit's plugin names linked to the binary, as
/// `cnikit install` makes it.
fn link_cnikit(cnikit: &Path) -> Result<PathBuf, String> {
    let dir = PathBuf::from(STATE).join("bin-cnikit");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for name in ["bridge", "macvlan", "ipvlan", "portmap", "ipamd"] {
        let link = dir.join(name);
        if !link.exists() {
            std::os::unix::fs::symlink(cnikit, &link).map_err(|e| format!("link {name}: {e}"))?;
        }
    }
    Ok(dir)
}

// ------------------------------------------------------------ floor

/// The floor's bridge (it runs no plugin, so no list names it).
pub const FLOOR_BRIDGE: &str = "br-floor";

impl Floor {
    fn new() -> Result<Floor, String> {
        let e = |e: cnikit::netlink::Error| e.to_string();
        let gateway = Ipv4Addr::new(10, 84, 0, 1);
        let mut nl = Netlink::open().map_err(e)?;
        let bridge = nl
            .ensure_bridge(BridgeSpec {
                name: FLOOR_BRIDGE.into(),
                ..BridgeSpec::default()
            })
            .map_err(e)?;
        let gw = IpNet::new(IpAddr::V4(gateway), 16).map_err(|x| x.to_string())?;
        nl.add_address(bridge.index, gw).map_err(e)?;
        nl.set_up(bridge.index).map_err(e)?;
        Ok(Floor {
            bridge_index: bridge.index,
            gateway,
        })
    }

    /// What the bridge plugin does to the kernel, minus IPAM and exec: veth
    /// with the peer made in the pod and the host end enslaved, up with
    /// hairpin and without IPv6;
    /// in the pod the address, eth0 up (without IPv6) and the default route.
    fn add(&self, host_name: &str, address: IpNet, netns: &str) -> Result<(), String> {
        let e = |e: cnikit::netlink::Error| e.to_string();
        let pod = NetNs::open(netns).map_err(e)?;
        let mut host = Netlink::open().map_err(e)?;
        let pair = host
            .create_veth(VethSpec {
                host_name: host_name.into(),
                peer_name: "eth0".into(),
                peer_netns: &pod,
                mtu: None,
                peer_mac: None,
                master: Some(self.bridge_index),
            })
            .map_err(e)?;
        // As the bridge plugin does, no IPv6 on an IPv4-only pod's link: a
        // link-local address would send DAD, router solicitations and MLD
        // that the bridge floods to every other port, which would make the
        // floor's cost grow with the pods on the bridge.
        let port = BridgePort {
            hairpin: true,
            isolated: false,
        };
        host.bridge_port_up(pair.host_index, "cnikit-bench floor", port)
            .map_err(e)?;
        let mut cont = Netlink::open_in(&pod).map_err(e)?;
        cont.add_address(pair.peer_index, address).map_err(e)?;
        // The pod end comes up second, made dormant by its create (see VethSpec).
        cont.set_up_without_link_local(pair.peer_index).map_err(e)?;
        let mut default = Route::new(
            IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0).map_err(|x| x.to_string())?,
        );
        default.gateway = Some(IpAddr::V4(self.gateway));
        default.oif = Some(pair.peer_index);
        cont.add_route(&default).map_err(e)
    }

    /// The bridge plugin's DEL: delete eth0 in the pod (the host end goes with it).
    fn del(&self, netns: &str) -> Result<(), String> {
        let e = |e: cnikit::netlink::Error| e.to_string();
        let pod = NetNs::open(netns).map_err(e)?;
        let mut cont = Netlink::open_in(&pod).map_err(e)?;
        match cont.link_by_name("eth0").map_err(e)? {
            Some(link) => cont.delete_link(link.index).map_err(e),
            None => Ok(()),
        }
    }
}

/// 10.84.0.0/16 minus the gateway, one address per pod: residents from
/// the top of the /16 (below broadcast), churned pods from the bottom; they
/// meet only after 64,000 churned pods.
fn floor_address(pod: Pod) -> Result<IpNet, String> {
    floor_host(match pod {
        Pod::Churn(n) => (n % 65000) as u32 + 2,
        Pod::Resident(i) => 65534 - i,
    })
}

/// The floor's host-side veth name.
fn floor_link(pod: Pod) -> String {
    match pod {
        Pod::Churn(n) => format!("vfl{n:x}"),
        Pod::Resident(i) => format!("vflr{i:x}"),
    }
}

fn floor_host(host: u32) -> Result<IpNet, String> {
    let addr = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 84, 0, 0)) + host);
    IpNet::new(IpAddr::V4(addr), 16).map_err(|e| e.to_string())
}
