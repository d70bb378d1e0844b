//! The runtime without a kernel: fake plugins (shell scripts) that log their
//! environment and stdin, so ordering, config derivation, caching and
//! rollback are checked exactly.

use super::cache::{base64_decode, base64_encode, Cache, Entry};
use super::conf::{load_by_name, pick_version, ConfList};
use super::derive::{request_config, Inject};
use super::{Attachment, Error, Gone, Runtime};
use crate::cni::Attachment as Key;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use tempfile::{tempdir, TempDir};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

// ------------------------------------------------------------ versions

#[test]
fn picks_highest_known_version() {
    let p = Path::new("x");
    let pick = |v: Value| pick_version(&obj(v), p);
    assert_eq!(pick(json!({"cniVersion": "0.4.0"})).unwrap(), "0.4.0");
    assert_eq!(
        pick(json!({"cniVersion": "0.4.0", "cniVersions": ["1.0.0", "0.3.1"]})).unwrap(),
        "1.0.0"
    );
    // A future version beside one we speak: the one we speak.
    assert_eq!(
        pick(json!({"cniVersions": ["9.0.0", "1.1.0"]})).unwrap(),
        "1.1.0"
    );
    assert_eq!(pick(json!({})).unwrap(), "");
    assert!(pick(json!({"cniVersion": "9.9.9"})).is_err());
    assert!(pick(json!({"cniVersions": "1.0.0"})).is_err());
}

// ------------------------------------------------------------ derivation

#[test]
fn request_config_follows_section_3() {
    let plugin = obj(json!({
        "type": "portmap",
        "name": "ignored",
        "cniVersion": "0.1.0",
        "capabilities": {"portMappings": true, "bandwidth": false, "ips": true},
        "snat": true,
        "x-vendor": {"keep": [1, 2]}
    }));
    let caps = obj(json!({
        "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 1},
        "mac": "00:11:22:33:44:55"
    }));
    let prev = json!({"cniVersion": "1.0.0", "ips": []});
    let out = request_config(
        &plugin,
        &Inject {
            name: "net1",
            version: "1.0.0",
            cap_args: Some(&caps),
            prev_result: Some(&prev),
            valid_attachments: None,
        },
    );
    assert_eq!(
        Value::Object(out),
        json!({
            "cniVersion": "1.0.0",
            "name": "net1",
            "type": "portmap",
            "snat": true,
            "x-vendor": {"keep": [1, 2]},
            // Only declared-and-true capabilities that have an argument.
            "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},
            "prevResult": {"cniVersion": "1.0.0", "ips": []}
        })
    );
}

#[test]
fn no_runtime_config_without_matching_args() {
    let plugin = obj(json!({"type": "bridge", "capabilities": {"mac": true}}));
    let out = request_config(
        &plugin,
        &Inject {
            name: "n",
            version: "1.1.0",
            cap_args: Some(&Map::new()),
            ..Inject::default()
        },
    );
    assert!(!out.contains_key("runtimeConfig") && !out.contains_key("capabilities"));
    assert!(!out.contains_key("prevResult"));
}

// ------------------------------------------------------------ loading

fn write(dir: &Path, name: &str, v: &Value) {
    std::fs::write(dir.join(name), serde_json::to_vec(v).unwrap()).unwrap();
}

#[test]
fn loads_conflist_then_legacy_by_name() {
    let s = tempdir().unwrap();
    write(
        s.path(),
        "10-a.conflist",
        &json!({"cniVersion": "1.0.0", "name": "a", "plugins": [{"type": "bridge"}]}),
    );
    write(
        s.path(),
        "20-a.conflist",
        &json!({"cniVersion": "0.4.0", "name": "a", "plugins": [{"type": "macvlan"}]}),
    );
    write(
        s.path(),
        "30-b.conf",
        &json!({"cniVersion": "0.3.1", "name": "b", "type": "ipvlan", "master": "x"}),
    );
    std::fs::write(s.path().join("40-c.conflist"), "{broken").unwrap();
    let a = load_by_name(s.path(), "a").unwrap();
    assert_eq!((a.version.as_str(), a.plugin_type(0)), ("1.0.0", "bridge"));
    let b = load_by_name(s.path(), "b").unwrap();
    assert_eq!(b.plugins.len(), 1);
    assert_eq!((b.version.as_str(), b.plugin_type(0)), ("0.3.1", "ipvlan"));
    assert_eq!(b.plugins[0]["master"], "x");
    let list: Value = serde_json::from_slice(&b.bytes).unwrap();
    assert_eq!(list["plugins"][0]["type"], "ipvlan");
    let e = load_by_name(s.path(), "c").unwrap_err().to_string();
    assert!(e.contains("40-c.conflist") && e.contains("\"c\""), "{e}");
}

#[test]
fn rejects_bad_lists() {
    let p = Path::new("t");
    for bad in [
        json!({"name": "n", "plugins": []}),
        json!({"name": "n"}),
        json!({"plugins": [{"type": "bridge"}]}),
        json!({"name": "-n", "plugins": [{"type": "bridge"}]}),
        json!({"name": "n", "plugins": [{"type": "../x"}]}),
        json!({"name": "n", "plugins": [{"type": "b"}], "disableCheck": 3}),
    ] {
        let bytes = serde_json::to_vec(&bad).unwrap();
        assert!(ConfList::from_list_bytes(&bytes, p).is_err(), "{bad}");
    }
    let ok =
        json!({"name": "n", "plugins": [{"type": "b"}], "disableCheck": "true", "disableGC": true});
    let l = ConfList::from_list_bytes(&serde_json::to_vec(&ok).unwrap(), p).unwrap();
    assert!(l.disable_check && l.disable_gc);
}

// ------------------------------------------------------------ cache

#[test]
fn base64_matches_go() {
    for (plain, enc) in [
        ("", ""),
        ("h", "aA=="),
        ("he", "aGU="),
        ("hello", "aGVsbG8="),
        ("{\"a\":1}", "eyJhIjoxfQ=="),
    ] {
        assert_eq!(base64_encode(plain.as_bytes()), enc);
        assert_eq!(base64_decode(enc).unwrap(), plain.as_bytes());
    }
    assert!(base64_decode("a*b=").is_none());
}

#[test]
fn cache_uses_libcni_layout() {
    let s = tempdir().unwrap();
    let cache = Cache {
        dir: s.path().join("results"),
    };
    let mut e = Entry::new(&Key::new("net1", "ctr1", "eth0"));
    e.config = b"{\"name\":\"net1\"}".to_vec();
    e.netns = "/run/netns/x".into();
    e.cni_args = vec![("IP".into(), "10.0.0.5".into())];
    e.result = Some(json!({"cniVersion": "1.0.0"}));
    cache.save(&e).unwrap();
    let raw: Value =
        serde_json::from_slice(&std::fs::read(s.path().join("results/net1-ctr1-eth0")).unwrap())
            .unwrap();
    assert_eq!(raw["kind"], "cniCacheV1");
    assert_eq!(raw["containerId"], "ctr1");
    assert_eq!(raw["ifName"], "eth0");
    assert_eq!(raw["networkName"], "net1");
    assert_eq!(raw["config"], "eyJuYW1lIjoibmV0MSJ9");
    assert_eq!(raw["cniArgs"], json!([["IP", "10.0.0.5"]]));
    assert!(raw.get("capabilityArgs").is_none());
    assert_eq!(
        cache.load(&Key::new("net1", "ctr1", "eth0")).unwrap(),
        Some(e.clone())
    );
    assert_eq!(cache.list("net1").unwrap(), vec![e]);
    assert!(cache.list("net").unwrap().is_empty());
    cache.remove(&Key::new("net1", "ctr1", "eth0")).unwrap();
    cache.remove(&Key::new("net1", "ctr1", "eth0")).unwrap();
    assert_eq!(cache.load(&Key::new("net1", "ctr1", "eth0")).unwrap(), None);
}

// ------------------------------------------------------------ fake plugins

/// A plugin that logs `COMMAND type` to `log`, keeps its stdin as
/// `<n>.in`, and prints `reply` (ADD) or fails with an error object when its
/// config has `"fail": "<COMMAND>"`.
fn fake_plugin(bin: &Path, ty: &str, log: &Path, reply: &Value) {
    let script = format!(
        r#"#!/bin/sh
n=$(wc -l < '{log}')
cat > '{dir}'/$n.in
echo "$CNI_COMMAND {ty} $CNI_CONTAINERID $CNI_IFNAME $CNI_NETNS $CNI_ARGS" >> '{log}'
if grep -q "\"fail\":\"$CNI_COMMAND\"" '{dir}'/$n.in; then
  echo '{{"cniVersion":"1.0.0","code":7,"msg":"{ty} says no","details":"on purpose"}}'
  exit 1
fi
[ "$CNI_COMMAND" = ADD ] && echo '{reply}'
exit 0
"#,
        log = log.display(),
        dir = log.parent().unwrap().display(),
        reply = reply,
    );
    let path = bin.join(ty);
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

struct Fake {
    s: TempDir,
    log: PathBuf,
    rt: Runtime,
}

impl Fake {
    fn new() -> Fake {
        let s = tempdir().unwrap();
        let bin = s.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let log = s.path().join("log");
        std::fs::write(&log, "").unwrap();
        fake_plugin(
            &bin,
            "one",
            &log,
            &json!({"cniVersion": "1.0.0", "ips": [{"address": "10.9.0.2/24"}], "dns": {}}),
        );
        fake_plugin(
            &bin,
            "two",
            &log,
            &json!({"cniVersion": "1.0.0", "ips": [{"address": "10.9.0.2/24"}], "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}),
        );
        let mut rt = Runtime::new(vec![s.path().join("nowhere"), bin], s.path().join("cache"));
        rt.forward_stderr = false;
        Fake { s, log, rt }
    }

    fn list(&self, version: &str, extra: Value) -> ConfList {
        let mut two = json!({"type": "two", "capabilities": {"portMappings": true}});
        for (k, v) in extra.as_object().unwrap() {
            two[k] = v.clone();
        }
        let v = json!({"cniVersion": version, "name": "fnet", "plugins": [{"type": "one", "k": 1}, two]});
        ConfList::from_list_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("fake")).unwrap()
    }

    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The cache entry of the attachment every test uses.
    fn cached(&self) -> Option<Entry> {
        self.rt.cache.load(&Key::new("fnet", "c1", "eth0")).unwrap()
    }

    fn stdin(&self, n: usize) -> Value {
        serde_json::from_slice(&std::fs::read(self.s.path().join(format!("{n}.in"))).unwrap())
            .unwrap()
    }
}

fn att() -> Attachment {
    Attachment {
        container_id: "c1".into(),
        netns: "/run/netns/fake".into(),
        ifname: "eth0".into(),
        args: vec![
            ("IgnoreUnknown".into(), "1".into()),
            ("K".into(), "V".into()),
        ],
        cap_args: obj(json!({"portMappings": [{"hostPort": 1}], "other": 1})),
    }
}

#[test]
fn add_chains_and_caches_del_reverses() {
    let f = Fake::new();
    let list = f.list("1.0.0", json!({}));
    let result = f.rt.add(&list, &att()).unwrap();
    assert_eq!(result["routes"][0]["dst"], "0.0.0.0/0");
    assert_eq!(
        f.log(),
        [
            "ADD one c1 eth0 /run/netns/fake IgnoreUnknown=1;K=V",
            "ADD two c1 eth0 /run/netns/fake IgnoreUnknown=1;K=V"
        ]
    );
    let first = f.stdin(0);
    assert_eq!(
        first,
        json!({"cniVersion": "1.0.0", "name": "fnet", "type": "one", "k": 1})
    );
    let second = f.stdin(1);
    assert_eq!(second["prevResult"]["ips"][0]["address"], "10.9.0.2/24");
    assert_eq!(
        second["runtimeConfig"],
        json!({"portMappings": [{"hostPort": 1}]})
    );
    let cached = f.cached().unwrap();
    assert_eq!(cached.result, Some(result.clone()));
    assert_eq!(cached.netns, "/run/netns/fake");

    f.rt.check(&list, &att()).unwrap();
    assert_eq!(f.stdin(2)["prevResult"], result);
    f.rt.del(&list, &att()).unwrap();
    let log = f.log();
    assert_eq!(
        log[4],
        "DEL two c1 eth0 /run/netns/fake IgnoreUnknown=1;K=V"
    );
    assert_eq!(
        log[5],
        "DEL one c1 eth0 /run/netns/fake IgnoreUnknown=1;K=V"
    );
    assert_eq!(f.stdin(4)["prevResult"], result);
    assert!(f.cached().is_none());
    // A second DEL (no cache any more) still runs, without prevResult.
    f.rt.del(&list, &att()).unwrap();
    assert!(f.stdin(6).get("prevResult").is_none());
}

#[test]
fn failed_add_deletes_the_whole_list() {
    let f = Fake::new();
    let list = f.list("1.0.0", json!({"fail": "ADD"}));
    let e = f.rt.add(&list, &att()).unwrap_err();
    let Error::Plugin(p) = &e else { panic!("{e}") };
    assert_eq!(
        (p.plugin_type.as_str(), p.index, p.command),
        ("two", 1, "ADD")
    );
    assert_eq!(p.object["code"], 7);
    let text = e.to_string();
    assert!(
        text.contains("\"two\" (2 of 2) failed ADD: two says no") && text.contains("deleted again"),
        "{text}"
    );
    let log: Vec<String> = f.log().iter().map(|l| l[..7].to_string()).collect();
    assert_eq!(log, ["ADD one", "ADD two", "DEL two", "DEL one"]);
    assert!(f.stdin(2).get("prevResult").is_none());
    assert!(f.cached().is_none());
}

#[test]
fn old_versions_del_without_prev_result_and_refuse_check() {
    let f = Fake::new();
    let list = f.list("0.3.1", json!({}));
    f.rt.add(&list, &att()).unwrap();
    assert!(f
        .rt
        .check(&list, &att())
        .unwrap_err()
        .to_string()
        .contains("0.4.0"));
    f.rt.del(&list, &att()).unwrap();
    assert!(f.stdin(2).get("prevResult").is_none());
}

#[test]
fn disable_check_and_status_gc_versions() {
    let f = Fake::new();
    let mut list = f.list("1.0.0", json!({}));
    list.disable_check = true;
    let out = f.rt.check(&list, &att()).unwrap();
    assert!(out.notes[0].contains("disableCheck"));
    assert!(f.rt.status(&list).unwrap().notes[0].contains("1.1.0"));
    assert!(f.log().is_empty());
    let list = f.list("1.1.0", json!({}));
    f.rt.status(&list).unwrap();
    assert_eq!(f.log(), ["STATUS one    ", "STATUS two    "]);
    assert_eq!(
        f.stdin(0),
        json!({"cniVersion": "1.1.0", "name": "fnet", "type": "one", "k": 1})
    );
}

#[test]
fn check_without_cache_is_a_clear_error() {
    let f = Fake::new();
    let e = f.rt.check(&f.list("1.0.0", json!({})), &att()).unwrap_err();
    assert!(e.to_string().contains("no cached result"), "{e}");
}

#[test]
fn gc_forgets_gone_and_passes_the_rest_as_valid() {
    let f = Fake::new();
    let list = f.list("1.1.0", json!({}));
    for id in ["c1", "c2"] {
        let a = Attachment {
            container_id: id.into(),
            ..att()
        };
        f.rt.add(&list, &a).unwrap();
    }
    let out =
        f.rt.gc(&list, &[Gone::parse("c1/eth0"), Gone::parse("nope")])
            .unwrap();
    assert!(
        out.notes.iter().any(|n| n.contains("nope")),
        "{:?}",
        out.notes
    );
    let log = f.log();
    assert_eq!(
        &log[4..],
        [
            "DEL two c1 eth0 /run/netns/fake IgnoreUnknown=1;K=V",
            "DEL one c1 eth0 /run/netns/fake IgnoreUnknown=1;K=V",
            "GC one    ",
            "GC two    "
        ]
    );
    let gc = f.stdin(6);
    let valid = json!([{"containerID": "c2", "ifname": "eth0"}]);
    assert_eq!(gc["cni.dev/valid-attachments"], valid);
    assert_eq!(gc["cni.dev/attachments"], valid);
    assert_eq!(f.rt.cache.list("fnet").unwrap().len(), 1);
    let mut off = list.clone();
    off.disable_gc = true;
    assert!(f.rt.gc(&off, &[]).unwrap().notes[0].contains("disableGC"));
}

#[test]
fn missing_plugin_and_bad_attachment() {
    let f = Fake::new();
    let v = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "absent"}]});
    let list = ConfList::from_list_bytes(&serde_json::to_vec(&v).unwrap(), Path::new("x")).unwrap();
    let e = f.rt.add(&list, &att()).unwrap_err().to_string();
    assert!(e.contains("failed to find plugin \"absent\""), "{e}");
    let bad = Attachment {
        ifname: "a:b".into(),
        ..att()
    };
    assert!(f.rt.add(&f.list("1.0.0", json!({})), &bad).is_err());
    assert!(f.log().is_empty());
}
