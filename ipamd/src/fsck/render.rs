//! `cnikit ipamd fsck`'s report as text.

use std::fmt::Write as _;
use std::path::Path;

use super::Report;
use crate::repair_hint::command;

impl Report {
    /// The report as text for a person; `data_dir` is what fsck was run on.
    pub fn render(&self, data_dir: &Path) -> String {
        let n = &self.network;
        let mut o = String::new();
        if let Some(e) = &self.error {
            let _ = writeln!(o, "network {n}: NOT CHECKED: {e}");
            return o;
        }
        let head = match (self.is_damaged(), &self.repaired) {
            (false, _) => "ok",
            (true, None) => "DAMAGED",
            (true, Some(_)) => "DAMAGED, repaired",
        };
        let _ = writeln!(o, "network {n}: {head}");
        let s = &self.snapshot;
        let _ = match (s.status, &s.problem) {
            ("ok", _) => writeln!(
                o,
                "  snapshot: ok, generation {} (version {}), {} lease(s)",
                s.generation.unwrap_or(0),
                s.version.unwrap_or(0),
                s.leases
            ),
            (_, Some(p)) => writeln!(o, "  snapshot: BAD: {p}"),
            _ => writeln!(o, "  snapshot: none"),
        };
        let j = &self.journal;
        let g = j.generation.unwrap_or(0);
        let _ = match j.status {
            "absent" => writeln!(o, "  journal: none"),
            "stale" => writeln!(
                o,
                "  journal: generation {g}, older than the snapshot (its records are in the snapshot already)"
            ),
            _ if j.damaged.is_empty() => writeln!(
                o,
                "  journal: generation {g}, {} bytes, {} valid record(s)",
                j.bytes, j.records_ok
            ),
            _ => writeln!(
                o,
                "  journal: generation {g}, {} bytes, {} valid record(s), {} of them after damage",
                j.bytes, j.records_ok, j.records_after_damage
            ),
        };
        for d in &self.damage {
            let _ = writeln!(o, "  damage: {d}");
        }
        if let Some(t) = &j.torn_tail {
            let _ = writeln!(
                o,
                "  torn tail: {} byte(s) at offset {} ({}): a write cut short by a crash, never acknowledged; dropped at the next load",
                t.length, t.offset, t.reason
            );
        }
        if let Some(u) = &j.unacknowledged {
            let _ = writeln!(
                o,
                "  left out: {} byte(s) at offset {}: {}",
                u.length, u.offset, u.reason
            );
        }
        let _ = writeln!(
            o,
            "  leases: {} (the snapshot and every valid record)",
            self.leases
        );
        if let Some(r) = &self.repaired {
            let kept: Vec<String> = r.kept.iter().map(|p| p.display().to_string()).collect();
            let _ = writeln!(
                o,
                "  repaired: kept {}; wrote a snapshot of those {} lease(s) and an empty journal, generation {}",
                kept.join(" and "),
                self.leases,
                r.generation
            );
        }
        if self.is_damaged() {
            let _ = writeln!(
                o,
                "  WARNING: records inside the damaged parts cannot be recovered. An allocation recorded only there is lost, and its address could be handed out again while a container still uses it: compare `{}` with the runtime's pods (e.g. `crictl pods`, `crictl inspectp`) and recreate the pods whose address is not listed.",
                command("leases", &data_dir.join(n))
            );
            if self.repaired.is_none() {
                let _ = writeln!(
                    o,
                    "  The files are unchanged; until they are repaired the network refuses requests (CNI error 5). Run `{} --repair` to keep the valid records.",
                    command("fsck", &data_dir.join(n))
                );
            }
        }
        o
    }
}
