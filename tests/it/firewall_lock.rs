//! The lock cnikit's firewall transactions take turns on
//! (`/run/cnikit/nftables.lock`) must not let anyone freeze the node's
//! firewall changes: other users cannot open it, it is 0600 whatever the
//! runtime's umask, and a holder that never lets go delays a transaction by a
//! bounded time only (the ruleset generation check keeps it correct without
//! the turn).

use crate::support::*;
use serde_json::json;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::{Duration, Instant};

const LOCK: &str = "/run/cnikit/nftables.lock";

/// A test world with a netns, and a bridge network with ipMasq: every ADD
/// makes a firewall transaction.
fn with_masq_bridge(test: &str) -> (TestEnv, Netns, serde_json::Value) {
    let (env, ns) = TestEnv::with_netns(test);
    let conf = json!({
        "cniVersion": "1.0.0", "name": format!("lk-{}", short_hash()), "type": "bridge",
        "bridge": env.link_name("lkbr"), "isGateway": true, "ipMasq": true,
        "ipam": env.ipam(Ipam::Ipamd, env.subnets().v4_ranges()),
    });
    (env, ns, conf)
}

/// A bridge ADD with ipMasq (one firewall transaction), run through bash so
/// that the runtime's umask is 000.
fn add_under_umask_000(env: &TestEnv, conf: &serde_json::Value, id: &str, ns: &Netns) -> Outcome {
    let script = env.dir("umask").join("bridge");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\numask 000\nexec -a bridge {} \"$@\"\n",
            cnikit_exe().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    Call::new(script)
        .env("CNI_PATH", &env.bin_dir().to_string_lossy())
        .attach("ADD", id, ns, "eth0")
        .conf(conf)
        .run()
}

/// Proves: under umask 000 the lock file is root's and 0600, and uid 65534
/// cannot even open it (so it cannot hold it).
#[test]
fn other_users_cannot_hold_the_lock() {
    // It makes the lock file anew: no test may rely on the lock meanwhile.
    let _alone = firewall_lock_held_on_purpose();
    let (env, ns, conf) = with_masq_bridge("firewall_lock_modes");
    let _ = std::fs::remove_file(LOCK);
    add_under_umask_000(&env, &conf, "lk-modes", &ns).result();
    let meta = std::fs::symlink_metadata(LOCK).expect("the ADD made the lock file");
    assert!(meta.is_file());
    assert_eq!(meta.uid(), 0);
    assert_eq!(meta.mode() & 0o777, 0o600, "lock file mode under umask 000");
    let nobody = Command::new("setpriv")
        .args(SETPRIV_NOBODY)
        .args(["sh", "-c", &format!("exec 3<{LOCK}")])
        .output()
        .expect("setpriv");
    assert!(
        !nobody.status.success(),
        "uid 65534 opened {LOCK}: {}",
        String::from_utf8_lossy(&nobody.stderr)
    );
    env.plugin("bridge")
        .attach("DEL", "lk-modes", &ns, "eth0")
        .conf(&conf)
        .run()
        .ok_silent();
}

/// Proves: a process that holds the lock and never lets go delays a firewall
/// transaction by a bounded time; the ADD then applies its change anyway.
#[test]
fn a_holder_that_never_lets_go_does_not_freeze_firewall_changes() {
    let _alone = firewall_lock_held_on_purpose();
    let (env, ns, conf) = with_masq_bridge("firewall_lock_holder");
    env.plugin("bridge")
        .attach("ADD", "lk-warm", &ns, "eth0")
        .conf(&conf)
        .run()
        .result();
    let holder = std::fs::File::open(LOCK).expect("lock file");
    holder.lock().expect("hold the lock");
    let ns2 = env.netns();
    let started = Instant::now();
    let r = env
        .plugin("bridge")
        .attach("ADD", "lk-held", &ns2, "eth0")
        .conf(&conf)
        .run();
    let waited = started.elapsed();
    drop(holder);
    let result = r.result();
    assert!(
        waited < Duration::from_secs(30),
        "ADD waited {waited:?} for a lock nobody releases"
    );
    let addr = first_addr(&result, false);
    assert!(
        ruleset_json().contains(&format!("\"{}\"", addr.split('/').next().unwrap())),
        "the masquerade entry of {addr} was applied"
    );
    for (id, ns) in [("lk-warm", &ns), ("lk-held", &ns2)] {
        env.plugin("bridge")
            .attach("DEL", id, ns, "eth0")
            .conf(&conf)
            .run()
            .ok_silent();
    }
}
