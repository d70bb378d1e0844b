use super::host::firewall_networks;
use super::leases::judge;
use super::*;
use crate::firewall::inspect::Tables;
use ipamd::api::LeaseInfo;
use std::collections::BTreeMap;

fn statuses(checks: &[Check]) -> Vec<(String, Status)> {
    checks.iter().map(|c| (c.check.clone(), c.status)).collect()
}

fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.check == name)
        .unwrap_or_else(|| panic!("no check {name}: {checks:?}"))
}

/// A bin dir where every plugin name links to `me`.
fn good_bin(dir: &Path, me: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    for name in plugins::NAMES {
        std::os::unix::fs::symlink(me, bin.join(name)).unwrap();
    }
    bin
}

fn fake_me(dir: &Path) -> PathBuf {
    let me = dir.join("cnikit");
    std::fs::write(&me, b"\x7fELF the binary").unwrap();
    std::fs::set_permissions(&me, std::fs::Permissions::from_mode(0o755)).unwrap();
    me.canonicalize().unwrap()
}

#[test]
fn links_ok_copy_ok_elsewhere_missing_and_foreign_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let me = fake_me(tmp.path());
    let bin = good_bin(tmp.path(), &me);
    assert!(links_to(&bin, &me).iter().all(|c| c.status == Status::Ok));

    let other = tmp.path().join("other");
    std::fs::write(&other, b"someone else").unwrap();
    std::fs::remove_file(bin.join("bridge")).unwrap();
    std::os::unix::fs::symlink(&other, bin.join("bridge")).unwrap();
    std::fs::remove_file(bin.join("macvlan")).unwrap();
    std::fs::remove_file(bin.join("portmap")).unwrap();
    std::fs::copy(&me, bin.join("portmap")).unwrap();
    std::fs::remove_file(bin.join("ipvlan")).unwrap();
    std::fs::write(bin.join("ipvlan"), b"a different program").unwrap();

    let checks = links_to(&bin, &me);
    let bridge = find(&checks, "link bridge");
    assert_eq!(bridge.status, Status::Fail);
    assert!(bridge.message.contains("points at"), "{bridge:?}");
    assert!(
        bridge.fix.as_deref().unwrap().contains("--force"),
        "{bridge:?}"
    );
    let macvlan = find(&checks, "link macvlan");
    assert_eq!(macvlan.status, Status::Fail);
    assert!(macvlan.message.contains("missing"), "{macvlan:?}");
    assert_eq!(find(&checks, "link portmap").status, Status::Ok);
    assert_eq!(find(&checks, "link ipvlan").status, Status::Fail);
    assert_eq!(find(&checks, "link ipamd").status, Status::Ok);
}

#[test]
fn a_missing_bin_dir_is_one_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let checks = links_to(&tmp.path().join("nope"), &fake_me(tmp.path()));
    assert_eq!(statuses(&checks), [("links".to_string(), Status::Fail)]);
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn conflists_parse_and_name_only_plugins_present() {
    let tmp = tempfile::tempdir().unwrap();
    let me = fake_me(tmp.path());
    let bin = good_bin(tmp.path(), &me);
    let conf = tmp.path().join("net.d");
    std::fs::create_dir(&conf).unwrap();
    write(
        &conf,
        "10-pods.conflist",
        r#"{"cniVersion": "1.0.0", "name": "pods", "plugins": [
            {"type": "bridge", "IPMasq": true, "IPAM": {"Type": "ipamd"}},
            {"type": "portmap"}]}"#,
    );
    write(
        &conf,
        "20-odd.conflist",
        r#"{"cniVersion": "1.0.0", "name": "odd", "plugins": [
            {"type": "bridge", "ipam": {"type": "whereabouts"}}, {"type": "win-bridge"}]}"#,
    );
    write(&conf, "30-broken.conflist", "{ not json");
    write(
        &conf,
        "40-dup.conflist",
        r#"{"cniVersion": "1.0.0", "name": "pods", "plugins": [{"type": "loopback"}]}"#,
    );
    let (checks, lists) = conf_dir(&conf, &bin);
    assert_eq!(
        statuses(&checks),
        [
            ("conf 10-pods.conflist".to_string(), Status::Ok),
            ("conf 20-odd.conflist".to_string(), Status::Fail),
            ("conf 30-broken.conflist".to_string(), Status::Fail),
            ("conf 40-dup.conflist".to_string(), Status::Warn),
        ]
    );
    let odd = find(&checks, "conf 20-odd.conflist");
    assert!(odd.message.contains("whereabouts, win-bridge"), "{odd:?}");
    assert!(
        odd.fix.as_deref().unwrap().contains("not part of cnikit"),
        "{odd:?}"
    );
    assert_eq!(lists.len(), 2);
    assert_eq!(plugin_types(&lists[0]), ["bridge", "ipamd", "portmap"]);
    assert_eq!(firewall_networks(&lists), ["pods"]);
}

#[test]
fn a_missing_conf_dir_fails_and_an_empty_one_warns() {
    let tmp = tempfile::tempdir().unwrap();
    let (checks, _) = conf_dir(&tmp.path().join("nope"), tmp.path());
    assert_eq!(statuses(&checks), [("conf dir".to_string(), Status::Fail)]);
    let (checks, _) = conf_dir(tmp.path(), tmp.path());
    assert_eq!(statuses(&checks), [("conf dir".to_string(), Status::Warn)]);
}

fn lease(network: &str, addr: &str, boot: &str) -> LeaseInfo {
    LeaseInfo {
        network: network.into(),
        address: addr.parse().unwrap(),
        container_id: "c".into(),
        ifname: "eth0".into(),
        boot_id: boot.into(),
        created_unix: 0,
    }
}

#[test]
fn leases_of_earlier_boots_warn_per_network() {
    let all = [
        lease("a", "10.0.0.2", "now"),
        lease("a", "10.0.0.3", "before"),
        lease("b", "10.1.0.2", "now"),
        lease("b", "10.1.0.3", ""),
    ];
    let (checks, live) = judge(&all, "now", false, "/d");
    assert_eq!(
        statuses(&checks),
        [
            ("leases a".to_string(), Status::Warn),
            ("leases b".to_string(), Status::Ok),
        ]
    );
    assert!(checks[0].message.contains("10.0.0.3"), "{checks:?}");
    assert_eq!(live.get("a"), Some(&1));
    assert_eq!(live.get("b"), Some(&2));
    let (checks, _) = judge(&[], "now", false, "/d");
    assert_eq!(statuses(&checks), [("leases".to_string(), Status::Ok)]);
}

fn list(name: &str, plugins: &str) -> ConfList {
    let text = format!(r#"{{"cniVersion": "1.0.0", "name": "{name}", "plugins": {plugins}}}"#);
    ConfList::from_list_bytes(text.as_bytes(), Path::new("/x")).unwrap()
}

#[test]
fn nftables_table_needed_only_by_masquerade_or_portmap() {
    let plain = [list("p", r#"[{"type": "bridge"}]"#)];
    let never = || -> crate::firewall::Result<Tables> { panic!("must not read nftables") };
    assert_eq!(nftables(&plain, &BTreeMap::new(), never).status, Status::Ok);

    let pods = [list("pods", r#"[{"type": "bridge"}, {"type": "portmap"}]"#)];
    let present = || {
        Ok(Tables {
            inet: true,
            bridge: false,
        })
    };
    let absent = || {
        Ok(Tables {
            inet: false,
            bridge: false,
        })
    };
    assert_eq!(
        nftables(&pods, &BTreeMap::new(), present).status,
        Status::Ok
    );
    assert_eq!(
        nftables(&pods, &BTreeMap::new(), absent).status,
        Status::Warn
    );
    let running = BTreeMap::from([("pods".to_string(), 3)]);
    let c = nftables(&pods, &running, absent);
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.message.contains("pods"), "{c:?}");
}
