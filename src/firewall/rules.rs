//! Rules as objects of their own (in the host's iptables tables, where sets
//! cannot be used): reading a chain's rules, and adding and deleting single
//! rules inside a transaction. See `xt.rs` for the rules' form.

use super::nft::{self, Table};
use super::store::{Nft, Tx};
use super::xt::{self, Dumped, XtRule};
use super::Result;
use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP};
use netlink_packet_netfilter::nftables::{NfTablesMessage, RuleAttribute, RuleMessage};

/// Where a new rule goes in its chain.
#[derive(Debug, Clone, Copy)]
pub(crate) enum At {
    /// First in the chain.
    Top,
    /// Right after the rule with this handle.
    After(u64),
    /// Last in the chain.
    End,
}

impl Nft<'_> {
    /// The rules of `chain` in `t`, in order; a missing table or chain has none.
    pub(crate) fn rules(&mut self, t: Table, chain: &str) -> Result<Vec<Dumped>> {
        let rules = self.rule_answers(t, chain)?;
        Ok(rules.iter().filter_map(|r| xt::parse_rule(r)).collect())
    }

    /// How many rules `chain` has (none when it is missing).
    pub(crate) fn rule_count(&mut self, t: Table, chain: &str) -> Result<usize> {
        Ok(self.rule_answers(t, chain)?.len())
    }

    /// The handle of the first rule of `chain` that looks up `set`, if any.
    pub(crate) fn rule_looking_up(
        &mut self,
        t: Table,
        chain: &str,
        set: &str,
    ) -> Result<Option<u64>> {
        Ok(self
            .rule_refs(t, chain)?
            .into_iter()
            .find(|r| r.sets.iter().any(|s| s == set))
            .and_then(|r| r.handle))
    }

    /// From now on until the next call, each chain's rules are read once: a
    /// plan that reads a chain per attachment (a repair of hundreds) reads
    /// it whole only once. What the plan adds is in its Tx
    /// ([`Tx::adds_xt_rule`]).
    pub(crate) fn read_rules_once(&mut self) {
        self.rules_read = Some(Default::default());
    }

    /// Per rule of `chain`, in order: the sets it looks up and the chains
    /// its verdicts send to. A missing table or chain has no rules.
    pub(crate) fn rule_refs(&mut self, t: Table, chain: &str) -> Result<Vec<nft::RuleRefs>> {
        let rules = self.rule_answers(t, chain)?;
        Ok(rules.iter().map(|r| nft::rule_refs(r)).collect())
    }

    /// The NEWRULE answers (payloads) of a dump of `chain`.
    fn rule_answers(&mut self, t: Table, chain: &str) -> Result<Vec<Vec<u8>>> {
        let Some(seen) = &self.rules_read else {
            return self.dump_rules(t, chain);
        };
        let at = chain_key(t, chain);
        if let Some(rules) = seen.get(&at) {
            return Ok(rules.clone());
        }
        let rules = self.dump_rules(t, chain)?;
        if let Some(seen) = &mut self.rules_read {
            seen.insert(at, rules.clone());
        }
        Ok(rules)
    }

    fn dump_rules(&mut self, t: Table, chain: &str) -> Result<Vec<Vec<u8>>> {
        let msg = rule_message(t, chain, vec![]);
        match self.nl.request(
            nft::message(t.family, NfTablesMessage::GetRule(msg)),
            NLM_F_DUMP,
        ) {
            Ok(replies) => Ok(replies.into_iter().map(|r| r.payload).collect()),
            Err(f) if f.errno() == Some(libc::ENOENT) => Ok(Vec::new()),
            Err(f) => Err(f
                .context(&format!(
                    "list the rules of chain {chain} in table {}",
                    t.name
                ))
                .into()),
        }
    }
}

/// Names a chain of a table of a family.
fn chain_key(t: Table, chain: &str) -> String {
    format!("{:?} {} {chain}", t.family, t.name)
}

impl Tx {
    /// Whether this batch adds `rule` to `chain` already.
    pub(crate) fn adds_xt_rule(&self, t: Table, chain: &str, rule: &XtRule) -> bool {
        let at = chain_key(t, chain);
        self.xt_rules.iter().any(|(c, r)| *c == at && r == rule)
    }

    pub(crate) fn add_xt_rule(&mut self, t: Table, chain: &str, rule: &XtRule, at: At) {
        self.xt_rules.push((chain_key(t, chain), rule.clone()));
        let mut attrs = Vec::new();
        let mut flags = NLM_F_CREATE;
        match at {
            At::Top => {}
            At::After(handle) => {
                attrs.push(RuleAttribute::Position(handle));
                flags |= NLM_F_APPEND;
            }
            At::End => flags |= NLM_F_APPEND,
        }
        attrs.push(RuleAttribute::Expressions(rule.exprs()));
        attrs.push(RuleAttribute::Compat(xt::compat()));
        let msg = nft::message(
            t.family,
            NfTablesMessage::NewRule(rule_message(t, chain, attrs)),
        );
        self.push(
            msg,
            flags,
            format!("add a rule to chain {chain} of table {}", t.name),
        );
    }

    pub(crate) fn delete_rule(&mut self, t: Table, chain: &str, handle: u64) {
        let msg = rule_message(t, chain, vec![RuleAttribute::Handle(handle)]);
        let msg = nft::message(t.family, NfTablesMessage::DeleteRule(msg));
        self.push_removal(
            msg,
            format!("delete rule {handle} of chain {chain} in table {}", t.name),
        );
    }
}

fn rule_message(t: Table, chain: &str, mut more: Vec<RuleAttribute>) -> RuleMessage {
    let mut attributes = vec![
        RuleAttribute::Table(t.name.into()),
        RuleAttribute::Chain(chain.into()),
    ];
    attributes.append(&mut more);
    RuleMessage { attributes }
}
