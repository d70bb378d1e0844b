//! One network's leases in memory, rebuilt from snapshot + journal by applying records in
//! order. Applying is deterministic, so every process that replays the same files ends up
//! with the same state, whichever process wrote them.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use crate::journal::{Holder, Record};
use crate::log::Level;
use crate::log_at;
use crate::snapshot::Snapshot;

/// `(container ID, ifname)`: the key within one network.
pub(crate) type Key = (String, String);

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct State {
    pub holders: BTreeMap<Key, Holder>,
    pub by_addr: HashMap<IpAddr, Key>,
    pub last: BTreeMap<u32, IpAddr>,
}

impl State {
    pub fn from_snapshot(snap: Snapshot) -> State {
        let mut st = State {
            last: snap.last,
            ..State::default()
        };
        for h in snap.holders {
            st.insert(h, false);
        }
        st
    }

    pub fn to_snapshot(&self, generation: u64) -> Snapshot {
        Snapshot {
            version: crate::snapshot::VERSION,
            generation,
            holders: self.holders.values().cloned().collect(),
            last: self.last.clone(),
        }
    }

    pub fn apply(&mut self, rec: Record) {
        match rec {
            Record::Alloc(h) => self.insert(h, true),
            Record::Release { keys } => {
                for k in keys {
                    self.remove(&k);
                }
            }
        }
    }

    fn insert(&mut self, h: Holder, advance_last: bool) {
        let key = (h.cid.clone(), h.ifname.clone());
        // Writers never record a second allocation for a held key or a held address, so
        // these branches only run on hand-edited or foreign files; last writer wins and no
        // address ends up with two holders.
        if self.holders.contains_key(&key) {
            log_at!(
                Level::Warn,
                "journal re-allocates {}/{}; replacing",
                key.0,
                key.1
            );
            self.remove(&key);
        }
        for l in &h.leases {
            let a = l.addr.addr();
            if let Some(other) = self.by_addr.get(&a).cloned() {
                log_at!(
                    Level::Warn,
                    "journal gives {a} to {}/{} while {}/{} holds it; moving it",
                    key.0,
                    key.1,
                    other.0,
                    other.1
                );
                if let Some(oh) = self.holders.get_mut(&other) {
                    oh.leases.retain(|x| x.addr.addr() != a);
                }
            }
            self.by_addr.insert(a, key.clone());
            if advance_last {
                self.last.insert(l.rs, a);
            }
        }
        self.holders.insert(key, h);
    }

    pub fn remove(&mut self, key: &Key) -> usize {
        match self.holders.remove(key) {
            Some(h) => {
                for l in &h.leases {
                    self.by_addr.remove(&l.addr.addr());
                }
                h.leases.len()
            }
            None => 0,
        }
    }
}
