//! The keys of a name's slots and the transactions that take one: the pure part of the
//! etcd backend's acquire, without I/O. Part of [`super`]; depends on [`super::wire`] and
//! [`super::value`].
//!
//! **Keys.** Slot 0 of lock `NAME` under prefix `P` is `PNAME`, the key of the plain
//! lock; slot `i` ≥ 1 is `PNAME#i` (`i` in decimal, no leading zero). Lock names never
//! contain `#`, so no other name's keys look like these. Every key of the name lies in
//! `[PNAME, PNAME$)` (`$` follows `#`): one range read sees every slot, whatever N its
//! holders were taken with, and `[PNAME#, PNAME$)` holds the slots ≥ 1. A key in that
//! range that is no slot key (`PNAME!`, `PNAME#x`: lockrun writes none) is ignored.
//!
//! **Taking a slot** is one or more transactions, each answered with a read of the whole
//! range when it does not apply:
//! 1. [`first_try`]: if no key of the name exists at all, put slot 0. With `--slots 1`
//!    this is the plain lock's one transaction, and its compare on the slots ≥ 1 keeps a
//!    plain acquirer from taking slot 0 beside a semaphore's holders.
//! 2. After a read at revision R, [`choose`]: a live holder taken with another N is a
//!    conflict (refused); else the lowest free slot below N; else every slot is held
//!    (busy).
//! 3. [`take`]: put that slot if its key is still absent, no key of the name was
//!    created or changed after R (so the conflict check and the choice still hold), and
//!    the held slots below it are still the keys read (a slot freed since would be the
//!    lowest). A failure answers with a new read, and step 2 runs again.
//!
//! etcd refuses a transaction of more than `--max-txn-ops` compares (128 by default):
//! the held slots below the chosen one are compared up to [`MAX_TXN_COMPARES`] in all.
//! Above that (a semaphore of more than 127 slots, nearly full), the slot taken is the
//! lowest free at the read.

use std::collections::BTreeMap;

use super::value::holder_from;
use super::wire::{Compare, KeyValue, RequestOp, TxnRequest};

/// The most compares lockrun puts in one transaction: etcd's default `--max-txn-ops`.
pub const MAX_TXN_COMPARES: usize = 128;

/// The keys of one lock name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotKeys {
    /// `PNAME`: slot 0, and the start of the name's range.
    base: String,
}

/// The live slot keys of a name, by slot (a key exists only while its lease lives).
pub type Held = BTreeMap<u32, KeyValue>;

/// What a read of the name's keys allows an acquirer with `--slots N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Take this slot, the lowest free one.
    Take(u32),
    /// A live holder was taken with this N, not ours.
    Conflict(u32),
    /// Every slot below N is held.
    Full,
}

impl SlotKeys {
    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> SlotKeys {
        SlotKeys {
            base: format!("{prefix}{name}"),
        }
    }

    /// The key of slot `slot`.
    pub fn key(&self, slot: u32) -> String {
        match slot {
            0 => self.base.clone(),
            i => format!("{}#{i}", self.base),
        }
    }

    /// The first key of the name's range (slot 0's).
    pub fn start(&self) -> &[u8] {
        self.base.as_bytes()
    }

    /// The end of the name's range, excluded: `PNAME$`.
    pub fn end(&self) -> Vec<u8> {
        format!("{}$", self.base).into_bytes()
    }

    /// The first key of the slots ≥ 1: `PNAME#`.
    fn others(&self) -> Vec<u8> {
        format!("{}#", self.base).into_bytes()
    }

    /// The slot whose key `key` is, if it is one.
    pub fn slot_of(&self, key: &[u8]) -> Option<u32> {
        let rest = key.strip_prefix(self.base.as_bytes())?;
        if rest.is_empty() {
            return Some(0);
        }
        let digits = rest.strip_prefix(b"#")?;
        let canonical = digits.first().is_some_and(|d| (b'1'..=b'9').contains(d))
            && digits.iter().all(u8::is_ascii_digit);
        if !canonical {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    }

    /// The slot keys among `kvs` (a read of the name's range), by slot.
    pub fn held(&self, kvs: impl IntoIterator<Item = KeyValue>) -> Held {
        kvs.into_iter()
            .filter_map(|kv| Some((self.slot_of(&kv.key)?, kv)))
            .collect()
    }
}

/// The N a holder at `slot` stored in `kv` was taken with, as far as a semaphore of
/// `slots` can tell: the N in its value (1 without one), or more than `slots` when it
/// sits on a slot no holder of `slots` can have.
fn taken_with(slot: u32, kv: &KeyValue, slots: u32) -> u32 {
    let theirs = holder_from(&kv.value, kv.create_revision, 0).slots;
    match theirs == slots && slot >= slots {
        true => slot.saturating_add(1),
        false => theirs,
    }
}

/// What an acquirer with `--slots slots` does after reading `held`: refuse a holder
/// taken with another N, else take the lowest free slot, else it is busy.
pub fn choose(held: &Held, slots: u32) -> Choice {
    if let Some(theirs) = held
        .iter()
        .map(|(&slot, kv)| taken_with(slot, kv, slots))
        .find(|&theirs| theirs != slots)
    {
        return Choice::Conflict(theirs);
    }
    match (0..slots).find(|slot| !held.contains_key(slot)) {
        Some(slot) => Choice::Take(slot),
        None => Choice::Full,
    }
}

/// The first transaction: put slot 0 (`value`, on lease `lease`) if no key of the name
/// exists; else read them all.
pub fn first_try(keys: &SlotKeys, value: &str, lease: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![
            Compare::created_at(keys.start(), 0),
            Compare::none_in(keys.others(), keys.end()),
        ],
        success: vec![RequestOp::put(keys.key(0), value, lease)],
        failure: vec![RequestOp::range_of(keys.start(), keys.end())],
    }
}

/// The transaction that takes `slot`, chosen from `held` as read at `revision`: put it
/// if its key is still absent, nothing of the name was created or changed since, and
/// the held slots below it are still there (up to [`MAX_TXN_COMPARES`]); else read
/// every key of the name again.
pub fn take(
    keys: &SlotKeys,
    held: &Held,
    revision: i64,
    slot: u32,
    value: &str,
    lease: i64,
) -> TxnRequest {
    let mut compare = vec![
        Compare::created_at(keys.key(slot), 0),
        Compare::unchanged_in(keys.start(), keys.end(), revision.saturating_add(1)),
    ];
    let below = held.range(..slot).map(|(_, kv)| kv);
    compare.extend(
        below
            .take(MAX_TXN_COMPARES - compare.len())
            .map(|kv| Compare::modified_at(&kv.key, kv.mod_revision)),
    );
    TxnRequest {
        compare,
        success: vec![RequestOp::put(keys.key(slot), value, lease)],
        failure: vec![RequestOp::range_of(keys.start(), keys.end())],
    }
}

#[cfg(test)]
mod tests;
