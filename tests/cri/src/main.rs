//! cnikit's containerd CRI suite driver (run by tests/cri/run.sh inside its isolated node):
//!
//!   cnikit-cri-suite suite        OPTS --mode M --network NAME   16 parallel pods, hostPort pod,
//!                                                                hostPort conflict
//!   cnikit-cri-suite dualstack    OPTS --mode M --network NAME   the dual-stack example conflist
//!   cnikit-cri-suite kind         OPTS --mode M --network NAME   kind's own conflist (ptp + host-local + portmap)
//!   cnikit-cri-suite measure      OPTS --count N --label L       RunPodSandbox/StopPodSandbox/
//!                     [--host-network true]                      RemovePodSandbox latencies
//!                     [--calls FILE]                             (+ each call's start and end)
//!   cnikit-cri-suite proc-trace   --out FILE                     process events (proctrace.rs)
//!   cnikit-cri-suite breakdown    --events FILE --calls FILE     where the calls' time goes
//!   cnikit-cri-suite wait-network --socket S --name NAME         until containerd loaded NAME
//!   cnikit-cri-suite node-agent   OPTS --network NAME --agent-image I --caps A,B
//!                     --host-pid BOOL --host-bin D --host-conf D --net-conf D --list FILE
//!                                                                the DaemonSet's pod (node_agent.rs)
//!
//! OPTS: --socket S --image I --cgroup-parent P --node-ip IP --log-dir D --cnikit PATH

mod breakdown;
mod checks;
mod cri;
mod kind;
mod measure;
mod node_agent;
#[allow(dead_code)] // serve is cri-echo's
mod probe;
mod proctrace;
mod scenarios;

use checks::Report;
use cri::{Cri, Env};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first().cloned() else {
        usage()
    };
    let mut env = Env::default();
    let (mut count, mut label, mut name) = (50usize, String::from("cnikit"), String::new());
    let mut host_network = false;
    let (mut calls, mut events, mut out) = (String::new(), String::new(), String::new());
    let mut agent = node_agent::Agent::default();
    for pair in args[1..].chunks(2) {
        let v = pair.get(1).cloned().unwrap_or_else(|| usage());
        match pair[0].as_str() {
            "--socket" => env.socket = v,
            "--image" => env.image = v,
            "--cgroup-parent" => env.cgroup_parent = v,
            "--node-ip" => env.node_ip = v,
            "--log-dir" => env.log_dir = v,
            "--cnikit" => env.cnikit = v,
            "--mode" => env.mode = v,
            "--network" => env.network = v,
            "--count" => count = v.parse().unwrap_or_else(|_| usage()),
            "--label" => label = v,
            "--name" => name = v,
            "--host-network" => host_network = v == "true",
            "--calls" => calls = v,
            "--events" => events = v,
            "--out" => out = v,
            "--agent-image" => agent.image = v,
            "--caps" => {
                agent.caps = v
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(String::from)
                    .collect()
            }
            "--host-pid" => agent.host_pid = v == "true",
            "--host-bin" => agent.bin_dir = v,
            "--host-conf" => agent.conf_dir = v,
            "--net-conf" => agent.net_conf = v,
            "--list" => agent.list = v,
            _ => usage(),
        }
    }
    // the two that do not talk to containerd
    let offline = match cmd.as_str() {
        "proc-trace" => Some(proctrace::run(&out)),
        "breakdown" => Some(breakdown::run(&events, &calls)),
        _ => None,
    };
    if let Some(r) = offline {
        if let Err(e) = r {
            eprintln!("cnikit-cri-suite {cmd}: {e}");
            std::process::exit(1);
        }
        return;
    }
    let cri = match Cri::connect(&env).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cnikit-cri-suite: {e}");
            std::process::exit(1);
        }
    };
    let mut rep = Report::new(&env.mode);
    match cmd.as_str() {
        "wait-network" => {
            if let Err(e) = cri.wait_network(&name).await {
                eprintln!("cnikit-cri-suite: {e}");
                std::process::exit(1);
            }
            return;
        }
        "suite" => {
            // parallel first: on a bare node, the first ADDs race to create bridge and table
            scenarios::parallel_pods(&cri, &mut rep, 16, &env.cnikit).await;
            scenarios::hostport_pod(&cri, &mut rep, &env.network, &env.node_ip, &env.cnikit).await;
            scenarios::conflicting_pod(&cri, &mut rep, &env.cnikit).await;
        }
        "node-agent" => {
            let (net, node) = (&env.network, &env.node_ip);
            node_agent::node_agent(&cri, &mut rep, &agent, net, node).await
        }
        "dualstack" => scenarios::dualstack_pod(&cri, &mut rep, &env.network, &env.cnikit).await,
        "kind" => {
            let (net, node) = (&env.network, &env.node_ip);
            kind::kind_pods(&cri, &mut rep, net, node, &env.cnikit).await
        }
        "measure" => {
            if let Err(e) = measure::run(&cri, count, &label, host_network, &calls).await {
                eprintln!("cnikit-cri-suite: measure {label}: {e}");
                std::process::exit(1);
            }
            return;
        }
        _ => usage(),
    }
    println!(
        "  ({} {}: {} ok, {} FAIL)",
        env.mode, cmd, rep.passed, rep.failed
    );
    std::process::exit(i32::from(rep.failed > 0));
}

fn usage() -> ! {
    eprintln!("usage: cnikit-cri-suite suite|dualstack|kind|node-agent|measure|proc-trace|breakdown|wait-network [--option value]... (see src/main.rs)");
    std::process::exit(2)
}
