//! `cnikit-cri-suite breakdown --events FILE --calls FILE`: where the time of each measured
//! RunPodSandbox / StopPodSandbox / RemovePodSandbox goes, from the process events
//! proctrace.rs recorded (kernel CLOCK_MONOTONIC) and the calls' start and end that
//! measure.rs wrote (the same clock). Per call: the time before the first CNI plugin is
//! spawned (containerd's own work, netns creation included), each plugin exec by plugin and
//! CNI_COMMAND (containerd's fork to the plugin's exit), the gaps libcni leaves between the
//! plugins of the list, and the time after the last plugin exits (result cache, the runtime:
//! shim and runc). Prints the p50 of each, one column per label.

use std::collections::HashMap;
use std::fs;

/// `pcomm` of a plugin's child that did not exec (an "F" line).
const FORKED: &str = "(fork)";

/// One exec of a process containerd started (directly or not).
#[derive(Clone, Debug)]
struct Exec {
    pid: u32,
    parent: u32,
    spawn: u64, // containerd's fork of it (the exec itself when the fork went unseen)
    exec: u64,
    exit: Option<u64>,
    /// ns on a CPU and ns waiting for one, read as it exited (proctrace.rs)
    sched: Option<(u64, u64)>,
    pcomm: String,
    cmd: String,
    name: String,
}

struct Call {
    label: String,
    call: String,
    start: u64,
    end: u64,
}

fn parse_events(text: &str) -> (Vec<Exec>, Vec<u64>, usize) {
    let (mut execs, mut threads, mut lost) = (Vec::<Exec>::new(), Vec::new(), 0);
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match f[0] {
            "E" if f.len() >= 7 => {
                let pid = num(2) as u32;
                // the process's earlier image (runc init before the sandbox's command) ends here
                let prev = execs
                    .iter_mut()
                    .rev()
                    .find(|e| e.pid == pid && e.exit.is_none());
                match prev {
                    // a plugin's child that goes on to exec (the reference's iptables) is
                    // that exec, not a forked child of its own
                    Some(p) if p.pcomm == FORKED => (p.pid, p.parent) = (0, 0),
                    Some(p) => p.exit = Some(num(1)),
                    None => {}
                }
                execs.push(Exec {
                    pid,
                    parent: num(3) as u32,
                    spawn: if num(4) > 0 { num(4) } else { num(1) },
                    exec: num(1),
                    exit: None,
                    sched: None,
                    pcomm: f[5].into(),
                    cmd: f[6].into(),
                    // no argv left to read: it had ended already
                    name: match f.get(7).and_then(|a| a.rsplit('/').next()) {
                        Some("") | None => "(gone)".into(),
                        Some(n) => n.into(),
                    },
                });
            }
            "X" => {
                let (ts, pid) = (num(1), num(2) as u32);
                if let Some(e) = execs
                    .iter_mut()
                    .rev()
                    .find(|e| e.pid == pid && e.exit.is_none())
                {
                    e.exit = Some(ts);
                    e.sched = f
                        .get(4)
                        .zip(f.get(5))
                        .and_then(|(r, w)| Some((r.parse().ok()?, w.parse().ok()?)));
                }
            }
            "F" => execs.push(Exec {
                pid: num(2) as u32,
                parent: num(3) as u32,
                spawn: num(1),
                exec: num(1),
                exit: None,
                sched: None,
                pcomm: FORKED.into(),
                cmd: "-".into(),
                name: "(forked)".into(),
            }),
            "T" => threads.push(num(1)),
            _ if line.starts_with('#') => lost += 1,
            _ => {}
        }
    }
    (execs, threads, lost)
}

fn parse_calls(text: &str) -> Vec<Call> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some(Call {
                label: f.first()?.replace('_', " "),
                call: f.get(2)?.to_string(),
                start: f.get(3)?.parse().ok()?,
                end: f.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

fn ms(a: u64, b: u64) -> f64 {
    b.saturating_sub(a) as f64 / 1e6
}

/// A plugin exec: containerd's own child that is not the runtime's shim.
fn is_plugin(e: &Exec) -> bool {
    e.pcomm == "containerd" && !e.name.starts_with("containerd-shim")
}

/// A row: where it sorts (section, then the order of the plugins), its name (indented
/// under its parent row), and the call's value in ms.
type Part = ((u32, u32), String, f64);

/// The parts of one call, in the table's order.
fn parts(c: &Call, execs: &[Exec], threads: &[u64]) -> Vec<Part> {
    let mut out: Vec<Part> = vec![((0, 0), "total".into(), ms(c.start, c.end))];
    let mut row = |sec: u32, sub: u32, name: &str, v: f64| out.push(((sec, sub), name.into(), v));
    let inside = |e: &&Exec| e.spawn >= c.start && e.spawn <= c.end;
    let mut plugins: Vec<&Exec> = execs
        .iter()
        .filter(inside)
        .filter(|e| is_plugin(e))
        .collect();
    plugins.sort_by_key(|e| e.spawn);
    let runtime = execs
        .iter()
        .filter(inside)
        .filter(|e| {
            !is_plugin(e) && e.pcomm != FORKED && !plugins.iter().any(|p| p.pid == e.parent)
        })
        .map(|e| e.spawn)
        .min();
    let Some(first) = plugins.first().map(|e| e.spawn) else {
        if let Some(rt) = runtime {
            row(
                1,
                0,
                "  start → runtime (shim, runc) start",
                ms(c.start, rt),
            );
            row(2, 0, "  runtime start → return", ms(rt, c.end));
        }
        return out;
    };
    let last = plugins.iter().filter_map(|e| e.exit).max().unwrap_or(c.end);
    if let Some(t) = threads
        .iter()
        .filter(|&&t| t >= c.start && t <= first)
        .max()
    {
        row(
            3,
            0,
            "  start → netns mounted (its thread ends)",
            ms(c.start, *t),
        );
    }
    row(4, 0, "  start → first plugin spawn", ms(c.start, first));
    row(5, 0, "  CNI: first spawn → last exit", ms(first, last));
    let (mut gaps, mut prev_exit, mut k) = (0.0, None, 0);
    for e in &plugins {
        // loopback runs beside the list (go-cni attaches networks concurrently): first row,
        // then the list's plugins in the order libcni runs them
        let sub = if e.name == "loopback" {
            0
        } else {
            k += 1;
            k
        };
        let exit = e.exit.unwrap_or(c.end);
        row(
            6,
            sub * 100,
            &format!("    {} {}", e.name, e.cmd),
            ms(e.spawn, exit),
        );
        row(7, 0, "    each spawn: fork → exec", ms(e.spawn, e.exec));
        if let Some((run, wait)) = e.sched {
            // wall = on a CPU + waiting for one + blocked (locks, the kernel's RCU waits)
            row(
                6,
                sub * 100 + 50,
                &format!("      {} on a CPU", e.name),
                run as f64 / 1e6,
            );
            let name = format!("      {} waiting for a CPU", e.name);
            row(6, sub * 100 + 51, &name, wait as f64 / 1e6);
            // the rest: asleep, for stdin (go's exec writes it from a goroutine that only
            // starts once the child has exec'd), locks, RCU waits (docs/performance.md)
            let asleep = ms(e.spawn, exit) - (run + wait) as f64 / 1e6;
            let name = format!("      {} asleep (stdin, locks, RCU)", e.name);
            row(6, sub * 100 + 52, &name, asleep.max(0.0));
        }
        for n in execs
            .iter()
            .filter(|n| n.parent == e.pid && n.spawn >= e.spawn)
        {
            if n.pcomm == FORKED {
                // cnikit's deferred socket closer: how long it outlives the plugin
                let name = format!("      {}'s forked child ends after it", e.name);
                let (end, child_end) = (e.exit.unwrap_or(c.end), n.exit.unwrap_or(c.end));
                row(6, sub * 100 + 60, &name, ms(end, child_end));
                continue;
            }
            let name = format!("      {} {} (run by {})", n.name, n.cmd, e.name);
            row(
                6,
                sub * 100 + 1,
                &name,
                ms(n.spawn, n.exit.unwrap_or(c.end)),
            );
        }
        if sub > 0 {
            if let Some(p) = prev_exit.filter(|&p| e.spawn > p) {
                gaps += ms(p, e.spawn);
            }
            prev_exit = e.exit;
        }
    }
    row(8, 0, "    between the list's plugins (sum)", gaps);
    row(9, 0, "  last plugin exit → return", ms(last, c.end));
    if let Some(rt) = runtime.filter(|&rt| rt > last) {
        row(10, 0, "    last exit → runtime start", ms(last, rt));
        row(11, 0, "    runtime start → return", ms(rt, c.end));
    }
    out
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

pub fn run(events: &str, calls: &str) -> Result<(), String> {
    let read = |p: &str| fs::read_to_string(p).map_err(|e| format!("{p}: {e}"));
    let (execs, threads, lost) = parse_events(&read(events)?);
    let calls = parse_calls(&read(calls)?);
    let mut labels: Vec<String> = Vec::new();
    for c in &calls {
        if !labels.contains(&c.label) {
            labels.push(c.label.clone());
        }
    }
    let unknown = execs
        .iter()
        .filter(|e| is_plugin(e) && e.cmd == "?")
        .count();
    for (call, title) in [
        ("run", "RunPodSandbox"),
        ("stop", "StopPodSandbox"),
        ("remove", "RemovePodSandbox"),
    ] {
        // row → label → values (one per pod that had the part)
        let mut rows: Vec<((u32, u32), String)> = Vec::new();
        let mut vals: HashMap<(String, String), Vec<f64>> = HashMap::new();
        for c in calls.iter().filter(|c| c.call == call) {
            let mut seen: HashMap<String, f64> = HashMap::new();
            for (at, k, v) in parts(c, &execs, &threads) {
                // a part that occurs more than once in a call (each spawn) counts each time
                if k.contains("each") {
                    vals.entry((k.clone(), c.label.clone()))
                        .or_default()
                        .push(v);
                } else {
                    *seen.entry(k.clone()).or_default() += v;
                }
                if !rows.iter().any(|(_, r)| *r == k) {
                    rows.push((at, k));
                }
            }
            for (k, v) in seen {
                vals.entry((k, c.label.clone())).or_default().push(v);
            }
        }
        rows.sort();
        print!("{:<44}", format!("{title}, p50 ms"));
        for l in &labels {
            print!(" {l:>13}");
        }
        println!();
        for (_, r) in &rows {
            print!("{r:<44}");
            for l in &labels {
                match vals.get_mut(&(r.clone(), l.clone())) {
                    Some(v) => print!(" {:>13.2}", p50(v)),
                    None => print!(" {:>13}", "-"),
                }
            }
            println!();
            if r == "total" {
                // what the CNI part adds: the same call's p50 over the hostNetwork pods'
                let floor = vals.get_mut(&(r.clone(), "no CNI".into())).map(|v| p50(v));
                print!("{:<44}", "  over the no-CNI floor (p50 − p50)");
                for l in &labels {
                    let v = vals.get_mut(&(r.clone(), l.clone())).map(|v| p50(v));
                    match (v, floor) {
                        (Some(v), Some(f)) if l != "no CNI" => print!(" {:>13.2}", v - f),
                        _ => print!(" {:>13}", "-"),
                    }
                }
                println!();
            }
        }
    }
    if !execs.iter().any(is_plugin) {
        // the kernel ignores a listener outside the initial pid and user namespaces silently
        println!("no plugin exec was recorded: is proc-trace in the initial namespaces?");
    }
    println!(
        "(process events connector; spawn = containerd's fork of the plugin; {} plugin execs, \
         {unknown} of unknown CNI_COMMAND; {lost} event losses)",
        execs.iter().filter(|e| is_plugin(e)).count()
    );
    Ok(())
}
