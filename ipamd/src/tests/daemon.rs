use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::http;
use crate::client::Client;
use crate::daemon::{start_with, DaemonHandle, DaemonOptions};
use crate::store::{Store, StoreOptions};
use crate::testutil::{key, req, sets, skip_unless_root, temp_dir};
use crate::ErrorKind;

pub(super) fn daemon_opts(dir: &Path) -> DaemonOptions {
    DaemonOptions {
        socket: dir.join("ipamd.sock"),
        data_dir: dir.join("data"),
        reclaim_previous_boot: true,
        log_level: "error".into(),
        allowed_gid: None,
        services: crate::service::Services::new(),
        cluster: None,
        block_routes: None,
        plugin_calls: true,
    }
}

pub(super) fn store_opts(boot: &str) -> StoreOptions {
    StoreOptions {
        boot_id: boot.into(),
        ..StoreOptions::default()
    }
}

/// A daemon with this machine's real boot ID, like the in-process fallback uses.
pub(super) fn start(dir: &Path) -> DaemonHandle {
    start_with(daemon_opts(dir), StoreOptions::default()).unwrap()
}

pub(super) fn client(dir: &Path) -> Client {
    Client::new(&dir.join("ipamd.sock"), &dir.join("data"))
}

pub(super) fn get(sock: &Path, target: &str) -> (u16, String) {
    let r = http::request(
        sock,
        "GET",
        target,
        None,
        Duration::from_secs(2),
        Duration::from_secs(5),
    )
    .map_err(|e| format!("{e:?}"))
    .unwrap();
    (r.status, String::from_utf8(r.body).unwrap())
}

fn metric(sock: &Path, line_prefix: &str) -> u64 {
    let (_, m) = get(sock, "/metrics");
    m.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

#[test]
fn client_round_trip_through_the_daemon() {
    let d = temp_dir("daemon-rt");
    let sock = d.path().join("ipamd.sock");
    let h = start(d.path());
    let c = client(d.path());
    let rs = sets("10.22.0.0/24");

    let a = c.allocate(&req("net1", "c1", &rs)).unwrap();
    assert_eq!(a[0].address.to_string(), "10.22.0.2/24");
    assert_eq!(c.allocate(&req("net1", "c1", &rs)).unwrap(), a);
    c.allocate(&req("net1", "c2", &rs)).unwrap();
    assert_eq!(c.check(&key("net1", "c1")).unwrap(), a);
    assert!(c.check(&key("net1", "zz")).unwrap().is_empty());
    c.status("net1", &rs).unwrap();
    let leases = c.leases(None).unwrap();
    assert_eq!(leases.len(), 2);
    assert_eq!(c.leases(Some("net1")).unwrap(), leases);
    assert_eq!(c.gc("net1", &[key("net1", "c1")]).unwrap(), 1);
    c.release(&key("net1", "c1")).unwrap();
    c.release(&key("net1", "never")).unwrap();
    assert!(c.leases(Some("net1")).unwrap().is_empty());
    let e = c.status("net1", &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);

    // Everything above went through the daemon, not the in-process fallback.
    assert_eq!(
        metric(
            &sock,
            "ipamd_requests_total{verb=\"allocate\",outcome=\"ok\"}"
        ),
        3
    );
    assert_eq!(
        metric(
            &sock,
            "ipamd_requests_total{verb=\"release\",outcome=\"ok\"}"
        ),
        2
    );
    assert_eq!(
        metric(
            &sock,
            "ipamd_requests_total{verb=\"status\",outcome=\"invalid_config\"}"
        ),
        1
    );
    assert!(metric(&sock, "ipamd_fsyncs_total") > 0);
    assert_eq!(metric(&sock, "ipamd_leases_in_use{network=\"net1\"}"), 0);
    assert_eq!(metric(&sock, "ipamd_leases_free{network=\"net1\"}"), 253);
    let (_, m) = get(&sock, "/metrics");
    assert!(
        m.contains("ipamd_request_duration_seconds_bucket{verb=\"allocate\",le=\"+Inf\"} 3"),
        "{m}"
    );
    assert_eq!(get(&sock, "/healthz"), (200, "ok\n".to_string()));
    assert_eq!(get(&sock, "/nope").0, 404);

    let mode = std::fs::metadata(&sock).map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o777
    });
    assert_eq!(mode.unwrap(), 0o600);
    h.stop().unwrap();
    assert!(!sock.exists(), "socket file left behind");
}

#[test]
fn daemon_refuses_bad_requests() {
    let d = temp_dir("daemon-bad");
    let sock = d.path().join("ipamd.sock");
    let _h = start(d.path());
    // The client validates before sending; the daemon validates again for other callers.
    let e = client(d.path())
        .allocate(&req("../etc", "c1", &sets("10.0.0.0/24")))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    let release = |body: &[u8]| {
        let (connect, io) = (Duration::from_secs(1), Duration::from_secs(5));
        http::request(&sock, "POST", "/v1/release", Some(body), connect, io)
    };
    let body = serde_json::to_vec(&key("../etc", "c1")).unwrap();
    let r = release(&body).unwrap();
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("invalid_config"));
    assert!(!d.path().join("etc").exists());
    let big = vec![b' '; 2 << 20];
    let r = release(&big);
    // The daemon either answers 413 or drops the connection once the limit is crossed.
    if let Ok(r) = r {
        assert_eq!(r.status, 413);
    }
    let r = http::request(
        &sock,
        "POST",
        "/v1/check",
        Some(b"{not json"),
        Duration::from_secs(1),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(get(&sock, "/v1/allocate").0, 405);
}

#[test]
fn in_process_fallback_and_handover_to_the_daemon() {
    let d = temp_dir("fallback");
    let c = client(d.path());
    let rs = sets("10.22.0.0/24");
    // No socket file: in-process.
    let a = c.allocate(&req("net1", "c1", &rs)).unwrap();
    // Stale socket file (connection refused): in-process too.
    drop(UnixListener::bind(d.path().join("ipamd.sock")).unwrap());
    let b = c.allocate(&req("net1", "c2", &rs)).unwrap();
    assert_ne!(a, b);
    assert_eq!(c.leases(None).unwrap().len(), 2);

    let h = start(d.path());
    assert_eq!(c.allocate(&req("net1", "c1", &rs)).unwrap(), a);
    let n = c.allocate(&req("net1", "c3", &rs)).unwrap();
    assert!(n != a && n != b);
    h.stop().unwrap();
    // And back to in-process, which sees what the daemon wrote.
    assert_eq!(c.check(&key("net1", "c3")).unwrap(), n);
    assert_eq!(c.leases(Some("net1")).unwrap().len(), 3);
}

/// A "daemon" that accepts, reads the request and then misbehaves.
fn fake_daemon(sock: PathBuf, behaviour: &'static str) -> std::thread::JoinHandle<()> {
    let l = UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf);
        match behaviour {
            "close" => drop(s),
            "half" => {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"allo");
                drop(s);
            }
            _ => std::thread::sleep(Duration::from_millis(1500)),
        }
    })
}

#[test]
fn daemon_dying_mid_request_does_not_hang_or_half_allocate() {
    let rs = sets("10.22.0.0/24");
    for behaviour in ["close", "half", "hang"] {
        let d = temp_dir("died");
        let t = fake_daemon(d.path().join("ipamd.sock"), behaviour);
        let c =
            client(d.path()).with_timeouts(Duration::from_millis(500), Duration::from_millis(300));
        let started = Instant::now();
        let a = c.allocate(&req("net1", "c1", &rs)).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{behaviour}: client hung"
        );
        assert_eq!(a[0].address.to_string(), "10.22.0.2/24", "{behaviour}");
        let mut s = Store::open(&d.path().join("data"), "net1", store_opts("boot-now")).unwrap();
        assert_eq!(s.leases().unwrap().len(), 1, "{behaviour}");
        t.join().unwrap();
    }
}

#[test]
fn one_daemon_per_data_dir() {
    let d = temp_dir("single");
    let _h = start(d.path());
    let mut o = daemon_opts(d.path());
    o.socket = d.path().join("other.sock");
    let e = start_with(o, store_opts("boot-now")).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("another ipamd daemon"), "{e}");
    // A live socket is not stolen either.
    let d2 = temp_dir("single2");
    let mut o = daemon_opts(d2.path());
    o.socket = d.path().join("ipamd.sock");
    let e = start_with(o, store_opts("boot-now")).err().unwrap();
    assert!(e.to_string().contains("in use"), "{e}");
}

#[test]
fn daemon_reclaims_previous_boot_unless_told_not_to() {
    let rs = sets("10.22.0.0/24");
    for reclaim in [true, false] {
        let d = temp_dir("reclaim");
        let data = d.path().join("data");
        let mut old = Store::open(&data, "net1", store_opts("boot-old")).unwrap();
        for c in ["a", "b"] {
            old.allocate(&req("net1", c, &rs)).unwrap();
        }
        let mut o = daemon_opts(d.path());
        o.reclaim_previous_boot = reclaim;
        let h = start_with(o, store_opts("boot-now")).unwrap();
        let left = client(d.path()).leases(None).unwrap().len();
        assert_eq!(left, if reclaim { 0 } else { 2 }, "reclaim={reclaim}");
        h.stop().unwrap();
    }
}

#[test]
fn concurrent_clients_get_unique_addresses_with_shared_fsyncs() {
    let d = temp_dir("conc-daemon");
    let sock = d.path().join("ipamd.sock");
    let _h = start(d.path());
    let rs = Arc::new(sets("10.22.0.0/24"));
    let before = metric(&sock, "ipamd_fsyncs_total");
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let c = client(d.path());
            let rs = Arc::clone(&rs);
            std::thread::spawn(move || {
                (0..15)
                    .map(|i| {
                        c.allocate(&req("net1", &format!("t{t}-{i}"), &rs)).unwrap()[0].address
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().unwrap());
    }
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 240);
    assert_eq!(
        metric(
            &sock,
            "ipamd_requests_total{verb=\"allocate\",outcome=\"ok\"}"
        ),
        240
    );
    let fsyncs = metric(&sock, "ipamd_fsyncs_total") - before;
    assert!(fsyncs <= 240, "more fsyncs ({fsyncs}) than allocations");
    // Files agree with the daemon.
    let mut s = Store::open(&d.path().join("data"), "net1", store_opts("x")).unwrap();
    assert_eq!(s.leases().unwrap().len(), 240);
}

#[test]
fn stopping_the_daemon_under_load_loses_and_duplicates_nothing() {
    let d = temp_dir("shutdown");
    let h = start(d.path());
    let rs = Arc::new(sets("10.22.0.0/16"));
    let stop_at = Instant::now() + Duration::from_millis(150);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let c = client(d.path());
            let rs = Arc::clone(&rs);
            std::thread::spawn(move || {
                let mut got = Vec::new();
                // Keep going past the stop: later calls fall back in-process.
                for i in 0..40 {
                    let cid = format!("t{t}-{i}");
                    let a = c.allocate(&req("net1", &cid, &rs)).unwrap();
                    if i % 5 == 4 {
                        c.release(&key("net1", &cid)).unwrap();
                    } else {
                        got.push((cid, a[0].address.addr()));
                    }
                    if Instant::now() < stop_at {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                got
            })
        })
        .collect();
    std::thread::sleep(stop_at.saturating_duration_since(Instant::now()));
    h.stop().unwrap();
    let mut acked = Vec::new();
    for t in threads {
        acked.extend(t.join().unwrap());
    }
    let mut s = Store::open(&d.path().join("data"), "net1", StoreOptions::default()).unwrap();
    let leases = s.leases().unwrap();
    assert_eq!(leases.len(), acked.len());
    let held: HashSet<(String, std::net::IpAddr)> = leases
        .into_iter()
        .map(|l| (l.container_id, l.address))
        .collect();
    assert_eq!(held.len(), acked.len());
    for a in &acked {
        assert!(held.contains(a), "acknowledged lease {a:?} lost");
    }
    let addrs: HashSet<_> = held.iter().map(|(_, a)| a).collect();
    assert_eq!(addrs.len(), held.len(), "an address is held twice");
}

#[test]
fn daemon_refuses_a_client_of_another_data_dir() {
    let d = temp_dir("daemon-dirs");
    let _h = start(d.path());
    let rs = sets("10.0.0.0/24");
    // Another directory (existing or not): refused, nothing allocated anywhere.
    for other in [d.path().join("other"), d.path().join("missing")] {
        if other.ends_with("other") {
            std::fs::create_dir_all(&other).unwrap();
        }
        let c = Client::new(&d.path().join("ipamd.sock"), &other);
        let e = c.allocate(&req("net1", "c1", &rs)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.message().contains(&*other.to_string_lossy()), "{e}");
        assert!(e.message().contains("data"), "{e}");
    }
    assert!(client(d.path()).leases(None).unwrap().is_empty());
    // The same directory by another path is fine.
    let link = d.path().join("link");
    std::os::unix::fs::symlink(d.path().join("data"), &link).unwrap();
    let c = Client::new(&d.path().join("ipamd.sock"), &link);
    c.allocate(&req("net1", "c1", &rs)).unwrap();
    assert_eq!(client(d.path()).leases(None).unwrap().len(), 1);
}

#[test]
fn data_dir_header_round_trips() {
    let d = temp_dir("dir header");
    let p = d.path().join("a b%c\u{e9}");
    std::fs::create_dir_all(&p).unwrap();
    let v = crate::api::data_dir_header(&p);
    assert!(v.bytes().all(|b| b.is_ascii_graphic() || b == b' '), "{v}");
    let (id, path) = crate::api::parse_data_dir_header(v.as_bytes()).unwrap();
    assert!(id.is_some());
    assert_eq!(path, p.to_string_lossy());
    let v = crate::api::data_dir_header(&d.path().join("nope"));
    assert_eq!(
        crate::api::parse_data_dir_header(v.as_bytes()).unwrap().0,
        None
    );
    assert!(crate::api::parse_data_dir_header(b"1:x /a").is_none());
}

/// A service for the test: echoes, fails with a conflict, or declines.
struct Echo;

impl crate::service::Endpoint for String {
    const SERVICE: &'static str = "test";
    fn op(&self) -> &'static str {
        match self.as_str() {
            "hi" => "echo",
            "fail" => "fail",
            _ => "other",
        }
    }
}

impl crate::service::Service for Echo {
    type Request = String;
    type Response = String;
    type Error = String;

    fn permit(
        &self,
        peer: &crate::service::Peer,
        _: &String,
    ) -> Result<(), crate::service::Refusal<String>> {
        match peer.uid {
            0 => Ok(()),
            _ => Err(crate::service::Refusal::Failed(403, "root only".into())),
        }
    }
    fn handle(&self, req: String) -> Result<String, crate::service::Refusal<String>> {
        match req.as_str() {
            "hi" => Ok(req),
            "fail" => Err(crate::service::Refusal::Failed(409, "conflict".into())),
            _ => Err(crate::service::Refusal::Declined("not here".into())),
        }
    }
    fn malformed(message: String) -> String {
        message
    }
}

#[test]
fn service_ops_are_served_counted_and_declined_to_the_caller() {
    use crate::client::{Daemon, Failure};
    skip_unless_root!("to be served by a root-only service");
    let t = temp_dir("ext");
    let sock = t.path().join("ipamd.sock");
    let c = Daemon::new(&sock);
    // No daemon: the caller does it itself.
    assert!(c.call::<Echo>(&"hi".to_string()).is_none());
    let mut opts = daemon_opts(t.path());
    opts.services = crate::service::Services::new().with(Echo);
    let d = start_with(opts, StoreOptions::default()).unwrap();
    assert_eq!(
        c.call::<Echo>(&"hi".to_string()),
        Some(Ok("hi".to_string()))
    );
    assert_eq!(
        c.call::<Echo>(&"fail".to_string()),
        Some(Err(Failure::Service("conflict".to_string())))
    );
    assert_eq!(c.call::<Echo>(&"x".to_string()), None, "421: declined");
    let bad = c.send("POST", "/v1/ext/bad/op", &[], Some(b"\"hi\""));
    assert!(
        matches!(bad, crate::client::Outcome::Local(_)),
        "no such op: {bad:?}"
    );
    assert_eq!(
        metric(
            &sock,
            "ipamd_ext_requests_total{op=\"test.echo\",outcome=\"ok\"}"
        ),
        1
    );
    assert_eq!(
        metric(
            &sock,
            "ipamd_ext_requests_total{op=\"test.other\",outcome=\"declined\"}"
        ),
        1
    );
    d.stop().unwrap();
    // A daemon without the service declines: the caller does it itself.
    let d = start(t.path());
    assert!(c.call::<Echo>(&"hi".to_string()).is_none());
    d.stop().unwrap();
}
