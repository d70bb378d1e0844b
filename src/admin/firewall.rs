//! `cnikit firewall`: the firewall state cnikit keeps for the pods.

use crate::firewall::repair::{self, Repaired};
use crate::firewall::Sockets;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum FirewallCmd {
    /// Put back the host ports, masquerade, MAC spoof checks and firewall
    /// plugin rules that the attachments' records say the running pods hold
    /// (after `nft flush ruleset`, a firewall reload, `iptables -F FORWARD`),
    /// in one batch. The ipamd daemon does the same by itself whenever
    /// another process removes any of it. Changes nothing when everything is
    /// in place; exits 0 then too.
    Restore {
        /// Print what was found and done as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: FirewallCmd) -> Result<(), String> {
    match command {
        FirewallCmd::Restore { json } => {
            let done = repair::restore(&Sockets::default()).map_err(|e| e.to_string())?;
            if json {
                let text = serde_json::to_string_pretty(&done).map_err(|e| e.to_string())?;
                println!("{text}");
            } else {
                print!("{}", render(&done));
            }
            Ok(())
        }
    }
}

fn render(done: &Repaired) -> String {
    let mut out = if done.changes == 0 {
        format!(
            "firewall: nothing to put back ({} recorded, all in place)\n",
            attachments(done.attachments)
        )
    } else {
        format!(
            "firewall: put back what {} of {} lacked ({} changes in one batch): {}\n",
            done.restored.len(),
            attachments(done.attachments),
            done.changes,
            done.restored.join(", ")
        )
    };
    for (who, why) in &done.skipped {
        out.push_str(&format!("firewall: not put back: {who}: {why}\n"));
    }
    if !done.keys_only.is_empty() {
        out.push_str(&format!(
            "firewall: recorded by an older cnikit with keys only, re-create these pods to get back what they lost: {}\n",
            done.keys_only.join(", ")
        ));
    }
    out
}

fn attachments(n: usize) -> String {
    match n {
        1 => "1 attachment".to_string(),
        n => format!("{n} attachments"),
    }
}
