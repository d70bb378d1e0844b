//! Reading our sets and changing them in one transaction, with ownership.
//!
//! A call reads what it needs (single-key GETs, or a dump of a set on
//! DEL/GC), plans its changes into a [`Tx`], and commits the Tx as one batch
//! tagged with the ruleset generation it read. If anything changed the
//! ruleset in between, the kernel refuses the batch (ERESTART) and the call
//! starts over, so the read and the write are atomic. cnikit's own calls also
//! queue on a lock file, so they do not keep restarting each other.

use super::expr::Expr;
use super::nft::{self, BaseHook, Element, Table};
use super::sets::SetDef;
use super::socket::{Nfnl, Sockets};
use super::tag;
use super::turn::lock;
use super::{Error, ErrorKind, Result};
use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP};
use netlink_packet_netfilter::NetfilterMessage;

/// Elements per NEWSETELEM/DELSETELEM message. A netlink attribute's length
/// is 16 bits: a tagged element is up to ~300 bytes, so a GC freeing
/// hundreds of attachments must be split (the messages stay in one batch,
/// so the change is still atomic).
const ELEMS_PER_MESSAGE: usize = 100;
/// Restarts after a generation change by someone else (not cnikit) before
/// giving up.
const MAX_TRIES: usize = 20;

/// The messages of one transaction, each with a description for errors.
#[derive(Default)]
pub(crate) struct Tx {
    msgs: Vec<(NetfilterMessage, u16, String)>,
    /// Which of `msgs` remove elements (see `Nft::commit`).
    removals: Vec<usize>,
    /// The chains and sets this batch creates.
    chains: Vec<(Table, String)>,
    sets: Vec<String>,
    /// The iptables rules it adds, by chain (`rules.rs`).
    pub(super) xt_rules: Vec<(String, super::xt::XtRule)>,
}

impl Tx {
    pub(crate) fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// How many changes it holds.
    pub(crate) fn len(&self) -> usize {
        self.msgs.len()
    }

    /// Where the plan is now, to go back to with [`Tx::rewind`]: a repair
    /// keeps an attachment's part of the plan only when all of it could be
    /// made.
    pub(crate) fn mark(&self) -> Mark {
        Mark([
            self.msgs.len(),
            self.removals.len(),
            self.chains.len(),
            self.sets.len(),
            self.xt_rules.len(),
        ])
    }

    /// Drops everything planned since `mark`.
    pub(crate) fn rewind(&mut self, Mark([msgs, removals, chains, sets, xt]): Mark) {
        self.msgs.truncate(msgs);
        self.removals.truncate(removals);
        self.chains.truncate(chains);
        self.sets.truncate(sets);
        self.xt_rules.truncate(xt);
    }

    pub(super) fn push(&mut self, msg: NetfilterMessage, flags: u16, what: String) {
        self.msgs.push((msg, flags, what));
    }

    /// Like `push`, for a message that removes something: if that is gone
    /// by commit time, the plan was stale and is made again.
    pub(super) fn push_removal(&mut self, msg: NetfilterMessage, what: String) {
        self.removals.push(self.msgs.len());
        self.push(msg, 0, what);
    }

    pub(crate) fn new_table(&mut self, t: Table) {
        self.push(
            nft::new_table(t),
            NLM_F_CREATE,
            format!("create table {}", t.name),
        );
    }

    pub(crate) fn new_set(&mut self, t: Table, set: &SetDef) {
        // The id names the set within the batch; each one's own.
        let id = u32::try_from(self.sets.len() + 1).unwrap_or(u32::MAX);
        self.push(
            nft::new_set(t, &set.spec(id)),
            NLM_F_CREATE,
            format!("create set {}", set.name),
        );
        self.sets.push(set.name.to_string());
    }

    /// Whether this batch already creates set `name`.
    pub(crate) fn creates_set(&self, name: &str) -> bool {
        self.sets.iter().any(|s| s == name)
    }

    pub(crate) fn new_chain(&mut self, t: Table, name: &str, hook: Option<BaseHook>) {
        let msg = nft::new_chain(t, name, hook);
        self.push(msg, NLM_F_CREATE, format!("create chain {name}"));
        self.chains.push((t, name.to_string()));
    }

    /// Whether this batch already creates chain `name` of `t`.
    pub(crate) fn creates_chain(&self, t: Table, name: &str) -> bool {
        self.chains.iter().any(|(ct, c)| *ct == t && c == name)
    }

    pub(crate) fn delete_chain(&mut self, t: Table, name: &str) {
        let msg = nft::delete_chain(t, name);
        self.push(msg, 0, format!("delete chain {name}"));
    }

    pub(crate) fn delete_set(&mut self, t: Table, name: &str) {
        let msg = nft::delete_set(t, name);
        self.push(msg, 0, format!("delete set {name}"));
    }

    pub(crate) fn flush_chain(&mut self, t: Table, name: &str) {
        self.push(nft::flush_chain(t, name), 0, format!("flush chain {name}"));
    }

    pub(crate) fn new_rule(&mut self, t: Table, chain: &str, exprs: Vec<Expr>) {
        let msg = nft::new_rule(t, chain, exprs);
        // APPEND: rules keep the order they are given in (specific hostIP first).
        self.push(
            msg,
            NLM_F_CREATE | NLM_F_APPEND,
            format!("add rule to chain {chain}"),
        );
    }

    pub(crate) fn add(&mut self, t: Table, set: &SetDef, elems: Vec<Element>) {
        for chunk in elems.chunks(ELEMS_PER_MESSAGE) {
            let msg = nft::set_elems(t, &set.name, chunk, true);
            self.push(
                msg,
                NLM_F_CREATE,
                format!("add elements to set {}", set.name),
            );
        }
    }

    pub(crate) fn del(&mut self, t: Table, set: &SetDef, elems: Vec<Element>) {
        for chunk in elems.chunks(ELEMS_PER_MESSAGE) {
            let msg = nft::set_elems(t, &set.name, chunk, false);
            self.push_removal(msg, format!("delete elements from set {}", set.name));
        }
    }
}

/// A point in a plan ([`Tx::mark`]).
#[derive(Clone, Copy)]
pub(crate) struct Mark([usize; 5]);

/// Reads and commits on a netfilter socket of this process (see
/// `socket.rs` for why it is kept open).
pub(crate) struct Nft<'a> {
    pub(super) nl: &'a mut Nfnl,
    /// Chains' rules as read, when the plan reads them once only (`rules.rs`).
    pub(super) rules_read: Option<std::collections::HashMap<String, Vec<Vec<u8>>>>,
}

impl Nft<'_> {
    fn generation(&mut self) -> Result<u32> {
        let replies = self
            .nl
            .request(nft::get_gen(), 0)
            .map_err(|f| f.context("read the nftables ruleset generation"))?;
        replies
            .iter()
            .find_map(|r| nft::gen_id(&r.payload))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Other,
                    "the kernel sent no nftables generation id",
                )
            })
    }

    /// The element with exactly `key` (hash sets), if any. A missing table or
    /// set simply has no elements.
    pub(crate) fn get(&mut self, t: Table, set: &SetDef, key: &[u8]) -> Result<Option<Element>> {
        match self.nl.request(nft::get_elems(t, &set.name, Some(key)), 0) {
            Ok(replies) => Ok(replies
                .iter()
                .flat_map(|r| nft::elements_of(&r.payload))
                .next()),
            Err(f) if f.errno() == Some(libc::ENOENT) => Ok(None),
            Err(f) => Err(f.context(&format!("read set {}", set.name)).into()),
        }
    }

    /// Every element of a set.
    pub(crate) fn dump(&mut self, t: Table, set: &SetDef) -> Result<Vec<Element>> {
        match self
            .nl
            .request(nft::get_elems(t, &set.name, None), NLM_F_DUMP)
        {
            Ok(replies) => Ok(replies
                .iter()
                .flat_map(|r| nft::elements_of(&r.payload))
                .collect()),
            Err(f) if f.errno() == Some(libc::ENOENT) => Ok(Vec::new()),
            Err(f) => Err(f.context(&format!("list set {}", set.name)).into()),
        }
    }

    pub(crate) fn chain_exists(&mut self, t: Table, name: &str) -> Result<bool> {
        match self.nl.request(nft::get_chain(t, name), 0) {
            Ok(_) => Ok(true),
            Err(f) if f.errno() == Some(libc::ENOENT) => Ok(false),
            Err(f) => Err(f.context(&format!("read chain {name}")).into()),
        }
    }

    pub(crate) fn set_exists(&mut self, t: Table, name: &str) -> Result<bool> {
        match self.nl.request(nft::get_set(t, name), 0) {
            Ok(_) => Ok(true),
            Err(f) if f.errno() == Some(libc::ENOENT) => Ok(false),
            Err(f) => Err(f.context(&format!("read set {name}")).into()),
        }
    }

    /// Ok(false): what the plan read is stale — the generation changed since
    /// `genid`, or an element it removes is already gone (another writer got
    /// there first) — and nothing was applied: plan again.
    fn commit(&mut self, tx: Tx, genid: u32) -> Result<bool> {
        let removals = tx.removals;
        let mut whats = Vec::with_capacity(tx.msgs.len());
        let mut msgs = Vec::with_capacity(tx.msgs.len());
        for (msg, flags, what) in tx.msgs {
            msgs.push((msg, flags));
            whats.push(what);
        }
        match self.nl.batch(msgs, Some(genid)) {
            Ok(()) => Ok(true),
            Err(f) if f.failure.errno() == Some(libc::ERESTART) => Ok(false),
            Err(f)
                if f.failure.errno() == Some(libc::ENOENT)
                    && f.index.is_some_and(|i| removals.contains(&i)) =>
            {
                Ok(false)
            }
            Err(f) => {
                let what = f.index.and_then(|i| whats.get(i).map(String::as_str));
                let what = what.unwrap_or("apply nftables changes");
                Err(f
                    .failure
                    .context(&format!("{what} (nothing was changed)"))
                    .into())
            }
        }
    }
}

/// Runs `plan` (read state, fill the Tx) and commits its Tx atomically,
/// re-planning when the ruleset changed in between. An empty plan sends
/// nothing.
pub(crate) fn transact(
    sockets: &Sockets,
    mut plan: impl FnMut(&mut Nft, &mut Tx) -> Result<()>,
) -> Result<()> {
    sockets.with(|nl| {
        let _turn = lock();
        let mut nft = Nft {
            nl,
            rules_read: None,
        };
        for _ in 0..MAX_TRIES {
            let genid = nft.generation()?;
            let mut tx = Tx::default();
            plan(&mut nft, &mut tx)?;
            if tx.is_empty() || nft.commit(tx, genid)? {
                return Ok(());
            }
        }
        Err(Error::new(
            ErrorKind::Other,
            "the nftables ruleset kept changing under us; nothing was changed, try again",
        ))
    })
}

/// Runs `f` on the current ruleset, changing nothing (CHECK).
pub(crate) fn read<T>(sockets: &Sockets, f: impl FnOnce(&mut Nft) -> Result<T>) -> Result<T> {
    sockets.with(|nl| {
        f(&mut Nft {
            nl,
            rules_read: None,
        })
    })
}

// ------------------------------------------------------------------ ownership

/// An element tagged with its owner.
pub(crate) fn owned(key: Vec<u8>, data: Option<Vec<u8>>, owner: &str) -> Element {
    Element {
        key,
        key_end: None,
        data,
        goto: None,
        userdata: tag::userdata(owner),
    }
}

pub(crate) fn owner_of(e: &Element) -> Option<String> {
    tag::from_userdata(&e.userdata)
}

/// An element only one attachment may hold (a host port): another owner is
/// a conflict; our own with another value is replaced.
pub(crate) fn claim_exclusive(
    nft: &mut Nft,
    tx: &mut Tx,
    t: Table,
    set: &SetDef,
    want: Element,
    what: &str,
) -> Result<()> {
    let ours = owner_of(&want);
    match nft.get(t, set, &want.key)? {
        Some(have) if owner_of(&have) != ours => Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "{what} is already mapped by {}; nothing was changed",
                owner_of(&have).map_or("an entry cnikit did not tag".into(), |o| tag::describe(&o))
            ),
        )),
        Some(have) if have.data == want.data => Ok(()),
        Some(have) => {
            tx.del(t, set, vec![have]);
            tx.add(t, set, vec![want]);
            Ok(())
        }
        None => {
            tx.add(t, set, vec![want]);
            Ok(())
        }
    }
}

/// An element keyed by something a new attachment may inherit from a stale
/// one (a reused container address or port name). The newest claimant takes
/// it over, so the old owner's later DEL (which removes only what it owns)
/// cannot remove what the new one relies on.
pub(crate) fn claim_anchor(
    nft: &mut Nft,
    tx: &mut Tx,
    t: Table,
    anchor: (&SetDef, Element),
) -> Result<()> {
    let (set, want) = anchor;
    if let Some(have) = nft.get(t, set, &want.key)? {
        if owner_of(&have) == owner_of(&want) && have.data == want.data && have.goto == want.goto {
            // Ours as it should be (a repeated ADD): nothing to change.
            return Ok(());
        }
        tx.del(t, set, vec![have]);
    }
    tx.add(t, set, vec![want]);
    Ok(())
}

/// DEL by the keys its ADD made: each element is looked up by its key and
/// removed when `owner` holds it, so no set is read whole and the cost does
/// not grow with the other attachments on the node. An element another
/// attachment has taken over since (a reused address) stays.
pub(crate) fn release_keys(
    nft: &mut Nft,
    tx: &mut Tx,
    t: Table,
    keys: &[(SetDef, Vec<u8>)],
    owner: &str,
) -> Result<()> {
    // Each element once: a batch deleting one twice would fail as a whole.
    let mut deleting = std::collections::HashSet::new();
    let mut read_whole = std::collections::HashSet::new();
    for (set, key) in keys {
        let name = set.name.as_ref();
        if read_whole.contains(name) || deleting.contains(&(name, key.clone())) {
            continue;
        }
        let ours = match nft.get(t, set, key) {
            Ok(have) => have
                .filter(|e| owner_of(e).as_deref() == Some(owner))
                .into_iter()
                .collect(),
            // A kernel that cannot look this set up by key: the set is read
            // whole once and gone through by tag, so DEL still removes what
            // is ours.
            Err(_) => {
                read_whole.insert(name);
                nft.dump(t, set)?
                    .into_iter()
                    .filter(|e| owner_of(e).as_deref() == Some(owner))
                    .collect::<Vec<_>>()
            }
        };
        let fresh: Vec<Element> = ours
            .into_iter()
            .filter(|e: &Element| deleting.insert((name, e.key.clone())))
            .collect();
        if !fresh.is_empty() {
            tx.del(t, set, fresh);
        }
    }
    Ok(())
}

/// The GC predicate: tags of `network` that belong to no valid attachment.
pub(crate) fn not_valid(network: &str, valid: &[tag::Attachment]) -> impl Fn(&str) -> bool {
    let prefix = tag::network_prefix(network);
    let keep: Vec<String> = valid.iter().map(tag::Attachment::tag).collect();
    move |owner: &str| owner.starts_with(&prefix) && !keep.iter().any(|k| k == owner)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
