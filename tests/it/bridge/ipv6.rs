//! IPv6 on the bridge's pods, set over netlink (no `/proc/sys` write per pod): a pod
//! without an IPv6 address and every host veth get no IPv6 address at all, so nothing of
//! theirs is multicast into the bridge, which would flood it to every pod; a pod with
//! IPv6 gets the kernel's EUI-64 link-local address and its addresses without DAD, and
//! passes traffic. The capture here (an AF_PACKET socket on a link, no tools) also
//! serves ptp's test of the same (`ptp::lifecycle`).

use super::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const ETH_P_ALL: u16 = 0x0003;
const ETH_P_IPV6: u16 = 0x86dd;
const PACKET_OUTGOING: u8 = 4;
/// How long after an ADD a link-local address's DAD (1 s), router solicitation (after
/// DAD) and MLD reports (at once, repeated within 1 s) would all have gone out.
const SETTLE: Duration = Duration::from_millis(2500);

/// One IPv6 frame a capture saw coming in (from the link's peer, not sent by it).
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub src_mac: String,
    pub src: std::net::Ipv6Addr,
    /// The ICMPv6 type (after a hop-by-hop header, as MLD has), None for other payloads.
    pub icmp6: Option<u8>,
}

/// IPv6 frames arriving on a link of the test's netns, from `start` to `stop`.
pub(crate) struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Frame>>>,
}

impl Capture {
    /// Captures on `ifname` (which must exist) in the calling thread's netns.
    pub(crate) fn start(ifname: &str) -> Capture {
        let name = std::ffi::CString::new(ifname).expect("ifname");
        // SAFETY: if_nametoindex reads a NUL-terminated string we own.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(index, 0, "no link {ifname} to capture on");
        // SAFETY: a plain socket(2); the fd is owned right after.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                i32::from(ETH_P_ALL.to_be()),
            )
        };
        assert!(
            raw >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: raw is a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ALL.to_be();
        sll.sll_ifindex = index as i32;
        let len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: bind with a sockaddr_ll of the right length.
        let rc = unsafe { libc::bind(fd.as_raw_fd(), (&raw const sll).cast(), len) };
        assert_eq!(
            rc,
            0,
            "bind to {ifname}: {}",
            std::io::Error::last_os_error()
        );
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        let tv_len = std::mem::size_of::<libc::timeval>() as u32;
        // SAFETY: SO_RCVTIMEO takes a timeval of that length.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                tv_len,
            )
        };
        assert_eq!(rc, 0, "SO_RCVTIMEO");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || read_frames(&fd, &flag));
        Capture {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops after `linger` more and returns the frames seen.
    pub(crate) fn stop_after(mut self, linger: Duration) -> Vec<Frame> {
        std::thread::sleep(linger);
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("running");
        thread.join().expect("capture thread")
    }
}

fn read_frames(fd: &OwnedFd, stop: &AtomicBool) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: recvfrom into buffers we own, with their lengths.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut from).cast(),
                &mut from_len,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            continue; // the timeout, or the link going down for a moment
        };
        if from.sll_pkttype == PACKET_OUTGOING {
            continue;
        }
        if let Some(frame) = ipv6_frame(&buf[..n]) {
            frames.push(frame);
        }
    }
    frames
}

/// An Ethernet frame carrying IPv6, decoded as far as the tests look.
fn ipv6_frame(f: &[u8]) -> Option<Frame> {
    if f.len() < 54 || u16::from_be_bytes([f[12], f[13]]) != ETH_P_IPV6 {
        return None;
    }
    let src_mac = f[6..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let src: [u8; 16] = f[22..38].try_into().ok()?;
    let (mut next, mut at) = (f[20], 54);
    if next == 0 {
        // Hop-by-hop options (MLD's router alert): its length is in 8-byte units.
        next = *f.get(at)?;
        at += (usize::from(*f.get(at + 1)?) + 1) * 8;
    }
    let icmp6 = if next == 58 { f.get(at).copied() } else { None };
    Some(Frame {
        src_mac,
        src: src.into(),
        icmp6,
    })
}

/// The link-local (fe80::/10) addresses of `dev`, `ip -6 addr` in `ns`.
pub(crate) fn link_locals(ns: Option<&str>, dev: &str) -> Vec<String> {
    let mut args = vec!["-6", "-o", "addr", "show", "dev", dev, "scope", "link"];
    if let Some(ns) = ns {
        args.splice(0..0, ["-n", ns]);
    }
    ip(&args)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .collect()
}

/// Every IPv6 address of `dev` (`ip -6 addr`), as "addr/prefix flags…" lines.
pub(crate) fn ipv6_lines(ns: Option<&str>, dev: &str) -> Vec<String> {
    let mut args = vec!["-6", "-o", "addr", "show", "dev", dev];
    if let Some(ns) = ns {
        args.splice(0..0, ["-n", ns]);
    }
    ip(&args)
        .lines()
        .map(|l| l.split_whitespace().skip(3).collect::<Vec<_>>().join(" "))
        .collect()
}

/// `ip -d link` of `dev` says the kernel makes it no link-local address.
pub(crate) fn addrgenmode_none(ns: Option<&str>, dev: &str) -> bool {
    let mut args = vec!["-d", "link", "show", "dev", dev];
    if let Some(ns) = ns {
        args.splice(0..0, ["-n", ns]);
    }
    ip(&args).contains("addrgenmode none")
}

/// The IPv6 multicast groups `dev` is in (`ip -6 maddr`), as addresses.
pub(crate) fn ipv6_groups(ns: Option<&str>, dev: &str) -> BTreeSet<String> {
    let mut args = vec!["-6", "maddr", "show", "dev", dev];
    if let Some(ns) = ns {
        args.splice(0..0, ["-n", ns]);
    }
    ip(&args)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("inet6 "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The EUI-64 link-local address of `mac`, as the kernel makes it.
pub(crate) fn eui64_link_local(mac: &str) -> String {
    let b: Vec<u8> = mac
        .split(':')
        .map(|x| u8::from_str_radix(x, 16).expect("mac"))
        .collect();
    let words = [
        0xfe80,
        0,
        0,
        0,
        u16::from_be_bytes([b[0] ^ 2, b[1]]),
        u16::from_be_bytes([b[2], 0xff]),
        u16::from_be_bytes([0xfe, b[3]]),
        u16::from_be_bytes([b[4], b[5]]),
    ];
    format!("{}/64", std::net::Ipv6Addr::from(words))
}

/// Proves: a pod with no IPv6 address gets none on its interface, and no host veth gets
/// one (a bridge port needs none): no link-local address (`addrgenmode none`, set over
/// netlink, not `disable_ipv6`), only the all-nodes groups, which are never reported; and
/// a capture on the bridge while such a pod is ADDed (a second one, on a bridge already
/// up) and for 2.5 s after sees not one IPv6 frame come in from any port — the DAD,
/// router and MLD solicitations of a link-local address, which the bridge would flood to
/// every pod, do not come back. The pods still reach the gateway and each other.
#[test]
fn ipv4_pods_and_host_veths_send_no_ipv6() {
    let env = TestEnv::new("bridge_ipv4_pods_send_no_ipv6");
    let (c, br, nets) = network(&env, Ipam::Ipamd, Subnets::v4_ranges);
    let [a, b] = env.pair("bridge", &c);
    let ra = a.add();
    std::thread::sleep(SETTLE); // the new bridge's own link-local settles
    let capture = Capture::start(&br);
    let rb = b.add();
    let frames = capture.stop_after(SETTLE);
    assert!(
        frames.is_empty(),
        "IPv6 from the ports during ADD: {frames:?}"
    );
    for (att, r) in [(&a, &ra), (&b, &rb)] {
        let ns = Some(att.ns.name.as_str());
        assert!(
            ipv6_lines(ns, "eth0").is_empty(),
            "{:?}",
            ipv6_lines(ns, "eth0")
        );
        assert!(ipv6_lines(None, host_veth(r)).is_empty(), "host veth {r}");
        assert!(addrgenmode_none(ns, "eth0"));
        assert!(addrgenmode_none(None, host_veth(r)));
        let groups = ipv6_groups(ns, "eth0");
        let all_nodes = BTreeSet::from(["ff01::1".to_string(), "ff02::1".to_string()]);
        assert!(groups.is_subset(&all_nodes), "{groups:?}");
    }
    assert_ping(&a.ns.name, &nets.v4_addr(1));
    assert_ping(&a.ns.name, &first_addr(&rb, false));
    a.del();
    b.del();
}

/// Proves: a dual-stack pod keeps IPv6: its link-local address is the kernel's EUI-64
/// one of its MAC, it and the pod's global address are not tentative (no DAD), so a
/// capture on the bridge during its ADD sees no DAD solicitation (from ::); its host
/// veth has no IPv6 address; and the pod reaches the gateway over both families and
/// another dual-stack pod over IPv6, both ways.
#[test]
fn dual_stack_pods_keep_ipv6_without_dad() {
    let env = TestEnv::new("bridge_dual_stack_without_dad");
    let (conf, br, nets) = network(&env, Ipam::Ipamd, Subnets::dual_ranges);
    let [a, b] = env.pair("bridge", &conf);
    let ra = a.add();
    std::thread::sleep(SETTLE);
    let capture = Capture::start(&br);
    let rb = b.add();
    let frames = capture.stop_after(SETTLE);
    let dad: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.icmp6 == Some(135) && f.src.is_unspecified())
        .collect();
    assert!(dad.is_empty(), "DAD during ADD: {dad:?}");
    let host_macs = [&ra, &rb].map(|r| r["interfaces"][1]["mac"].as_str().unwrap_or(""));
    assert!(
        frames
            .iter()
            .all(|f| !host_macs.contains(&f.src_mac.as_str())),
        "a host veth sent IPv6 into the bridge: {frames:?}"
    );
    for (att, r) in [(&a, &ra), (&b, &rb)] {
        let ns = Some(att.ns.name.as_str());
        let mac = r["interfaces"][2]["mac"].as_str().expect("pod MAC");
        assert_eq!(link_locals(ns, "eth0"), [eui64_link_local(mac)]);
        let lines = ipv6_lines(ns, "eth0");
        assert!(lines.iter().all(|l| !l.contains("tentative")), "{lines:?}");
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(ipv6_lines(None, host_veth(r)).is_empty(), "host veth {r}");
    }
    assert_ping(&a.ns.name, &nets.v4_addr(1));
    assert_ping(&a.ns.name, &nets.v6_addr(1));
    assert_ping(&a.ns.name, &first_addr(&rb, true));
    assert_ping(&b.ns.name, &first_addr(&ra, true));
    a.del();
    b.del();
}

/// Proves: in a netns whose defaults turn IPv6 off (`default/disable_ipv6` 1, as a
/// netns inherits on a host that runs without IPv6 with `devconf_inherit_init_net`), a
/// dual-stack pod still gets its IPv6 addresses and passes IPv6 traffic: the kernel
/// refuses the first address, and the plugin turns IPv6 on for the interface, as it
/// always did before.
#[test]
fn ipv6_is_turned_on_where_the_netns_defaults_have_it_off() {
    let env = TestEnv::new("bridge_ipv6_off_by_default");
    let (conf, _, nets) = network(&env, Ipam::Ipamd, Subnets::dual_ranges);
    let att = env.new_attachment("bridge", "v6off", &conf);
    let key = "net.ipv6.conf.default.disable_ipv6=1";
    let (ok, _, err) = sh("ip", &["netns", "exec", &att.ns.name, "sysctl", "-qw", key]);
    assert!(ok, "{err}");
    let r = att.add();
    let ns = Some(att.ns.name.as_str());
    let mac = r["interfaces"][2]["mac"].as_str().expect("pod MAC");
    assert_eq!(link_locals(ns, "eth0"), [eui64_link_local(mac)]);
    assert_ping(&att.ns.name, &nets.v6_addr(1));
    att.del();
}

/// Proves: with `enabledad` a dual-stack pod's IPv6 addresses go through DAD, as the
/// reference has them: `accept_dad` is 1 on its interface, its addresses (the link-local
/// one too) are added without IFA_F_NODAD and are tentative right after ADD, and DAD
/// ends within seconds, so the kernel did start it: the pod's end of the veth, which
/// comes up dormant, became ready. The pod then reaches the gateway over IPv6.
#[test]
fn enabledad_pods_do_dad() {
    let env = TestEnv::new("bridge_enabledad");
    let (conf, _, nets) = network(&env, Ipam::Ipamd, Subnets::dual_ranges);
    let conf = merged(conf, json!({"enabledad": true}));
    let att = env.new_attachment("bridge", "dad", &conf);
    att.add();
    let ns = Some(att.ns.name.as_str());
    let lines = ipv6_lines(ns, "eth0");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|l| !l.contains("nodad")), "{lines:?}");
    assert!(lines.iter().all(|l| l.contains("tentative")), "{lines:?}");
    let key = "net.ipv6.conf.eth0.accept_dad";
    let (ok, out, err) = sh("ip", &["netns", "exec", &att.ns.name, "sysctl", "-n", key]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1");
    eventually("the pod's DAD is done", || {
        ipv6_lines(ns, "eth0")
            .iter()
            .all(|l| !l.contains("tentative"))
    });
    assert_ping(&att.ns.name, &nets.v6_addr(1));
    att.del();
}
