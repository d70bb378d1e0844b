//! Day 2 of the pools: a dead node's blocks reclaimed and quarantined, a cut-off node
//! fenced and told which blocks it lost, and `pool check`.

use super::*;

impl Node {
    /// SIGSTOP (`freeze`) or SIGCONT the node's daemon: it stops renewing its session
    /// with every connection left open, as a node cut off from etcd.
    pub fn freeze(&self, freeze: bool) {
        let sig = if freeze { libc::SIGSTOP } else { libc::SIGCONT };
        lock(&self.daemon)
            .as_ref()
            .expect("the daemon runs")
            .signal(sig);
    }

    /// `cnikit ipamd pool check POOL` as this node; its exit status and JSON report.
    pub fn check(&self, etcd: &str, pool: &str) -> (i32, Value) {
        let out = Command::new(cnikit_exe())
            .args([
                "ipamd", "pool", "check", pool, "--json", "--node", &self.name,
            ])
            .arg(format!("--socket={}", self.sock.display()))
            .arg(format!("--data-dir={}", self.data.display()))
            .arg(format!("--etcd-endpoints={etcd}"))
            .output()
            .expect("run pool check");
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "pool check printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }
}

impl Node {
    /// The check named `name` of `cnikit doctor --json` run against this node's daemon.
    pub fn doctor(&self, name: &str) -> Value {
        let out = Command::new(cnikit_exe())
            .arg("doctor")
            .arg("--json")
            .arg(format!("--socket={}", self.sock.display()))
            .arg(format!("--data-dir={}", self.data.display()))
            .output()
            .expect("run cnikit doctor");
        let doc: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
        doc["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["check"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no check {name:?} in {doc}"))
    }
}

/// The block of `pool` holding `addr`, as `pool show --json` gives it.
pub fn block_of(etcd: &str, pool: &str, addr: IpAddr) -> Value {
    show(etcd, pool)["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .find(|b| cidr_of(b).contains(&addr))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The `cidr` of a block of `pool show --json`.
pub fn cidr_of(block: &Value) -> ipnet::IpNet {
    block["cidr"]
        .as_str()
        .expect("cidr")
        .parse()
        .expect("a CIDR")
}

pub fn first_address(o: &Outcome) -> IpAddr {
    addresses(&o.result())[0].addr()
}

/// Proves: a SIGKILLed node's block is reclaimed by the other node within reclaimAfter +
/// session TTL + 10 s and quarantined (`pool show` state, /metrics); the survivor then
/// fills the pool's never-used block before it takes the quarantined one; `pool check`
/// of the survivor finds nothing.
#[test]
fn a_dead_nodes_block_is_reclaimed_and_used_last() {
    let env = TestEnv::new("cluster_reclaim");
    // Three blocks of 13 leasable addresses.
    let create = "r --cidr 10.75.0.0/28 --cidr 10.75.1.0/27 --block-size 28 --reclaim-after 2";
    let (_etcd, e) = etcd_with_pools(&env, 1, &[create]);
    let extra = ["--etcd-session-ttl=2"];
    let [a, b] = [
        Node::start(&env, "ra", &e, &extra),
        Node::start(&env, "rb", &e, &extra),
    ];
    let (ca, cb) = (a.conf("pods", &["r"]), b.conf("pods", &["r"]));
    let lost = first_address(&a.call(&env, "ADD", "a0", &ca));
    b.call(&env, "ADD", "b0", &cb).result();
    assert_eq!(block_of(&e, "r", lost)["state"], "owned");

    a.kill();
    let t = eventually(
        Duration::from_secs(2 + 2 + 10),
        "reclaim of ra's block",
        || block_of(&e, "r", lost)["state"] == "quarantined",
    );
    eprintln!("ra's block was reclaimed {t:?} after its daemon was killed");
    let q = block_of(&e, "r", lost);
    assert_eq!(
        (q["reclaimedFrom"].as_str(), q["node"].as_str()),
        (Some("ra"), Some(""))
    );
    assert_eq!(b.metric("ipamd_cluster_blocks_reclaimed_total"), 1);
    eventually(Duration::from_secs(10), "the quarantined gauge", || {
        b.metric("ipamd_pool_blocks_quarantined{pool=\"r\"}") == 1
    });
    let shown = show(&e, "r");
    assert_eq!(shown["reclaimAfter"], 2);
    assert_eq!(shown["usage"]["blocksQuarantined"], 1);

    // rb's first block and then the never-used one, before the quarantined block.
    let mut got = Vec::new();
    for i in 1..26 {
        got.push(first_address(&b.call(&env, "ADD", &format!("b{i}"), &cb)));
    }
    assert!(got.iter().all(|x| block_of(&e, "r", *x)["node"] == "rb"));
    assert_eq!(block_of(&e, "r", lost)["state"], "quarantined", "used last");
    let next = first_address(&b.call(&env, "ADD", "b26", &cb));
    let taken = block_of(&e, "r", next);
    assert_eq!(
        (taken["node"].as_str(), taken["state"].as_str()),
        (Some("rb"), Some("owned"))
    );
    assert!(
        cidr_of(&taken).contains(&lost),
        "the reclaimed block: {taken}"
    );
    let (code, report) = b.check(&e, "r");
    assert_eq!((code, &report["findings"]), (0, &json!([])), "{report}");
    b.call(&env, "ADD", "b27", &cb).result();
}

/// Proves: while etcd answers nothing for longer than the session TTL, a node stops handing
/// out new addresses from a pool that reclaims (11, naming why) while repeated ADD and DEL
/// still work, and a pool reclaimed only by hand keeps serving; when etcd is back the node
/// renews, confirms its blocks and allocates again.
#[test]
fn a_node_cut_off_from_etcd_is_fenced_until_it_confirms_its_blocks() {
    let env = TestEnv::new("cluster_fence");
    let (etcd, e) = etcd_with_pools(
        &env,
        1,
        &[
            "fa --cidr 10.77.0.0/24 --block-size 28 --reclaim-after 30",
            "fm --cidr 10.77.1.0/24 --block-size 28",
        ],
    );
    let n = Node::start(&env, "fn1", &e, &["--etcd-session-ttl=2"]);
    let (auto, manual) = (n.conf("auto", &["fa"]), n.conf("manual", &["fm"]));
    let held = n.call(&env, "ADD", "c0", &auto).result();
    n.call(&env, "ADD", "m0", &manual).result();
    n.call(&env, "ADD", "c1", &auto).result();
    etcd.freeze_all(true);
    std::thread::sleep(Duration::from_millis(2500));
    n.call(&env, "ADD", "c2", &auto)
        .expect_err(11, &["hands out no new address", "TTL is 2 s"]);
    n.call(&env, "STATUS", "", &auto)
        .expect_err(50, &["no new address"]);
    assert_eq!(n.metric("ipamd_cluster_fenced"), 1);
    assert_eq!(
        n.call(&env, "ADD", "c0", &auto).result()["ips"],
        held["ips"]
    );
    n.call(&env, "DEL", "c1", &auto).ok_silent();
    n.call(&env, "ADD", "m1", &manual).result();
    etcd.freeze_all(false);
    let t = eventually(Duration::from_secs(15), "ADD after etcd came back", || {
        n.call(&env, "ADD", "c2", &auto).success()
    });
    eprintln!("allocation resumed {t:?} after etcd answered again");
    assert_eq!(n.metric("ipamd_cluster_fenced"), 0);
    assert_eq!(n.metric("ipamd_cluster_blocks_lost_total"), 0);
}

/// Proves: a node frozen past its TTL and the pool's reclaimAfter loses its block to the
/// reclaimer; back, it is fenced until it has renewed and confirmed, then never allocates
/// from the lost block again (a new one instead), reports the lease it still holds there
/// (`pool check` exits 1 naming it, /metrics, doctor; after a restart too), and its DEL
/// releases that lease locally.
#[test]
fn a_node_that_returns_after_a_reclaim_never_uses_its_lost_block() {
    let env = TestEnv::new("cluster_lost");
    let create = "l --cidr 10.78.0.0/26 --block-size 28 --reclaim-after 1";
    let (_etcd, e) = etcd_with_pools(&env, 1, &[create]);
    let extra = ["--etcd-session-ttl=2"];
    let [a, b] = [
        Node::start(&env, "la", &e, &extra),
        Node::start(&env, "lb", &e, &extra),
    ];
    let (ca, cb) = (a.conf("pods", &["l"]), b.conf("pods", &["l"]));
    let old = first_address(&a.call(&env, "ADD", "a0", &ca));
    b.call(&env, "ADD", "b0", &cb).result();
    a.freeze(true);
    eventually(
        Duration::from_secs(2 + 1 + 10),
        "reclaim of la's block",
        || block_of(&e, "l", old)["state"] == "quarantined",
    );
    a.freeze(false);
    let t = eventually(Duration::from_secs(15), "la allocating again", || {
        a.call(&env, "ADD", "a1", &ca).success()
    });
    eprintln!("la allocated again {t:?} after it was thawed");
    let new = first_address(&a.call(&env, "ADD", "a1", &ca));
    assert!(
        !cidr_of(&block_of(&e, "l", old)).contains(&new),
        "{new} from the lost block"
    );
    assert_eq!(block_of(&e, "l", new)["node"], "la");
    assert_eq!(a.metric("ipamd_cluster_blocks_lost_total"), 1);
    assert_eq!(a.metric("ipamd_pool_blocks_lost{pool=\"l\"}"), 1);
    let (code, report) = a.check(&e, "l");
    assert_eq!(code, 1, "{report}");
    let kinds: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["leaseInLostBlock"], "{report}");
    assert!(report["findings"][0]["detail"]
        .as_str()
        .unwrap()
        .contains(&old.to_string()));
    // A restarted daemon finds the lost block again from its leases and etcd.
    a.kill();
    a.restart();
    eventually(
        Duration::from_secs(10),
        "the lost block found at start",
        || a.metric("ipamd_pool_blocks_lost{pool=\"l\"}") == 1,
    );
    let doctor = a.doctor("pool l");
    assert_eq!(doctor["status"], "fail", "{doctor}");
    assert!(
        doctor["fix"].as_str().unwrap().contains("pool check l"),
        "{doctor}"
    );
    a.call(&env, "DEL", "a0", &ca).ok_silent();
    assert!(!a.leases().contains_key(&old));
    eventually(
        Duration::from_secs(10),
        "doctor's pool check ok after the DEL",
        || a.doctor("pool l")["status"] == "ok",
    );
    let (code, report) = a.check(&e, "l");
    assert_eq!(code, 0, "{report}");
}
