//! Concurrent firewall writers on a node that already has many pods: the
//! race where a DEL's batch finds an element another writer removed first
//! (a DEL failed with "No such file or directory" and left entries behind,
//! once in four runs with 1,000 resident pods and 8 churning workers).

use crate::support::*;
use serde_json::{json, Value};

const RESIDENTS: usize = 100;
const WORKERS: usize = 8;
const CYCLES: usize = 12;

/// Two host ports of pod number `n`, from a block no other test's
/// `host_port()` reaches (those stay below 30000).
fn portmap_conf(net: &str, n: u16, prev: &Value) -> Value {
    let port = 30000 + 2 * n;
    json!({
        "cniVersion": "1.0.0", "name": net, "type": "portmap",
        "runtimeConfig": {"portMappings": [
            {"hostPort": port, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": port + 1, "containerPort": 53, "protocol": "udp"},
        ]},
        "prevResult": prev,
    })
}

/// ADD bridge (ipMasq, macspoofchk) + portmap, the chain a runtime makes;
/// the two attachments and bridge's result.
fn attach<'e>(env: &'e TestEnv, n: usize, conf: &Value) -> (Attachment<'e>, Attachment<'e>, Value) {
    let pod = env.new_attachment("bridge", &format!("p{n}"), conf);
    let result = pod.add();
    let net = conf["name"].as_str().expect("name");
    let n = u16::try_from(n).expect("pod number");
    let pm = pod.chained("portmap", &portmap_conf(net, n, &result));
    pm.add();
    (pod, pm, result)
}

/// Proves: with 100 resident pods (masquerade, MAC spoof check and two port
/// mappings each), 8 workers churning ADD/DEL in parallel never see a DEL
/// fail and leave no entry of theirs behind, and every resident keeps all of
/// its entries. The workers DEL as runtimes do, with prevResult (by key);
/// the residents go by tag at the end.
#[test]
fn concurrent_churn_beside_residents_never_fails_a_del_nor_leaks() {
    let env = TestEnv::new("firewall_churn");
    let net = format!("churn-{}", short_hash());
    let ipam = env.ipam(Ipam::Ipamd, json!([[{"subnet": "10.123.0.0/16"}]]));
    let conf = json!({
        "cniVersion": "1.0.0", "name": net, "type": "bridge",
        "bridge": env.link_name("chbr"), "isGateway": true, "ipMasq": true,
        "macspoofchk": true, "ipam": ipam,
    });
    let residents: Vec<_> = (0..RESIDENTS).map(|i| attach(&env, i, &conf)).collect();
    let churned: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (env, conf) = (&env, &conf);
                s.spawn(move || {
                    let mut ids = Vec::new();
                    for c in 0..CYCLES {
                        let (pod, pm, result) = attach(env, RESIDENTS + w * CYCLES + c, conf);
                        pm.del();
                        pod.call("DEL")
                            .conf(&with_prev(conf, &result))
                            .run()
                            .ok_silent();
                        ids.push(pod.id.clone());
                    }
                    ids
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    assert_no_trace("after the churn", &churned);
    let rules = ruleset_json();
    for (pod, _, _) in &residents {
        // Masquerade, and the two mappings: three entries at least name it.
        let entries = rules.matches(pod.id.as_str()).count();
        assert!(
            entries >= 3,
            "resident {} has {entries} entries left",
            pod.id
        );
    }
    for (pod, pm, _) in &residents {
        pm.del();
        pod.del();
    }
    let ids: Vec<String> = residents.iter().map(|(p, _, _)| p.id.clone()).collect();
    assert_no_trace("after the residents' DEL", &ids);
}
