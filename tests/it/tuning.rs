//! tuning: cnikit's against Debian's reference (/usr/lib/cni/tuning, 1.1.1) on the
//! same interface: the same sysctls and link settings, the same result and backup file,
//! each one's DEL restoring the other's ADD; then what the reference lacks (txQLen, the
//! allowlist, names with dots) and what must leave nothing behind.

use crate::support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// A netns whose `ifname` is one end of a veth pair (the other end up on the host), and
/// the prevResult an interface plugin would have printed for it.
fn pod_with(env: &TestEnv, ifname: &str) -> (Netns, Value) {
    let ns = env.netns();
    let (_host, peer) = env.veth_pair();
    ip(&["link", "set", &peer, "netns", &ns.name]);
    ip(&["-n", &ns.name, "link", "set", &peer, "name", ifname]);
    ip(&["-n", &ns.name, "link", "set", ifname, "up"]);
    let mac = link(Some(&ns.name), ifname).unwrap()["address"].clone();
    let prev = json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": ifname, "mac": mac, "sandbox": ns.path}],
        "ips": [{"address": "10.99.0.2/24", "interface": 0}]});
    (ns, prev)
}

fn conf(version: &str, dir: &Path, prev: &Value, extra: Value) -> Value {
    let mut c = json!({"cniVersion": version, "name": "tun", "type": "tuning",
        "dataDir": dir, "prevResult": prev});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn call(env: &TestEnv, reference: bool, verb: &str, id: &str, ns: &Netns, conf: &Value) -> Call {
    let p = if reference {
        env.ref_plugin("tuning")
    } else {
        env.plugin("tuning")
    };
    p.attach(verb, id, ns, &ifname_of(conf)).conf(conf)
}

/// The interface prevResult names, `eth0` without one.
fn ifname_of(conf: &Value) -> String {
    conf["prevResult"]["interfaces"][0]["name"]
        .as_str()
        .unwrap_or("eth0")
        .to_string()
}

fn sysctl_in(ns: &Netns, key: &str) -> String {
    // A dotted key, or a `/` one when a component has a dot of its own.
    let path = match key.contains('/') {
        true => format!("/proc/sys/{key}"),
        false => format!("/proc/sys/{}", key.replace('.', "/")),
    };
    let (ok, out, err) = sh("ip", &["netns", "exec", &ns.name, "cat", &path]);
    assert!(ok, "read {path} in {}: {err}", ns.name);
    out.trim().to_string()
}

/// What tuning may change on a link: MTU, MAC, promisc, allmulti, queue length.
fn link_state(ns: &Netns, ifname: &str) -> Value {
    let l = link(Some(&ns.name), ifname).expect("the interface");
    json!({"mtu": l["mtu"], "address": l["address"], "txqlen": l["txqlen"],
           "promisc": has_flag(&l, "PROMISC"), "allmulti": has_flag(&l, "ALLMULTI")})
}

fn backups(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    let name = e.file_name().into_string().unwrap();
                    (name, std::fs::read_to_string(e.path()).unwrap_or_default())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// One pod for the tests of our plugin alone: a netns whose `eth0` has a prevResult, a
/// backup dir, and the link as it was before any ADD.
struct Pod<'e> {
    env: &'e TestEnv,
    ns: Netns,
    prev: Value,
    dir: PathBuf,
    before: Value,
}

impl<'e> Pod<'e> {
    fn new(env: &'e TestEnv) -> Pod<'e> {
        let (ns, prev) = pod_with(env, "eth0");
        let before = link_state(&ns, "eth0");
        Pod {
            env,
            ns,
            prev,
            dir: env.dir("tun"),
            before,
        }
    }

    /// A 1.0.0 configuration with `extra`, chained after the pod's prevResult.
    fn conf(&self, extra: Value) -> Value {
        conf("1.0.0", &self.dir, &self.prev, extra)
    }

    /// Our plugin's `verb` of container `id` with `conf`.
    fn ours(&self, verb: &str, id: &str, conf: &Value) -> Call {
        call(self.env, false, verb, id, &self.ns, conf)
    }

    /// Our ADD of container `c` with the configuration `extra` makes.
    fn add(&self, extra: Value) -> Call {
        self.ours("ADD", "c", &self.conf(extra))
    }

    /// The link is as it was before any ADD, and no backup is left.
    fn assert_restored(&self, what: &str) {
        assert_eq!(
            link_state(&self.ns, "eth0"),
            self.before,
            "{what}: link put back"
        );
        assert!(backups(&self.dir).is_empty(), "{what}: a backup is left");
    }
}

/// Proves: with the same configuration (sysctls with IFNAME, mac, mtu, promisc, allmulti)
/// ours and the reference set the same sysctls and link settings, print the same result
/// (the interface's new MAC in it), write the same backup file (`<cid>_<ifname>.json`,
/// Go's indented JSON); CHECK passes for both and ours fails once the MTU is changed by
/// hand; each one's DEL restores the other's ADD (MTU, MAC, promisc, allmulti; sysctls
/// stay) and removes the backup; a second DEL succeeds.
#[test]
fn same_changes_and_restore_as_the_reference() {
    let env = TestEnv::new("tuning_vs_reference");
    let extra = json!({
        "sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1", "net.core.somaxconn": "1000"},
        "mac": "0a:58:0a:63:00:02", "mtu": 1400, "promisc": true, "allmulti": true});
    let mut sides = Vec::new();
    for reference in [true, false] {
        let (ns, prev) = pod_with(&env, "eth0");
        let dir = env.dir(if reference { "ref" } else { "ours" });
        let c = conf("1.0.0", &dir, &prev, extra.clone());
        let before = link_state(&ns, "eth0");
        let r = call(&env, reference, "ADD", "ctr-t", &ns, &c)
            .run()
            .result();
        sides.push((reference, ns, dir, c, before, r));
    }
    let norm = |v: &Value, ns: &Netns| -> Value {
        serde_json::from_str(&v.to_string().replace(&ns.path, "NETNS")).unwrap()
    };
    let (ref_side, our_side) = (&sides[0], &sides[1]);
    assert_eq!(
        norm(&our_side.5, &our_side.1),
        norm(&ref_side.5, &ref_side.1)
    );
    assert_eq!(our_side.5["interfaces"][0]["mac"], "0a:58:0a:63:00:02");
    for (_, ns, dir, c, before, _) in &sides {
        assert_eq!(
            link_state(ns, "eth0"),
            json!({"mtu": 1400, "address": "0a:58:0a:63:00:02", "txqlen": before["txqlen"],
                   "promisc": true, "allmulti": true})
        );
        assert_eq!(sysctl_in(ns, "net.ipv4.conf.eth0.arp_notify"), "1");
        assert_eq!(sysctl_in(ns, "net.core.somaxconn"), "1000");
        let files = backups(dir);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].0, "ctr-t_eth0.json");
        assert_eq!(
            files[0].1,
            format!(
                "{{\n \"mac\": {},\n \"promisc\": false,\n \"mtu\": 1500,\n \"allmulti\": false\n}}",
                before["address"]
            )
        );
        call(&env, false, "CHECK", "ctr-t", ns, c).run().ok_silent();
        // Debian's 1.1.1 CHECK does not replace IFNAME in sysctl keys: without them.
        let mut plain = c.clone();
        plain.as_object_mut().unwrap().remove("sysctl");
        call(&env, true, "CHECK", "ctr-t", ns, &plain)
            .run()
            .ok_silent();
    }
    ip(&["-n", &our_side.1.name, "link", "set", "eth0", "mtu", "1300"]);
    call(&env, false, "CHECK", "ctr-t", &our_side.1, &our_side.3)
        .run()
        .expect_err(100, &["MTU", "1300", "1400"]);
    ip(&["-n", &our_side.1.name, "link", "set", "eth0", "mtu", "1400"]);

    // Crossed: ours restores the reference's ADD and the reverse.
    for (reference, ns, dir, c, before, _) in &sides {
        for _ in 0..2 {
            call(&env, !reference, "DEL", "ctr-t", ns, c)
                .run()
                .ok_silent();
        }
        assert_eq!(&link_state(ns, "eth0"), before, "restored");
        assert!(backups(dir).is_empty(), "backup removed");
        assert_eq!(sysctl_in(ns, "net.core.somaxconn"), "1000", "sysctls stay");
    }
}

/// Proves: on the same input ours and the reference set the same MAC: Go's dashed and
/// dotted forms are taken; an empty `mac`, `runtimeConfig.mac` or `CNI_ARGS MAC=` is
/// unset and the next one in the order counts, while `args.cni.mac: ""` leaves the MAC
/// alone; `null` keys are unset. `CNI_ARGS` with a key nobody declared and no
/// IgnoreUnknown fails both (tuning reads them) and changes nothing.
#[test]
fn mac_forms_empty_values_and_cni_args_as_the_reference() {
    let env = TestEnv::new("tuning_mac_forms");
    let cases = [
        (
            json!({"mac": "", "runtimeConfig": {"mac": "0A-58-00-00-00-BB"}}),
            "IgnoreUnknown=1;MAC=",
            Some("0a:58:00:00:00:bb"),
        ),
        (
            json!({"mac": "0a58.0000.00cc"}),
            "",
            Some("0a:58:00:00:00:cc"),
        ),
        (
            json!({"runtimeConfig": {"mac": "0a:58:00:00:00:dd"}, "args": {"cni": {"mac": ""}}}),
            "",
            None,
        ),
        (
            json!({"mac": "", "sysctl": null, "mtu": null, "promisc": null}),
            "MAC=0a-58-00-00-00-ee",
            Some("0a:58:00:00:00:ee"),
        ),
    ];
    for (extra, args, want) in cases {
        for reference in [true, false] {
            let (ns, prev) = pod_with(&env, "eth0");
            let c = conf("1.0.0", &env.dir("mac"), &prev, extra.clone());
            let before = link_state(&ns, "eth0");
            let r = call(&env, reference, "ADD", "ctr-m", &ns, &c)
                .cni_args(args)
                .run()
                .result();
            let after = link_state(&ns, "eth0");
            let want = want.map_or(before["address"].clone(), |m| json!(m));
            assert_eq!(
                after["address"], want,
                "reference {reference}: {extra} {args}"
            );
            if !reference {
                // The reference reports the MAC as configured; ours as the kernel does.
                assert_eq!(r["interfaces"][0]["mac"], want, "{r}");
            }
            call(&env, false, "DEL", "ctr-m", &ns, &c).run().ok_silent();
            assert_eq!(link_state(&ns, "eth0"), before);
        }
    }
    for reference in [true, false] {
        let (ns, prev) = pod_with(&env, "eth0");
        let c = conf(
            "1.0.0",
            &env.dir("mac"),
            &prev,
            json!({"mac": "0a:58:00:00:00:ff"}),
        );
        let before = link_state(&ns, "eth0");
        let out = call(&env, reference, "ADD", "ctr-k", &ns, &c)
            .cni_args("K8S_POD_NAME=web-1")
            .run();
        assert!(!out.success(), "reference {reference}: {}", out.stdout);
        if !reference {
            out.expect_err(4, &["K8S_POD_NAME", "IgnoreUnknown"]);
        }
        assert_eq!(link_state(&ns, "eth0"), before, "reference {reference}");
    }
}

/// Proves: `txQLen`, `mtu` and `allmulti` from `args.cni` override the configuration,
/// the capability `mac` (runtimeConfig) is applied after bridge in a chain and shows in
/// the result; a repeated ADD keeps the first backup; DEL restores the queue length too;
/// a sysctl on an interface whose name has a dot (`eth0.5`) lands on that interface, and
/// CHECK compares a multi-value sysctl field by field (the kernel prints tabs).
#[test]
fn args_capability_txqlen_and_dotted_names() {
    let env = TestEnv::new("tuning_args");
    let nets = env.subnets();
    let br = env.link_name("tub");
    let bridge = json!({"cniVersion": "1.1.0", "name": "tun", "type": "bridge", "bridge": br,
        "ipam": env.ipam(Ipam::Ipamd, nets.v4_ranges())});
    let pod = env.pod("bridge", &bridge);
    let dir = env.dir("tun");
    let before = link_state(&pod.ns, "eth0");
    let c = conf(
        "1.1.0",
        &dir,
        &pod.result,
        json!({"mtu": 1400, "txQLen": 10, "allmulti": true,
               "runtimeConfig": {"mac": "0a:58:00:00:00:aa"},
               "args": {"cni": {"mtu": 1300, "txQLen": 20}}}),
    );
    let tun = pod.chained("tuning", &c);
    let r = tun.add();
    let eth0 = r["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "eth0")
        .unwrap();
    assert_eq!(eth0["mac"], "0a:58:00:00:00:aa");
    assert_eq!(
        link_state(&pod.ns, "eth0"),
        json!({"mtu": 1300, "address": "0a:58:00:00:00:aa", "txqlen": 20,
               "promisc": false, "allmulti": true})
    );
    let first = backups(&dir);
    tun.add();
    assert_eq!(
        backups(&dir),
        first,
        "a repeated ADD keeps the original values"
    );
    tun.check(&r);
    tun.del();
    assert_eq!(link_state(&pod.ns, "eth0"), before);
    assert!(backups(&dir).is_empty());

    let (ns, prev) = pod_with(&env, "eth0.5");
    let c = conf(
        "1.0.0",
        &dir,
        &prev,
        json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1",
                          "net.ipv4.ping_group_range": "0 100"}}),
    );
    call(&env, false, "ADD", "ctr-dot", &ns, &c).run().result();
    assert_eq!(sysctl_in(&ns, "net/ipv4/conf/eth0.5/arp_notify"), "1");
    assert_eq!(sysctl_in(&ns, "net.ipv4.ping_group_range"), "0\t100");
    call(&env, false, "CHECK", "ctr-dot", &ns, &c)
        .run()
        .ok_silent();
    assert!(backups(&dir).is_empty(), "sysctls alone need no backup");
}

/// Proves: what ADD refuses it refuses before changing anything (a key outside net., a
/// traversal, a key given twice, no prevResult, the plugin's own netns: 7, 7, 7, 7, 4),
/// and an ADD the kernel fails part-way (an unknown sysctl after a good one; a multicast
/// MAC after the sysctls and the backup) puts every sysctl and link setting back and
/// leaves no backup.
#[test]
fn refusals_and_failures_leave_nothing() {
    let env = TestEnv::new("tuning_failures");
    let pod = Pod::new(&env);
    let arp = || sysctl_in(&pod.ns, "net.ipv4.conf.eth0.arp_notify");
    assert_eq!(arp(), "0");
    for (extra, needle) in [
        (
            json!({"sysctl": {"kernel.hostname": "x"}}),
            "kernel.hostname",
        ),
        (json!({"sysctl": {"net/../kernel/hostname": "x"}}), ".."),
        (json!({"mtu": 20}), "mtu"),
    ] {
        pod.add(extra).run().expect_err(7, &[needle]);
    }
    let dup = format!(
        r#"{{"cniVersion":"1.0.0","name":"tun","type":"tuning","dataDir":{},"prevResult":{},
            "sysctl":{{"net.core.somaxconn":"1","net.core.somaxconn":"2"}}}}"#,
        json!(pod.dir),
        pod.prev
    );
    env.plugin("tuning")
        .attach("ADD", "c", &pod.ns, "eth0")
        .stdin(dup)
        .run()
        .expect_err(7, &["twice"]);
    let mut no_prev = pod.conf(json!({"mtu": 1400}));
    no_prev.as_object_mut().unwrap().remove("prevResult");
    pod.ours("ADD", "c", &no_prev)
        .run()
        .expect_err(7, &["prevResult"]);
    pod.add(json!({"mtu": 1400}))
        .netns_path("/proc/self/ns/net")
        .run()
        .expect_err(4, &["own network namespace"]);

    let unknown = json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1",
                                    "net.ipv4.no_such_setting": "1"}, "mtu": 1400});
    pod.add(unknown)
        .run()
        .expect_err(100, &["net.ipv4.no_such_setting"]);
    let multicast = json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1"},
                           "mtu": 1400, "promisc": true, "mac": "01:00:5e:00:00:01"});
    pod.add(multicast)
        .run()
        .expect_err(100, &["01:00:5e:00:00:01"]);
    assert_eq!(arp(), "0", "sysctls put back");
    pod.assert_restored("the failed ADDs");
}

/// Proves: DEL never fails: with a configuration ADD would refuse it still restores
/// from the backup; with the netns gone it drops the backup; with no backup, or none of
/// anything, it succeeds silently.
#[test]
fn del_never_fails() {
    let env = TestEnv::new("tuning_del");
    let pod = Pod::new(&env);
    let c = pod.conf(json!({"mtu": 1400}));
    pod.ours("ADD", "c1", &c).run().result();
    let broken = pod.conf(json!({"mtu": "big", "sysctl": {"kernel.x": 1}, "mac": 7}));
    pod.ours("DEL", "c1", &broken).run().ok_silent();
    assert_eq!(link_state(&pod.ns, "eth0"), pod.before);

    pod.ours("ADD", "c2", &c).run().result();
    assert_eq!(backups(&pod.dir).len(), 1);
    env.del_netns(&pod.ns);
    pod.ours("DEL", "c2", &c).run().ok_silent();
    assert!(
        backups(&pod.dir).is_empty(),
        "the backup of a gone pod is dropped"
    );
    pod.ours("DEL", "c3", &c).netns_path("").run().ok_silent();
    let missing = PathBuf::from("/nonexistent/tuning");
    let nowhere = conf("1.0.0", &missing, &pod.prev, json!({}));
    pod.ours("DEL", "c4", &nowhere).run().ok_silent();
    assert!(!missing.exists());
}

/// Proves: with /etc/cni/tuning/allowlist.conf present (in a private mount namespace of
/// the plugin process) a sysctl no line matches is refused (7) and one that matches is
/// written, as with the reference (upstream; Debian's 1.1.1 has no allowlist).
#[test]
fn sysctl_allowlist() {
    let env = TestEnv::new("tuning_allowlist");
    let pod = Pod::new(&env);
    let wrapper = env.tmp.join("tuning-with-allowlist");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare --mount --propagation private -- sh -c \
             'mount -t tmpfs tmpfs /etc && mkdir -p /etc/cni/tuning && \
             printf \"%s\\n\" \"$ALLOW\" > /etc/cni/tuning/allowlist.conf && exec \"$0\"' {}\n",
            env.bin.join("tuning").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |key: &str, value: &str| {
        let c = pod.conf(json!({"sysctl": {key: value}}));
        Call::new(wrapper.clone())
            .env("ALLOW", "^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]+$")
            .attach("ADD", "c", &pod.ns, "eth0")
            .conf(&c)
            .run()
    };
    run("net.ipv4.conf.IFNAME.arp_notify", "1").result();
    assert_eq!(sysctl_in(&pod.ns, "net.ipv4.conf.eth0.arp_notify"), "1");
    // A new netns starts with the host's ip_forward (1 on any node that forwards):
    // ask for the other value, and expect the one it had.
    let before = sysctl_in(&pod.ns, "net.ipv4.ip_forward");
    let other = if before == "1" { "0" } else { "1" };
    run("net.ipv4.ip_forward", other).expect_err(7, &["not allowed", "net.ipv4.ip_forward"]);
    assert_eq!(sysctl_in(&pod.ns, "net.ipv4.ip_forward"), before);
}

/// Proves: a `dataDir` under `/var/run`, Debian's link to `/run` (root's, in a directory
/// only root may write), works as with the reference: the backup lands under `/run` and
/// DEL restores from it. (Links anyone else could have made are still refused.)
#[test]
fn data_dir_through_var_run() {
    if !std::fs::read_link("/var/run").is_ok_and(|t| t == Path::new("/run")) {
        eprintln!("skipping: /var/run is not a link to /run here");
        return;
    }
    let env = TestEnv::new("tuning_var_run");
    let (ns, prev) = pod_with(&env, "eth0");
    // Under /run/cnikit, the test host's own tmpfs.
    let dir = |top: &str| PathBuf::from(format!("{top}/cnikit/tuning-{}", std::process::id()));
    let before = link_state(&ns, "eth0");
    let c = conf("1.0.0", &dir("/var/run"), &prev, json!({"mtu": 1280}));
    let run = |verb: &str| call(&env, false, verb, "ctr-var-run", &ns, &c).run();
    run("ADD").result();
    assert_eq!(link_state(&ns, "eth0")["mtu"], 1280);
    assert_eq!(backups(&dir("/run")).len(), 1, "the backup is under /run");
    run("DEL").ok_silent();
    assert_eq!(link_state(&ns, "eth0"), before);
    assert!(backups(&dir("/run")).is_empty());
}
