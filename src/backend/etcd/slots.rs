//! The keys of a name's slots and waiters, and the transactions that take a slot: the
//! pure part of the etcd backend's acquire, without I/O. Part of [`super`]; depends on
//! [`super::wire`] and [`super::value`].
//!
//! **Keys.** Slot 0 of lock `NAME` under prefix `P` is `P{NAME}`, the key of the plain
//! lock; slot `i` ≥ 1 is `P{NAME}#i` (`i` in decimal, no leading zero). With `--slots`
//! above 1, each waiter has the key `P{NAME}%ID` (ID: its lease's, 16 hex digits) on its
//! own lease: the queue, in the order of the keys' create revisions. Lock names never
//! contain `{` or `}`, and the suffixes follow the `}`: in any key the last `}` closes
//! the name and the last `{` before it opens it, so two different (prefix, name) pairs
//! never share a key, whatever bytes the prefix holds (Redis writes its keys alike).
//! The slots lie in `[P{NAME}, P{NAME}$)` (`$` follows `#`; `[P{NAME}#, P{NAME}$)` holds
//! the slots ≥ 1) and the queue in `[P{NAME}%, P{NAME}&)`: one range read sees every
//! slot, whatever N its holders were taken with, and the queue. No other lock's key
//! lies there unless another prefix begins with this lock's key `P{NAME}` followed by
//! `#` or `%` (it holds a `}`): such a key, and any key there that is neither a slot's
//! nor a waiter's in exactly the form above (`P{NAME}!`, `P{NAME}#x`: lockrun writes
//! none), is never read as one, so never counted, shown or deleted; at worst it makes a
//! transaction's range compare fail and the acquire read and try again.
//!
//! **The record** of the name's last run is `P{NAME}:last`, its last success
//! `P{NAME}:ok` ([`super::record`]): `:` follows `&`, so they lie outside both ranges,
//! and they end in neither a `}` nor a suffix above, so they are no other pair's slot
//! or waiter keys.
//!
//! **Upgrades.** Lockrun before braces wrote `PNAME`. A plain acquisition (`--slots 1`)
//! also compares that key absent and reads it as a holder of slot 0
//! ([`SlotKeys::legacy`]): an older lockrun's live lock is busy for it.
//!
//! **Taking a slot** is one or more transactions, each answered with a read of the
//! range when it does not apply:
//! 1. [`first_try`]: if no key of the name exists at all (no slot held, nobody
//!    waiting), put slot 0. With `--slots 1` this is the plain lock's one transaction,
//!    and its compare on the slots ≥ 1 keeps a plain acquirer from taking slot 0 beside
//!    a semaphore's holders. With N > 1 a failure also puts our waiter key: our place in
//!    the queue is the revision we came at.
//! 2. After a read at revision R, [`choose`]: a live holder taken with another N is a
//!    conflict (refused); else the lowest free slot below N if more slots are free than
//!    waiters came before us ([`place`]); else we are busy, and wait.
//! 3. [`take`]: put that slot (and delete our waiter key) if its key is still absent, no
//!    slot key of the name was created or changed after R (so the conflict check and
//!    the choice still hold), and the held slots below it are still the keys read (a
//!    slot freed since would be the lowest). A failure answers with a new read, and
//!    step 2 runs again. Waiters that come later only queue behind us, and those ahead
//!    that leave only move us up, so the queue needs no compare.
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

/// The keys of one lock name, for an acquirer with `--slots slots`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotKeys {
    /// `P{NAME}`: slot 0, and the start of the name's range.
    base: String,
    /// `--slots`: with more than 1, waiters queue.
    slots: u32,
    /// A plain lock's key in the layout before braces, `PNAME`, if a plain lock (see
    /// [`SlotKeys::legacy`]).
    legacy: Option<String>,
}

/// The live slot keys of a name, by slot (a key exists only while its lease lives).
pub type Held = BTreeMap<u32, KeyValue>;

/// A read of a name's keys: its slots, and its waiters (any order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Read {
    /// The slots held.
    pub held: Held,
    /// The waiters' keys.
    pub queue: Vec<KeyValue>,
}

/// Where a waiter stands in the queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// How many waiters came before it.
    pub ahead: usize,
    /// The key of the one just before it (its deletion moves this one up).
    pub next_ahead: Option<Vec<u8>>,
}

/// What a read of the name's keys allows an acquirer with `--slots N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Take this slot, the lowest free one.
    Take(u32),
    /// A live holder was taken with this N, not ours.
    Conflict(u32),
    /// Every slot below N is held, or each free one is for a waiter who came first.
    Busy,
}

impl SlotKeys {
    /// The keys of lock `name` under `prefix`, for an acquirer with `--slots slots`.
    pub fn new(prefix: &str, name: &str, slots: u32) -> SlotKeys {
        SlotKeys {
            base: format!("{prefix}{{{name}}}"),
            slots,
            legacy: (slots == 1).then(|| format!("{prefix}{name}")),
        }
    }

    /// The key an older lockrun (before braces) gave a plain lock, `PNAME`: a plain
    /// acquisition takes nothing while it exists, and reads it as a holder of slot 0,
    /// so a lock an older lockrun holds is busy for this one (an older lockrun does not
    /// see ours). It may be the old key of another pair too: then that pair's older
    /// holder makes this one wait, never the reverse. Nothing else reads or writes it
    /// (`status` and `release --force` read the name's range, where it never lies).
    pub fn legacy(&self) -> Option<&str> {
        self.legacy.as_deref()
    }

    /// Whether waiters queue (`--slots` above 1).
    pub fn queued(&self) -> bool {
        self.slots > 1
    }

    /// The key of slot `slot`.
    pub fn key(&self, slot: u32) -> String {
        match slot {
            0 => self.base.clone(),
            i => format!("{}#{i}", self.base),
        }
    }

    /// The key of the record of the name's last run: `P{NAME}:last`, after the queue
    /// (`:` follows `&`), so no range a take compares or reads holds it.
    pub fn record_key(&self) -> String {
        format!("{}:last", self.base)
    }

    /// The key of the name's last successful run: `P{NAME}:ok`, after the record's.
    pub fn ok_key(&self) -> String {
        format!("{}:ok", self.base)
    }

    /// The key of the `--once-per` period of the run with fencing token `fence`:
    /// `P{NAME}:run#FENCE` (see `period.rs`), after `:ok`.
    pub fn period_key(&self, fence: u64) -> String {
        format!("{}:run#{fence}", self.base)
    }

    /// The range of every run's period key: `[P{NAME}:run#, P{NAME}:run$)`.
    pub fn period_range(&self) -> (String, String) {
        (format!("{}:run#", self.base), format!("{}:run$", self.base))
    }

    /// The key of the waiter on lease `lease`.
    pub fn waiter_key(&self, lease: i64) -> String {
        format!("{}%{lease:016x}", self.base)
    }

    /// The first key of the name's range (slot 0's).
    pub fn start(&self) -> &[u8] {
        self.base.as_bytes()
    }

    /// The end of the name's slots, excluded: `P{NAME}$`.
    pub fn end(&self) -> Vec<u8> {
        format!("{}$", self.base).into_bytes()
    }

    /// The end of what a read covers, excluded: the slots, and the queue if waiters
    /// queue (`P{NAME}&`).
    pub fn read_end(&self) -> Vec<u8> {
        match self.queued() {
            true => format!("{}&", self.base).into_bytes(),
            false => self.end(),
        }
    }

    /// The first key of the slots ≥ 1: `P{NAME}#`.
    fn others(&self) -> Vec<u8> {
        format!("{}#", self.base).into_bytes()
    }

    /// The first key of the queue: `P{NAME}%`.
    fn queue_start(&self) -> Vec<u8> {
        format!("{}%", self.base).into_bytes()
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

    /// Whether `key` is a waiter's key of this name ([`SlotKeys::waiter_key`]): `%`
    /// and 16 lower-case hex digits after the name's key, nothing else.
    pub fn is_waiter(&self, key: &[u8]) -> bool {
        key.strip_prefix(self.base.as_bytes())
            .and_then(|rest| rest.strip_prefix(b"%"))
            .is_some_and(|id| {
                id.len() == 16 && id.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            })
    }

    /// The slot keys and waiter keys among `kvs` (a read of the name's range).
    pub fn read(&self, kvs: impl IntoIterator<Item = KeyValue>) -> Read {
        let mut read = Read::default();
        for kv in kvs {
            if let Some(slot) = self.slot_of(&kv.key) {
                read.held.insert(slot, kv);
            } else if self.legacy().is_some_and(|old| kv.key == old.as_bytes()) {
                read.held.entry(0).or_insert(kv);
            } else if self.is_waiter(&kv.key) {
                read.queue.push(kv);
            }
        }
        read
    }
}

/// Where the waiter whose key is `ours`, created at `since`, stands in `queue`.
pub fn place(queue: &[KeyValue], ours: &[u8], since: i64) -> Place {
    let ahead = || {
        queue
            .iter()
            .filter(|kv| kv.key != ours && kv.create_revision < since)
    };
    Place {
        ahead: ahead().count(),
        next_ahead: ahead()
            .max_by_key(|kv| kv.create_revision)
            .map(|kv| kv.key.clone()),
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

/// What an acquirer with `--slots slots` does after reading `held`, with `ahead`
/// waiters before it: refuse a holder taken with another N, else take the lowest free
/// slot if one is left once each of those waiters has one, else it is busy.
pub fn choose(held: &Held, slots: u32, ahead: usize) -> Choice {
    if let Some(theirs) = held
        .iter()
        .map(|(&slot, kv)| taken_with(slot, kv, slots))
        .find(|&theirs| theirs != slots)
    {
        return Choice::Conflict(theirs);
    }
    let mut free = (0..slots).filter(|slot| !held.contains_key(slot));
    match (free.clone().nth(ahead), free.next()) {
        (Some(_), Some(lowest)) => Choice::Take(lowest),
        _ => Choice::Busy,
    }
}

/// The first transaction: put slot 0 (`value`, on lease `lease`) if no key of the name
/// exists; else read them all and, if waiters queue, put our waiter key.
pub fn first_try(keys: &SlotKeys, value: &str, lease: i64) -> TxnRequest {
    let mut txn = TxnRequest {
        compare: vec![
            Compare::created_at(keys.start(), 0),
            Compare::none_in(keys.others(), keys.end()),
        ],
        success: vec![RequestOp::put(keys.key(0), value, lease)],
        failure: vec![RequestOp::range_of(keys.start(), keys.read_end())],
    };
    if keys.queued() {
        txn.compare
            .push(Compare::none_in(keys.queue_start(), keys.read_end()));
        txn.failure
            .push(RequestOp::put(keys.waiter_key(lease), "", lease));
    }
    guard_legacy(keys, &mut txn);
    txn
}

/// A plain lock's transaction also needs its [`SlotKeys::legacy`] key absent, and
/// reads it when that fails.
fn guard_legacy(keys: &SlotKeys, txn: &mut TxnRequest) {
    if let Some(old) = keys.legacy() {
        txn.compare.push(Compare::created_at(old, 0));
        txn.failure.push(RequestOp::range_of(old, b""));
    }
}

/// The transaction that takes `slot`, chosen from `held` as read at `revision`: put it
/// (and, if waiters queue, delete our waiter key) if its key is still absent, no slot
/// key of the name was created or changed since, and the held slots below it are still
/// there (up to [`MAX_TXN_COMPARES`]); else read the name's keys again.
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
    let mut success = vec![RequestOp::put(keys.key(slot), value, lease)];
    if keys.queued() {
        success.push(RequestOp::delete(keys.waiter_key(lease)));
    }
    let mut txn = TxnRequest {
        compare,
        success,
        failure: vec![RequestOp::range_of(keys.start(), keys.read_end())],
    };
    guard_legacy(keys, &mut txn);
    txn
}

#[cfg(test)]
mod tests;
