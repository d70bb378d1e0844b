//! STATUS and GC (1.1.0), and callers the daemon must not serve: only root with
//! CAP_NET_ADMIN in the daemon's network namespace may have it acquire or release.

use super::*;

fn run_verb(env: &TestEnv, verb: &str, conf: &Value) -> Outcome {
    env.plugin("macvlan").command(verb).conf(conf).run()
}

/// Proves: STATUS passes while the daemon answers, and fails with code 50 naming the
/// socket when none does (no daemon there, or the daemon killed).
#[test]
fn status_is_ok_with_the_daemon_and_50_without() {
    let lan = Lan::new("dhcp_status");
    let env = &lan.env;
    let mut daemon = DhcpDaemon::start(env);
    let conf = macvlan_conf("1.1.0", &lan.master, &daemon.socket);
    run_verb(env, "STATUS", &conf).ok_silent();
    let elsewhere = env.dir("no-daemon").join("dhcp.sock");
    let none = macvlan_conf("1.1.0", &lan.master, &elsewhere);
    let e = run_verb(env, "STATUS", &none).expect_err(
        50,
        &[
            "no DHCP daemon answers at",
            &elsewhere.display().to_string(),
        ],
    );
    println!("dhcp STATUS without daemon: {}", e.msg);
    daemon.kill();
    run_verb(env, "STATUS", &conf).expect_err(50, &["no DHCP daemon answers"]);
}

/// Proves: GC with `cni.dev/valid-attachments` listing one of two pods releases the other
/// pod's lease only (dnsmasq drops it, its record goes), and GC of another network
/// releases nothing.
#[test]
fn gc_releases_only_the_lease_of_the_pod_not_listed() {
    let lan = Lan::with_dnsmasq("dhcp_gc", &[]);
    let env = &lan.env;
    let daemon = DhcpDaemon::start(env);
    let conf = macvlan_conf("1.1.0", &lan.master, &daemon.socket);
    let keep = env.new_attachment("macvlan", "keep", &conf);
    let stale = env.new_attachment("macvlan", "stale", &conf);
    let kept = keep.add();
    let keep_addr = assert_leased(&kept, &keep.ns);
    let stale_addr = assert_leased(&stale.add(), &stale.ns);
    assert_eq!(daemon.records().len(), 2);

    let mut other = conf.clone();
    other["name"] = json!("othernet");
    other["cni.dev/valid-attachments"] = json!([]);
    run_verb(env, "GC", &other).ok_silent();
    assert_eq!(daemon.records().len(), 2, "GC of another network");

    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": keep.id, "ifname": "eth0"}]);
    run_verb(env, "GC", &gc).ok_silent();
    lan.wait_dnsmasq_forgets(&stale.id, Duration::from_secs(5));
    assert!(
        lan.server_log()
            .contains(&format!("DHCPRELEASE({}) {stale_addr}", lan.server_if)),
        "{}",
        lan.server_log()
    );
    assert_eq!(lan.dnsmasq_lease(&keep.id), Some(keep_addr));
    assert_eq!(daemon.records().len(), 1);
    keep.check(&kept);
    stale.del();
    keep.del();
    lan.wait_dnsmasq_forgets(&keep.id, Duration::from_secs(5));
    daemon.assert_no_records();
}

/// A script running the `dhcp` plugin through `prefix` (setpriv, unshare).
fn wrapped_dhcp(env: &TestEnv, tag: &str, prefix: &[&str]) -> Call {
    let script = env.dir("wrapper").join(format!("dhcp-{tag}"));
    let text = format!(
        "#!/bin/sh\nexec {} '{}' \"$@\"\n",
        prefix.join(" "),
        env.bin_dir().join("dhcp").display()
    );
    std::fs::write(&script, text).expect("write the wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    Call::new(script).env("CNI_PATH", &env.bin_dir().display().to_string())
}

/// The call failed with the daemon's refusal and its reason (the code, 999 today, is
/// printed, not pinned).
fn refused(out: &Outcome, what: &str, why: &str) -> CniError {
    let e = out.err();
    assert!(e.msg.contains(what) && e.msg.contains(why), "{e:?}");
    e
}

const CAPLESS_ROOT: &[&str] = &["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"];
const OTHER_NETNS: &[&str] = &["unshare", "--net", "--"];

/// Proves: root without capabilities, and root in another network namespace, can have
/// the daemon neither acquire a lease (ADD), nor release (DEL) or collect (GC) a pod's:
/// the plugin fails with the daemon's "refused" and why; the server and the records show
/// nothing done. An unprivileged user (nobody) cannot reach the daemon's socket at all.
#[test]
fn callers_without_the_power_are_refused() {
    let lan = Lan::with_dnsmasq("dhcp_refused", &[]);
    let env = &lan.env;
    let daemon = DhcpDaemon::start(env);
    let conf = macvlan_conf("1.1.0", &lan.master, &daemon.socket);
    let pod = env.new_attachment("macvlan", "root", &conf);
    let addr = assert_leased(&pod.add(), &pod.ns);

    // A pod interface made by hand, for ADDs that must not acquire anything.
    let ns = env.netns();
    let mv = env.link_name("dmv");
    ip(&[
        "link",
        "add",
        "link",
        &lan.master,
        "name",
        &mv,
        "type",
        "macvlan",
    ]);
    ip(&["link", "set", &mv, "netns", &ns.name]);
    ip(&["-n", &ns.name, "link", "set", &mv, "name", "eth0"]);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);

    for (tag, prefix, why) in [
        ("capless", CAPLESS_ROOT, "not root with CAP_NET_ADMIN"),
        (
            "netns",
            OTHER_NETNS,
            "not in the daemon's network namespace",
        ),
    ] {
        let id = format!("ctr-{tag}");
        let add = wrapped_dhcp(env, tag, prefix)
            .attach("ADD", &id, &ns, "eth0")
            .conf(&conf)
            .run();
        let e = refused(&add, "dhcp.acquire refused", why);
        println!("dhcp {tag} ADD: code {} {}", e.code, e.msg);
        assert_eq!(lan.dnsmasq_lease(&id), None, "{}", lan.server_log());
        let del = wrapped_dhcp(env, tag, prefix)
            .attach("DEL", &pod.id, &pod.ns, "eth0")
            .conf(&conf)
            .run();
        let e = refused(&del, "dhcp.release refused", why);
        println!("dhcp {tag} DEL: code {} {}", e.code, e.msg);
        let gc_out = wrapped_dhcp(env, tag, prefix).command("GC").conf(&gc).run();
        refused(&gc_out, "dhcp.gc refused", why);
        assert_eq!(lan.dnsmasq_lease(&pod.id), Some(addr.clone()));
        assert_eq!(daemon.records().len(), 1);
    }

    // nobody: the socket (mode 0600, root's) does not let it connect.
    let add = wrapped_dhcp(env, "nobody", &[&["setpriv"], &SETPRIV_NOBODY[..]].concat())
        .attach("ADD", "ctr-nobody", &ns, "eth0")
        .conf(&conf)
        .run();
    let e = add.err();
    println!("dhcp nobody ADD: code {} {}", e.code, e.msg);
    assert!(e.msg.contains("Permission denied"), "{e:?}");
    assert_eq!(lan.dnsmasq_lease("ctr-nobody"), None);
    let del = wrapped_dhcp(
        env,
        "nobody2",
        &[&["setpriv"], &SETPRIV_NOBODY[..]].concat(),
    )
    .attach("DEL", &pod.id, &pod.ns, "eth0")
    .conf(&conf)
    .run();
    let e = del.err();
    println!("dhcp nobody DEL: code {} {}", e.code, e.msg);
    assert_eq!(lan.dnsmasq_lease(&pod.id), Some(addr));
    assert_eq!(daemon.records().len(), 1);

    pod.del();
    lan.wait_dnsmasq_forgets(&pod.id, Duration::from_secs(5));
    daemon.assert_no_records();
}
