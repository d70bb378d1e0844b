//! The LAN: a network namespace with one end of a veth pair at 10.99.0.1/24 and a DHCP
//! server on it; the other end stays in the test host namespace as the pods' uplink. The
//! server is dnsmasq (authoritative, range .50–.99, its minimum lease of 120 s, two name
//! servers) or ISC dhcpd, whose leases may be a few seconds long.

use super::{DNS, SERVER};
use crate::support::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// dnsmasq's range and lease time.
const DNSMASQ_RANGE: &str = "--dhcp-range=10.99.0.50,10.99.0.99,255.255.255.0,120";

/// Which server runs, and where it keeps its leases and its log.
struct Server {
    child: Child,
    leases: PathBuf,
    log: PathBuf,
}

/// One test's LAN and its server.
pub(super) struct Lan {
    pub env: TestEnv,
    /// The LAN namespace.
    pub ns: Netns,
    /// The server's interface, in the LAN namespace.
    pub server_if: String,
    /// The host end: the pods' macvlan master or a port of their bridge.
    pub master: String,
    dir: PathBuf,
    /// Behind a lock: the server is restarted while pods borrow `env`.
    server: Mutex<Option<Server>>,
    /// ISC's DHCPv6 server (`dhcpd -6`), a process of its own beside `server`.
    server6: Mutex<Option<Server>>,
}

impl Lan {
    /// The LAN without a server.
    pub fn new(test: &str) -> Lan {
        let env = TestEnv::new(test);
        let ns = env.netns();
        let (master, server_if) = env.veth_pair();
        ip(&["link", "set", &server_if, "netns", &ns.name]);
        let addr = format!("{SERVER}/24");
        ip(&["-n", &ns.name, "addr", "add", &addr, "dev", &server_if]);
        ip(&["-n", &ns.name, "link", "set", &server_if, "up"]);
        let dir = env.dir("lan");
        Lan {
            env,
            ns,
            server_if,
            master,
            dir,
            server: Mutex::new(None),
            server6: Mutex::new(None),
        }
    }

    /// The LAN's IPv6 subnet on the server's interface (without DAD: usable at once).
    pub fn add_v6(&self) {
        let addr = format!("{}/64", super::v6::SERVER6);
        ip(&[
            "-n",
            &self.ns.name,
            "addr",
            "add",
            &addr,
            "dev",
            &self.server_if,
            "nodad",
        ]);
    }

    /// The LAN with IPv6 and dnsmasq serving both families (DHCPv6 range .50–.99 of
    /// fd00:99::/64, two-minute leases, router advertisements on), with `extra` arguments.
    pub fn with_dnsmasq6(test: &str, extra: &[&str]) -> Lan {
        let lan = Lan::new(test);
        lan.add_v6();
        let mut args = vec![
            "--dhcp-range=fd00:99::50,fd00:99::99,64,120",
            "--enable-ra",
            "--dhcp-option=option6:dns-server,[fd00:99::53]",
        ];
        args.extend_from_slice(extra);
        lan.start_dnsmasq(&args);
        lan
    }

    /// ISC `dhcpd -6` with `conf`, leases in `leases` (kept across restarts).
    pub fn start_isc6(&self, conf: &str, leases: &Path) {
        let (child, log) = self.spawn_isc("-6", conf, leases);
        self.stop_server6();
        *lock(&self.server6) = Some(Server {
            child,
            leases: leases.to_path_buf(),
            log,
        });
        eventually("dhcpd -6 starts serving", || {
            self.server6_log().contains("Server starting service")
        });
    }

    pub fn stop_server6(&self) {
        let taken = lock(&self.server6).take();
        if let Some(mut s) = taken {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    }

    /// The DHCPv6 ISC server's log.
    pub fn server6_log(&self) -> String {
        lock(&self.server6)
            .as_ref()
            .and_then(|s| std::fs::read_to_string(&s.log).ok())
            .unwrap_or_default()
    }

    /// The DHCPv6 ISC server's lease file.
    pub fn server6_leases(&self) -> String {
        lock(&self.server6)
            .as_ref()
            .and_then(|s| std::fs::read_to_string(&s.leases).ok())
            .unwrap_or_default()
    }

    /// Whether dnsmasq's lease file holds a lease of the IPv6 address `addr`.
    pub fn dnsmasq_has6(&self, addr: &str) -> bool {
        self.server_leases()
            .lines()
            .any(|l| l.split(' ').nth(2) == Some(addr))
    }

    /// The LAN with dnsmasq, which also gets `extra` arguments.
    pub fn with_dnsmasq(test: &str, extra: &[&str]) -> Lan {
        let lan = Lan::new(test);
        lan.start_dnsmasq(extra);
        lan
    }

    pub fn start_dnsmasq(&self, extra: &[&str]) {
        let leases = self.dir.join("dnsmasq.leases");
        let log = self.dir.join(format!("dnsmasq-{}.log", next_id()));
        let dns = format!("--dhcp-option=6,{}", DNS.join(","));
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns.name, "/usr/sbin/dnsmasq"])
            .args(["--no-daemon", "--conf-file=/dev/null", "--port=0"])
            .args(["--no-ping", "--user=root", "--pid-file", "--log-dhcp"])
            .args(["--dhcp-authoritative", DNSMASQ_RANGE, &dns])
            .args(extra)
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--log-facility={}", log.display()))
            .arg(format!("--interface={}", self.server_if))
            .stdin(Stdio::null())
            .spawn()
            .expect("start dnsmasq");
        self.set_server(child, leases, log, "DHCP, IP range");
    }

    /// ISC dhcpd with `conf` (see [`isc_conf`]), keeping its leases in `leases` (made
    /// empty if it is not there): the same file across restarts keeps the server's memory.
    pub fn start_isc(&self, conf: &str, leases: &Path) {
        let (child, log) = self.spawn_isc("-4", conf, leases);
        self.set_server(child, leases.to_path_buf(), log, "Server starting service");
    }

    /// `dhcpd FAMILY` (-4, -6) on the server's interface with `conf` and `leases`; the
    /// process and its log.
    fn spawn_isc(&self, family: &str, conf: &str, leases: &Path) -> (Child, PathBuf) {
        let n = next_id();
        let conf_path = self.dir.join(format!("dhcpd{family}-{n}.conf"));
        std::fs::write(&conf_path, conf).expect("write dhcpd.conf");
        if !leases.exists() {
            std::fs::write(leases, "").expect("create the dhcpd lease file");
        }
        let log = self.dir.join(format!("dhcpd{family}-{n}.log"));
        let out = std::fs::File::create(&log).expect("create the dhcpd log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns.name, "/usr/sbin/dhcpd"])
            .args([family, "-f", "-d", "-cf"])
            .arg(&conf_path)
            .arg("-lf")
            .arg(leases)
            .arg("-pf")
            .arg(self.dir.join(format!("dhcpd{family}-{n}.pid")))
            .arg(&self.server_if)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup the dhcpd log"))
            .stderr(out)
            .spawn()
            .expect("start dhcpd (package isc-dhcp-server)");
        (child, log)
    }

    /// A lease file for ISC dhcpd in the LAN's directory.
    pub fn isc_lease_file(&self, what: &str) -> PathBuf {
        self.dir.join(format!("{what}.leases"))
    }

    fn set_server(&self, child: Child, leases: PathBuf, log: PathBuf, ready: &str) {
        self.stop_server();
        *lock(&self.server) = Some(Server { child, leases, log });
        eventually(&format!("the DHCP server logs {ready:?}"), || {
            self.server_log().contains(ready)
        });
    }

    pub fn stop_server(&self) {
        let taken = lock(&self.server).take();
        if let Some(mut s) = taken {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    }

    /// The running server's log.
    pub fn server_log(&self) -> String {
        lock(&self.server)
            .as_ref()
            .and_then(|s| std::fs::read_to_string(&s.log).ok())
            .unwrap_or_default()
    }

    /// The running server's lease file.
    pub fn server_leases(&self) -> String {
        lock(&self.server)
            .as_ref()
            .and_then(|s| std::fs::read_to_string(&s.leases).ok())
            .unwrap_or_default()
    }

    /// The address dnsmasq's lease file gives the client `CONTAINERID/NETWORK/IFNAME`
    /// (dnsmasq lists the client identifier in hex, colon separated).
    pub fn dnsmasq_lease(&self, container: &str) -> Option<String> {
        let id = cnikit::dhcp::options::client_id(container, super::NET, "eth0");
        let id: Vec<String> = id.iter().map(|b| format!("{b:02x}")).collect();
        let id = id.join(":");
        self.server_leases()
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f.get(4) == Some(&id.as_str()))
            .and_then(|f| f.get(2).map(|a| a.to_string()))
    }

    /// Waits until dnsmasq has forgotten `container`'s lease (a DHCPRELEASE came).
    pub fn wait_dnsmasq_forgets(&self, container: &str, limit: Duration) -> Duration {
        super::wait_until(
            &format!("dnsmasq drops the lease of {container}"),
            limit,
            || self.dnsmasq_lease(container).is_none(),
            || format!("{}\n{}", self.server_leases(), self.server_log()),
        )
    }

    /// How many DHCPACKs ISC dhcpd logged for `addr`.
    pub fn isc_acks(&self, addr: &str) -> usize {
        let needle = format!("DHCPACK on {addr} ");
        self.server_log().matches(&needle).count()
    }

    /// The `ends` of the last lease statement for `addr` in ISC's lease file, without
    /// the weekday ("2025/11/26 10:00:08"): later leases sort later.
    pub fn isc_lease_end(&self, addr: &str) -> Option<String> {
        let text = self.server_leases();
        let start = text.rfind(&format!("lease {addr} {{"))?;
        let block = &text[start..];
        let block = &block[..block.find('}').unwrap_or(block.len())];
        let ends = block.lines().find_map(|l| l.trim().strip_prefix("ends "))?;
        Some(ends.split_once(' ')?.1.trim_end_matches(';').to_string())
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("DHCP server log:\n{}", self.server_log());
            eprintln!("DHCPv6 server log:\n{}", self.server6_log());
        }
        self.stop_server();
        self.stop_server6();
    }
}

/// An authoritative ISC dhcpd configuration for 10.99.0.0/24 handing out `range` (for
/// instance "10.99.0.50 10.99.0.99") for `lease` seconds exactly, with the router and
/// the name servers.
pub(super) fn isc_conf(lease: u32, range: &str) -> String {
    format!(
        "authoritative;\n\
         ddns-update-style none;\n\
         ping-check false;\n\
         default-lease-time {lease};\nmax-lease-time {lease};\nmin-lease-time {lease};\n\
         subnet 10.99.0.0 netmask 255.255.255.0 {{\n\
         \x20 range {range};\n\
         \x20 option routers {SERVER};\n\
         \x20 option domain-name-servers {};\n\
         }}\n",
        DNS.join(", ")
    )
}
