//! The statements of the MySQL backend, and the pure reading of a name's rows into
//! what an acquisition does. No I/O; part of [`super`].

use std::time::Duration;

use crate::backend::{Holder, MAX_SLOTS};

/// The database's clock in milliseconds since the Unix epoch: the statement's own
/// `NOW(3)` (one value for the whole statement, never later than the real time of the
/// check), read in UTC (the session's `time_zone` is `+00:00`, so no daylight saving
/// time folds it).
pub(super) const NOW_MS: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS UNSIGNED)";

/// How long a row stays once its lease ended and its record's keep passed: a day.
/// Tokens come from the counter row, which is never deleted, so they keep increasing.
pub(super) const RETENTION_MS: u64 = 24 * 3600 * 1000;

/// How many unused rows an acquisition that adds a row deletes at most: more than the
/// one it adds, so a backlog drains, and few, so the step stays short.
pub(super) const SWEEP_BATCH: u32 = 4;

/// The statements, with the table's name in them.
pub(super) struct Sql {
    /// Creates the table if it is missing, and its counter row.
    pub setup: Vec<String>,
    /// Takes the row lock of a name's row (`?` its key), making the row if missing.
    pub lock_name: String,
    /// Every row of a name (`?`: its key, its key `#`, its key `$`), with the clock.
    pub rows: String,
    /// The next fencing token (read from `LAST_INSERT_ID()`).
    pub next_fence: String,
    /// Takes a slot's row (made by [`Sql::lock_name`]): token, fence, host, pid, ttl ms,
    /// slots, key.
    pub take: String,
    /// Extends a lease: ttl ms, key, token.
    pub renew: String,
    /// Frees or keeps a row: expiry (ms, 0 frees), token ('' frees), key.
    pub end: String,
    /// Writes the record on the name's row: JSON, kept until (ms), key.
    pub record: String,
    /// Joins or keeps a place in the queue: key, ticket, alive until (ms), the same again.
    pub queue: String,
    /// Deletes rows by key.
    pub delete: String,
    /// Up to [`SWEEP_BATCH`] keys of rows unused for [`RETENTION_MS`] (lease ended and
    /// record kept that long ago), locked, skipping rows another step has locked, none
    /// of the name being taken (`?` as in [`Sql::rows`]).
    pub unused: String,
    /// The name rows under a prefix (`?`: `PREFIX{`, `PREFIX|`), live or recorded.
    pub names: String,
}

impl Sql {
    pub fn new(table: &str) -> Sql {
        let t = format!("`{table}`");
        Sql {
            setup: vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} ( \
                       lock_key VARBINARY(700) NOT NULL PRIMARY KEY, \
                       token VARBINARY(64) NOT NULL DEFAULT '', \
                       fence BIGINT UNSIGNED NOT NULL DEFAULT 0, \
                       host VARBINARY(255) NOT NULL DEFAULT '', \
                       pid INT UNSIGNED NOT NULL DEFAULT 0, \
                       since_ms BIGINT UNSIGNED NOT NULL DEFAULT 0, \
                       expires_ms BIGINT UNSIGNED NOT NULL DEFAULT 0, \
                       slots INT UNSIGNED NOT NULL DEFAULT 1, \
                       record VARBINARY(2048) NULL, \
                       record_ms BIGINT UNSIGNED NOT NULL DEFAULT 0 \
                     ) ENGINE=InnoDB"
                ),
                format!("INSERT IGNORE INTO {t} (lock_key, fence) VALUES ('', 0)"),
            ],
            lock_name: format!(
                "INSERT INTO {t} (lock_key) VALUES (?) ON DUPLICATE KEY UPDATE lock_key = lock_key"
            ),
            rows: format!(
                "SELECT lock_key, token, fence, host, pid, since_ms, expires_ms, slots, record, \
                   record_ms, {NOW_MS} FROM {t} \
                 WHERE lock_key = ? OR (lock_key > ? AND lock_key < ?) FOR UPDATE"
            ),
            next_fence: format!(
                "INSERT INTO {t} (lock_key, fence) VALUES ('', LAST_INSERT_ID(1)) \
                 ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1)"
            ),
            take: format!(
                "UPDATE {t} SET token = ?, fence = ?, host = ?, pid = ?, since_ms = {NOW_MS}, \
                   expires_ms = {NOW_MS} + ?, slots = ? WHERE lock_key = ?"
            ),
            renew: format!(
                "UPDATE {t} SET expires_ms = {NOW_MS} + ? \
                 WHERE lock_key = ? AND token = ? AND token <> '' AND expires_ms > {NOW_MS}"
            ),
            end: format!("UPDATE {t} SET expires_ms = ?, token = ? WHERE lock_key = ?"),
            record: format!("UPDATE {t} SET record = ?, record_ms = ? WHERE lock_key = ?"),
            queue: format!(
                "INSERT INTO {t} (lock_key, fence, expires_ms) VALUES (?, ?, ?) \
                 ON DUPLICATE KEY UPDATE expires_ms = ?"
            ),
            delete: format!("DELETE FROM {t} WHERE lock_key = ?"),
            unused: format!(
                "SELECT lock_key FROM {t} WHERE lock_key <> '' \
                 AND NOT (lock_key = ? OR (lock_key > ? AND lock_key < ?)) \
                 AND expires_ms < {NOW_MS} - {RETENTION_MS} AND record_ms < {NOW_MS} - {RETENTION_MS} \
                 LIMIT {SWEEP_BATCH} FOR UPDATE SKIP LOCKED"
            ),
            names: format!(
                "SELECT lock_key FROM {t} WHERE lock_key >= ? AND lock_key < ? \
                 AND (expires_ms > {NOW_MS} OR record_ms > {NOW_MS})"
            ),
        }
    }
}

/// One row of a name, as [`Sql::rows`] reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Row {
    pub key: Vec<u8>,
    pub token: String,
    pub fence: u64,
    pub host: String,
    pub pid: u32,
    pub since_ms: u64,
    pub expires_ms: u64,
    pub slots: u32,
    pub record: Option<String>,
    pub record_ms: u64,
}

/// What a row of a name is, by its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Part {
    /// A slot's lease (0: the name's own row).
    Slot(u32),
    /// A waiter's place in the queue (its id).
    Waiter(String),
    /// Anything else (not ours to read).
    Other,
}

/// The key of slot `slot` of the lock whose key is `key`.
pub(super) fn slot_key(key: &str, slot: u32) -> String {
    match slot {
        0 => key.to_owned(),
        i => format!("{key}#{i}"),
    }
}

/// The key of waiter `id`'s place in the queue of the lock whose key is `key`.
pub(super) fn waiter_key(key: &str, id: &str) -> String {
    format!("{key}#w:{id}")
}

/// What the row of key `row_key` is, for the lock whose key is `key`.
pub(super) fn part(key: &str, row_key: &[u8]) -> Part {
    let Some(rest) = row_key.strip_prefix(key.as_bytes()) else {
        return Part::Other;
    };
    let rest = String::from_utf8_lossy(rest);
    match rest.strip_prefix('#') {
        None if rest.is_empty() => Part::Slot(0),
        None => Part::Other,
        Some(w) if w.starts_with("w:") => Part::Waiter(w[2..].to_owned()),
        Some(d) if !d.is_empty() && d.len() <= 4 && d.bytes().all(|b| b.is_ascii_digit()) => {
            match d.parse::<u32>() {
                Ok(i) if (1..MAX_SLOTS).contains(&i) && !d.starts_with('0') => Part::Slot(i),
                _ => Part::Other,
            }
        }
        Some(_) => Part::Other,
    }
}

/// A name's rows at one instant, read under the name's row lock.
#[derive(Debug, Default)]
pub(super) struct Name {
    /// The database's clock when they were read.
    pub now: u64,
    /// The name's own row (slot 0's lease, the record).
    pub head: Option<Row>,
    /// Every slot's row, by slot (slot 0 included).
    pub slots: Vec<(u32, Row)>,
    /// Live places in the queue: (id, ticket).
    pub waiters: Vec<(String, u64)>,
    /// Places whose waiter stopped asking.
    pub lapsed: Vec<String>,
}

impl Name {
    /// Sorts `rows` (of the lock whose key is `key`) out, as of `now`.
    pub fn new(key: &str, rows: Vec<Row>, now: u64) -> Name {
        let mut name = Name {
            now,
            ..Name::default()
        };
        for row in rows {
            match part(key, &row.key) {
                Part::Slot(i) => {
                    if i == 0 {
                        name.head = Some(row.clone());
                    }
                    name.slots.push((i, row));
                }
                Part::Waiter(id) if row.expires_ms > now => name.waiters.push((id, row.fence)),
                Part::Waiter(id) => name.lapsed.push(id),
                Part::Other => {}
            }
        }
        name.slots.sort_by_key(|(i, _)| *i);
        name.waiters
            .sort_by_key(|(id, ticket)| (*ticket, id.clone()));
        name
    }

    /// True when `row` is a live lease.
    pub fn live(&self, row: &Row) -> bool {
        !row.token.is_empty() && row.expires_ms > self.now
    }

    /// Every live holder, by slot.
    pub fn holders(&self) -> Vec<Holder> {
        self.slots
            .iter()
            .filter(|(_, r)| self.live(r))
            .map(|(i, r)| self.holder(*i, r))
            .collect()
    }

    /// The holder of slot `slot`'s row `r`.
    pub fn holder(&self, slot: u32, r: &Row) -> Holder {
        Holder {
            host: r.host.clone(),
            pid: r.pid,
            since_ms: r.since_ms,
            fencing_token: r.fence,
            ttl_left: Duration::from_millis(r.expires_ms.saturating_sub(self.now)),
            slot,
            slots: r.slots.max(1),
        }
    }

    /// The N of a live holder taken with another `--slots` than `slots`, if any
    /// (every slot's row is read, so a plain lock sees a semaphore held in any slot).
    pub fn conflict(&self, slots: u32) -> Option<u32> {
        self.slots
            .iter()
            .find(|(_, r)| self.live(r) && r.slots.max(1) != slots)
            .map(|(_, r)| r.slots.max(1))
    }

    /// The live waiters before waiter `me` (all of them when it has no place).
    pub fn ahead(&self, me: &str) -> u64 {
        let mine = self.waiters.iter().position(|(id, _)| id == me);
        mine.unwrap_or(self.waiters.len()) as u64
    }

    /// Our place's ticket, if we have one.
    pub fn ticket(&self, me: &str) -> Option<u64> {
        self.waiters
            .iter()
            .find(|(id, _)| id == me)
            .map(|(_, t)| *t)
    }

    /// The slot an acquisition of `slots` slots by waiter `me` takes: the lowest
    /// free one, when fewer live waiters are ahead of it than slots are free; `None`
    /// when it must wait.
    pub fn free_slot(&self, slots: u32, me: &str) -> Option<u32> {
        let busy: Vec<u32> = self
            .slots
            .iter()
            .filter(|(_, r)| self.live(r))
            .map(|(i, _)| *i)
            .collect();
        let free: Vec<u32> = (0..slots).filter(|i| !busy.contains(i)).collect();
        (self.ahead(me) < free.len() as u64).then(|| free[0])
    }

    /// The holder a waiter waits for: the live one whose lease ends first, or an
    /// empty one (a free lock with waiters before us).
    pub fn first_to_end(&self) -> Holder {
        self.holders()
            .into_iter()
            .min_by_key(|h| h.ttl_left)
            .unwrap_or_default()
    }

    /// The row holding `token`, live, and its slot.
    pub fn find(&self, token: &str) -> Option<(u32, &Row)> {
        self.slots
            .iter()
            .find(|(_, r)| self.live(r) && r.token == token)
            .map(|(i, r)| (*i, r))
    }
}

#[cfg(test)]
mod tests;
