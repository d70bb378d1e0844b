//! Our result next to the reference's for the same server: Debian's containernetworking
//! plugins (1.1.1) — its macvlan, its `dhcp` plugin and its daemon — and ours, on one LAN.

use super::*;
use std::os::unix::net::UnixStream;

/// The reference's `dhcp`, when it is the Go one (not cnikit installed over it): the
/// reason it cannot be used otherwise.
fn reference_dhcp() -> Result<PathBuf, String> {
    let path = Path::new(REF_DIR).join("dhcp");
    let out = Command::new(&path)
        .arg("--help")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if text.contains("CNI dhcp plugin") {
        Ok(path)
    } else {
        Err(format!(
            "{} is not the reference's dhcp (cnikit diverted it?): {text}",
            path.display()
        ))
    }
}

/// The reference daemon, killed on drop.
struct RefDaemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl RefDaemon {
    fn start(env: &TestEnv, exe: &Path) -> RefDaemon {
        let dir = env.dir("ref-dhcp");
        let (socket, log) = (dir.join("dhcp.sock"), dir.join("daemon.log"));
        let out = std::fs::File::create(&log).expect("create the reference daemon's log");
        let child = Command::new(exe)
            .arg("daemon")
            .arg("-socketpath")
            .arg(&socket)
            .args(["-timeout", "2s", "-resendmax", "4s"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("start the reference dhcp daemon");
        let d = RefDaemon { child, socket, log };
        wait_until(
            "the reference daemon listens",
            Duration::from_secs(10),
            || UnixStream::connect(&d.socket).is_ok(),
            || std::fs::read_to_string(&d.log).unwrap_or_default(),
        );
        d
    }
}

impl Drop for RefDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("reference dhcp daemon log:\n{log}");
        }
    }
}

/// What must match: per address its prefix length, gateway and interface index; the
/// routes; the number of interfaces.
fn shape(r: &Value) -> Value {
    let ips: Vec<Value> = r["ips"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|ip| {
            let addr = ip["address"].as_str().unwrap_or_default();
            json!({
                "v4": !addr.contains(':'),
                "prefix": addr.split('/').nth(1),
                "gateway": ip["gateway"],
                "interface": ip["interface"],
            })
        })
        .collect();
    json!({
        "ips": ips,
        "routes": r["routes"],
        "interfaces": r["interfaces"].as_array().map(Vec::len),
    })
}

/// Proves: for the same dnsmasq, our macvlan+dhcp result has the reference's shape
/// (one IPv4 /24 with the server as gateway, the same routes, one interface). DNS is
/// ours only (documented): the reference returns none.
#[test]
fn result_has_the_shape_of_the_references() {
    let exe = match reference_dhcp() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let lan = Lan::with_dnsmasq("dhcp_reference", &[]);
    let env = &lan.env;
    let ours = DhcpDaemon::start(env);
    let theirs = RefDaemon::start(env, &exe);

    let conf = macvlan_conf("1.0.0", &lan.master, &ours.socket);
    let pod = env.new_attachment("macvlan", "ours", &conf);
    let started = Instant::now();
    let r = pod.add();
    let our_time = started.elapsed();
    assert_leased(&r, &pod.ns);

    let ref_conf = macvlan_conf("1.0.0", &lan.master, &theirs.socket);
    let ref_pod = env.new_attachment("macvlan", "ref", &ref_conf);
    let call = |verb: &str| {
        env.ref_plugin("macvlan")
            .attach(verb, &ref_pod.id, &ref_pod.ns, "eth0")
            .conf(&ref_conf)
    };
    let started = Instant::now();
    let rr = call("ADD").run().result();
    let ref_time = started.elapsed();
    println!("dhcp reference: ADD took {our_time:?} (ours), {ref_time:?} (reference)");
    println!("ours: {r}\nreference: {rr}");
    assert_leased(&rr, &ref_pod.ns);
    assert_eq!(shape(&r), shape(&rr));
    assert_eq!(r["dns"]["nameservers"], json!(DNS), "{r}");
    assert!(
        rr.get("dns").is_none_or(|d| d.get("nameservers").is_none()),
        "the reference returns no DNS: {rr}"
    );
    assert_eq!(lan.dnsmasq_lease(&ref_pod.id), Some(result_v4(&rr).1));

    pod.del();
    lan.wait_dnsmasq_forgets(&pod.id, Duration::from_secs(5));
    call("DEL").run().ok();
}
