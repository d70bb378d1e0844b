//! Check lines and the node's state: what a pod leaves on the host.

use std::process::Command;

/// Prints `ok - …` / `FAIL - …` lines (run.sh counts them) with a `[mode]` prefix.
pub struct Report {
    prefix: String,
    pub passed: usize,
    pub failed: usize,
}

impl Report {
    pub fn new(prefix: &str) -> Report {
        Report {
            prefix: prefix.into(),
            passed: 0,
            failed: 0,
        }
    }
    pub fn ok(&mut self, what: &str) {
        self.passed += 1;
        println!("ok - [{}] {what}", self.prefix);
    }
    pub fn fail(&mut self, what: &str, why: &str) {
        self.failed += 1;
        println!("FAIL - [{}] {what}", self.prefix);
        for l in why.lines().take(20) {
            println!("    {l}");
        }
    }
    /// ok if `r` is Ok; returns the value.
    pub fn check<T>(&mut self, what: &str, r: Result<T, String>) -> Option<T> {
        match r {
            Ok(v) => {
                self.ok(what);
                Some(v)
            }
            Err(e) => {
                self.fail(what, &e);
                None
            }
        }
    }
    pub fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, expected: T, actual: T) {
        if expected == actual {
            self.ok(what)
        } else {
            self.fail(
                what,
                &format!("expected: {expected:?}\nactual:   {actual:?}"),
            )
        }
    }
    pub fn note(&self, what: &str) {
        println!("  note: [{}] {what}", self.prefix);
    }
}

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn json(cmd: &str, args: &[&str]) -> Result<serde_json::Value, String> {
    let s = run(cmd, args)?;
    serde_json::from_str(&s).map_err(|e| format!("{cmd} {}: {e}: {s}", args.join(" ")))
}

fn dir(path: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(path)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Everything a pod may leave on the node, as names (so a failure shows what is left).
#[derive(Debug, Default, PartialEq)]
pub struct NodeState {
    pub veths: Vec<String>,
    pub leases: Vec<String>,
    pub nft_elements: Vec<String>,
    pub markers: Vec<String>,
    pub netns: Vec<String>,
    pub cache: Vec<String>,
}

pub fn node_state(cnikit: &str) -> Result<NodeState, String> {
    let links = json("ip", &["-j", "link", "show", "type", "veth"])?;
    // the node's own eth0 and its peer are veths too
    let veths = links
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(String::from))
        .filter(|n| n != "eth0" && n != "uplink0")
        .collect();
    let l = json(cnikit, &["ipamd", "leases", "--json"])?;
    let leases = l
        .as_array()
        .or_else(|| l["leases"].as_array())
        .into_iter()
        .flatten()
        .map(|x| {
            let f = |k: &str| x[k].as_str().unwrap_or("?").to_string();
            format!("{} {} {}", f("network"), f("containerId"), f("address"))
        })
        .collect();
    // the table exists once any firewall work was done; elements of every set and map
    let mut nft_elements = Vec::new();
    if let Ok(t) = json("nft", &["-j", "list", "table", "inet", "cnikit"]) {
        for o in t["nftables"].as_array().into_iter().flatten() {
            for kind in ["set", "map"] {
                if let Some(elems) = o[kind]["elem"].as_array() {
                    let name = o[kind]["name"].as_str().unwrap_or("?");
                    nft_elements.extend(elems.iter().map(|e| format!("{name}: {e}")));
                }
            }
        }
    }
    Ok(NodeState {
        veths,
        leases,
        nft_elements,
        markers: dir("/run/cnikit/portmap"),
        netns: dir("/run/netns"),
        cache: dir("/var/lib/cni/results"),
    })
}

/// One check line per kind of leftover.
pub fn nothing_left(rep: &mut Report, cnikit: &str, when: &str) {
    let s = match node_state(cnikit) {
        Ok(s) => s,
        Err(e) => return rep.fail(&format!("{when}: node state readable"), &e),
    };
    let kinds: [(&str, &Vec<String>); 6] = [
        ("host veths", &s.veths),
        ("ipamd leases", &s.leases),
        ("nft elements in inet cnikit", &s.nft_elements),
        ("portmap markers under /run/cnikit/portmap", &s.markers),
        ("netns under /run/netns", &s.netns),
        ("libcni cache under /var/lib/cni/results", &s.cache),
    ];
    for (what, v) in kinds {
        if v.is_empty() {
            rep.ok(&format!("{when}: no {what}"))
        } else {
            rep.fail(
                &format!("{when}: no {what}"),
                &format!("left: {}", v.join("\n      ")),
            )
        }
    }
}

/// The gateway of the pod's first IP from libcni's cache (what containerd saved).
pub fn cached_gateways(network: &str, sandbox: &str) -> Result<Vec<String>, String> {
    let path = format!("/var/lib/cni/results/{network}-{sandbox}-eth0");
    let s = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&s).map_err(|e| format!("{path}: {e}"))?;
    Ok(v["result"]["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["gateway"].as_str().map(String::from))
        .collect())
}

/// `ping -c1` from the node.
pub fn ping(ip: &str) -> Result<(), String> {
    run("ping", &["-c", "1", "-W", "2", ip]).map(|_| ())
}
