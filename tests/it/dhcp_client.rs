//! The DHCP client (`cnikit::dhcp`) against a real server: dnsmasq in a "LAN" namespace on
//! one end of a veth (10.99.0.1/24), the other end the pod's `eth0`. The library is called
//! directly, as the lease daemon calls it; the lease file dnsmasq keeps shows what the
//! server made of each exchange. dnsmasq is authoritative, as a LAN's only server is set
//! up: otherwise it ignores a request it cannot grant instead of refusing it.

use crate::support::*;
use cnikit::dhcp::exchange::{Ack, Client};
use cnikit::dhcp::options::{client_id, client_options, ClientOptions};
use cnikit::dhcp::socket::PodSocket;
use cnikit::dhcp::{ErrorKind, Timing};
use dhcproto::v4::{DhcpOption, OptionCode};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// dnsmasq's shortest lease.
const LEASE_SECS: u32 = 120;

/// Quick enough for a test, slow enough for dnsmasq on a loaded machine.
const TIMING: Timing = Timing {
    reply: Duration::from_secs(2),
    resend_max: Duration::from_secs(4),
    exchange: Duration::from_secs(10),
};

/// One test's LAN: the namespaces, the server's end of the veth, and dnsmasq if asked for.
struct Lan {
    env: TestEnv,
    pod: Netns,
    server_if: String,
    lan: Netns,
    dnsmasq: Option<Child>,
    leases: PathBuf,
    log: PathBuf,
    options: ClientOptions,
}

impl Lan {
    fn new(test: &str, server: bool) -> Lan {
        let env = TestEnv::new(test);
        let (lan, pod) = (env.netns(), env.netns());
        let (server_if, pod_if) = env.veth_pair();
        ip(&["link", "set", &server_if, "netns", &lan.name]);
        ip(&[
            "-n",
            &lan.name,
            "addr",
            "add",
            "10.99.0.1/24",
            "dev",
            &server_if,
        ]);
        ip(&["-n", &lan.name, "link", "set", &server_if, "up"]);
        // Left down: opening the client's socket sets it up.
        ip(&["link", "set", &pod_if, "netns", &pod.name]);
        ip(&["-n", &pod.name, "link", "set", &pod_if, "name", "eth0"]);
        let dir = env.dir("dnsmasq");
        let options = client_options(client_id(test, "lan", "eth0"), &[], &[], "");
        let mut lan = Lan {
            pod,
            server_if,
            lan,
            dnsmasq: None,
            leases: dir.join("leases"),
            log: dir.join("log"),
            options: options.expect("client options"),
            env,
        };
        if server {
            lan.start_dnsmasq();
        }
        lan
    }

    fn start_dnsmasq(&mut self) {
        let range = format!("--dhcp-range=10.99.0.50,10.99.0.99,255.255.255.0,{LEASE_SECS}");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.lan.name, "/usr/sbin/dnsmasq"])
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--port=0",
                "--no-ping",
            ])
            .args([
                "--user=root",
                "--pid-file",
                "--log-dhcp",
                "--dhcp-authoritative",
                &range,
            ])
            .arg(format!("--dhcp-leasefile={}", self.leases.display()))
            .arg(format!("--log-facility={}", self.log.display()))
            .arg(format!("--interface={}", self.server_if))
            .stdin(Stdio::null())
            .spawn()
            .expect("start dnsmasq");
        self.dnsmasq = Some(child);
        eventually("dnsmasq serves DHCP", || {
            self.log_text().contains("DHCP, IP range")
        });
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn socket(&self) -> PodSocket {
        PodSocket::open(Path::new(&self.pod.path), "eth0").expect("open the pod's socket")
    }

    fn client<'a>(&'a self, socket: &'a PodSocket, timing: Timing) -> Client<'a> {
        Client {
            socket,
            options: &self.options,
            timing,
            broadcast: false,
            cancel: None,
        }
    }

    /// dnsmasq's lease file line for `addr` ("expiry mac addr name client-id").
    fn lease_line(&self, addr: Ipv4Addr) -> Option<String> {
        let text = std::fs::read_to_string(&self.leases).unwrap_or_default();
        let addr = addr.to_string();
        text.lines()
            .find(|l| l.split(' ').nth(2) == Some(addr.as_str()))
            .map(str::to_string)
    }

    /// The leased address on the pod's eth0, as the interface plugin puts it there: the
    /// server answers a client with an address by unicast, and needs ARP for that.
    fn configure(&self, ack: &Ack) {
        let cidr = format!("{}/24", ack.yiaddr());
        ip(&["-n", &self.pod.name, "addr", "add", &cidr, "dev", "eth0"]);
    }

    /// The acquired lease, with the server's log should it fail.
    fn acquire(&self, client: &Client) -> Ack {
        let started = Instant::now();
        let ack = client
            .acquire(None)
            .unwrap_or_else(|e| panic!("acquire: {e}\ndnsmasq:\n{}", self.log_text()));
        eprintln!("acquired {} in {:?}", ack.yiaddr(), started.elapsed());
        ack
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        if let Some(mut child) = self.dnsmasq.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn option(ack: &Ack, code: OptionCode) -> Option<DhcpOption> {
    ack.message.opts().get(code).cloned()
}

#[test]
fn acquire_gets_an_address_in_range_with_mask_router_and_lease_time() {
    let lan = Lan::new("dhcp-acquire", true);
    let socket = lan.socket();
    let l = link(Some(&lan.pod.name), "eth0").expect("eth0");
    assert!(has_flag(&l, "UP"), "opening the socket sets eth0 up: {l}");
    let ack = lan.acquire(&lan.client(&socket, TIMING));
    let addr = ack.yiaddr();
    assert!((50..=99).contains(&addr.octets()[3]), "{addr}");
    assert!(addr.octets()[..3] == [10, 99, 0], "{addr}");
    let mask = Ipv4Addr::new(255, 255, 255, 0);
    assert_eq!(
        option(&ack, OptionCode::SubnetMask),
        Some(DhcpOption::SubnetMask(mask))
    );
    assert_eq!(
        option(&ack, OptionCode::Router),
        Some(DhcpOption::Router(vec![SERVER]))
    );
    let lease_time = DhcpOption::AddressLeaseTime(LEASE_SECS);
    assert_eq!(option(&ack, OptionCode::AddressLeaseTime), Some(lease_time));
    assert_eq!(ack.server_id(), SERVER);
    let server = link(Some(&lan.lan.name), &lan.server_if).expect("server link");
    let mac = ack.server_mac.map(|b| format!("{b:02x}")).join(":");
    assert_eq!(server["address"], mac.as_str(), "the ACK's source MAC");
    // dnsmasq knows the client by its identifier (its lease file: hex, colon separated).
    let line = lan.lease_line(addr).expect("dnsmasq lists the lease");
    let id = client_id("dhcp-acquire", "lan", "eth0");
    let id: Vec<String> = id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        line.split(' ').nth(4),
        Some(id.join(":").as_str()),
        "{line}"
    );
    // The stored form gives the same lease back.
    let stored = ack.to_bytes().expect("to_bytes");
    assert_eq!(Ack::from_bytes(&stored).expect("from_bytes"), ack);
    // The checks a held lease gets.
    assert!(socket.link().link_present().expect("link_present"));
    assert!(socket.link().netns_still_at_path());
    assert!(!socket
        .link()
        .has_address(ipnet::IpNet::V4(ipnet::Ipv4Net::new(addr, 24).unwrap()))
        .expect("has_address"));
    lan.configure(&ack);
    assert!(socket
        .link()
        .has_address(ipnet::IpNet::V4(ipnet::Ipv4Net::new(addr, 24).unwrap()))
        .expect("has_address"));
    assert!(!socket
        .link()
        .has_address(ipnet::IpNet::V4(ipnet::Ipv4Net::new(addr, 16).unwrap()))
        .expect("has_address"));
}

#[test]
fn renew_and_rebind_get_a_fresh_lease() {
    let lan = Lan::new("dhcp-renew", true);
    let socket = lan.socket();
    let client = lan.client(&socket, TIMING);
    let ack = lan.acquire(&client);
    lan.configure(&ack);
    let expiry = |line: Option<String>| -> u64 {
        let line = line.expect("dnsmasq lists the lease");
        line.split(' ')
            .next()
            .and_then(|e| e.parse().ok())
            .expect("expiry")
    };
    let first = expiry(lan.lease_line(ack.yiaddr()));
    // dnsmasq's expiry has a resolution of one second.
    std::thread::sleep(Duration::from_millis(1100));
    let renewed = client
        .renew(&ack)
        .unwrap_or_else(|e| panic!("renew: {e}\ndnsmasq:\n{}", lan.log_text()));
    assert_eq!(renewed.yiaddr(), ack.yiaddr());
    assert_eq!(renewed.server_mac, ack.server_mac);
    let lease_time = DhcpOption::AddressLeaseTime(LEASE_SECS);
    assert_eq!(
        option(&renewed, OptionCode::AddressLeaseTime),
        Some(lease_time)
    );
    let second = expiry(lan.lease_line(ack.yiaddr()));
    assert!(
        second > first,
        "renewal moved the expiry: {first} → {second}"
    );
    let rebound = client
        .rebind(&renewed)
        .unwrap_or_else(|e| panic!("rebind: {e}\ndnsmasq:\n{}", lan.log_text()));
    assert_eq!(rebound.yiaddr(), ack.yiaddr());
}

#[test]
fn release_makes_the_server_drop_the_lease() {
    let lan = Lan::new("dhcp-release", true);
    let socket = lan.socket();
    let client = lan.client(&socket, TIMING);
    let ack = lan.acquire(&client);
    assert!(lan.lease_line(ack.yiaddr()).is_some());
    client.release(&ack).expect("release");
    eventually("dnsmasq forgets the released lease", || {
        lan.lease_line(ack.yiaddr()).is_none()
    });
    assert!(lan.log_text().contains("DHCPRELEASE"), "{}", lan.log_text());
}

#[test]
fn reboot_of_a_held_address_is_acked() {
    let lan = Lan::new("dhcp-reboot", true);
    let socket = lan.socket();
    let client = lan.client(&socket, TIMING);
    let ack = lan.acquire(&client);
    // With the BROADCAST flag, the server broadcasts its answer.
    let client = Client {
        broadcast: true,
        ..client
    };
    let again = client
        .reboot(ack.yiaddr())
        .unwrap_or_else(|e| panic!("reboot: {e}\ndnsmasq:\n{}", lan.log_text()));
    assert_eq!(again.yiaddr(), ack.yiaddr());
    assert_eq!(again.server_id(), SERVER);
}

#[test]
fn a_request_for_a_foreign_address_is_refused() {
    let lan = Lan::new("dhcp-nak", true);
    let socket = lan.socket();
    let client = lan.client(&socket, TIMING);
    let e = client
        .reboot(Ipv4Addr::new(192, 168, 77, 7))
        .expect_err("a NAK for an address of another network");
    assert_eq!(
        e.kind,
        ErrorKind::Refused,
        "{e}\ndnsmasq:\n{}",
        lan.log_text()
    );
    eprintln!("{e}");
    assert!(e.message.contains("10.99.0.1"), "{e}");
    assert!(e.message.contains("192.168.77.7"), "{e}");
    assert!(e.message.contains("wrong"), "the server's own words: {e}");
}

#[test]
fn no_server_is_no_answer_within_the_exchange_time() {
    let lan = Lan::new("dhcp-silence", false);
    let socket = lan.socket();
    let timing = Timing {
        reply: Duration::from_secs(1),
        resend_max: Duration::from_secs(2),
        exchange: Duration::from_secs(3),
    };
    let started = Instant::now();
    let e = lan
        .client(&socket, timing)
        .acquire(None)
        .expect_err("nobody answers");
    let took = started.elapsed();
    assert_eq!(e.kind, ErrorKind::NoAnswer, "{e}");
    eprintln!("{e} (took {took:?})");
    assert!(
        took >= Duration::from_millis(2900),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_millis(3800), "gave up late: {took:?}");
    for part in ["eth0", lan.pod.path.as_str(), "3s", "3 DISCOVERs"] {
        assert!(e.message.contains(part), "{part:?} missing: {e}");
    }
}

#[test]
fn cancel_ends_a_wait_quickly() {
    let lan = Lan::new("dhcp-cancel", false);
    let socket = lan.socket();
    let cancel = AtomicBool::new(false);
    let client = Client {
        cancel: Some(&cancel),
        ..lan.client(&socket, Timing::default())
    };
    let started = Instant::now();
    let e = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        client.acquire(None).expect_err("cancelled")
    });
    let took = started.elapsed();
    assert_eq!(e.kind, ErrorKind::NoAnswer, "{e}");
    assert!(e.message.contains("cancelled"), "{e}");
    eprintln!("{e} (took {took:?})");
    assert!(took < Duration::from_millis(800), "cancel took {took:?}");
}

#[test]
fn a_missing_link_or_netns_is_no_interface_and_a_removed_netns_is_noticed() {
    let lan = Lan::new("dhcp-gone", false);
    let e = PodSocket::open(Path::new(&lan.pod.path), "eth9").expect_err("no eth9");
    assert_eq!(e.kind, ErrorKind::NoInterface, "{e}");
    assert!(
        e.message.contains("eth9") && e.message.contains(&lan.pod.path),
        "{e}"
    );
    let socket = lan.socket();
    assert_eq!(socket.netns_path(), Path::new(&lan.pod.path));
    socket.set_link_up(false).expect("set eth0 down");
    let l = link(Some(&lan.pod.name), "eth0").expect("eth0");
    assert!(!has_flag(&l, "UP"), "{l}");
    lan.env.del_netns(&lan.pod);
    // The socket's handle keeps the namespace (and its eth0) alive, but nothing names it.
    assert!(!socket.link().netns_still_at_path());
    assert!(socket.link().link_present().expect("link_present"));
    let e = PodSocket::open(Path::new(&lan.pod.path), "eth0").expect_err("netns gone");
    assert_eq!(e.kind, ErrorKind::NoInterface, "{e}");
    assert!(
        e.message.contains("eth0") && e.message.contains(&lan.pod.path),
        "{e}"
    );
}
