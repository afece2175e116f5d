//! The SQL the PostgreSQL backend sends: one statement a step, with the table's name
//! in it (a checked identifier, see `config::valid_table_name`), and the LISTEN/NOTIFY
//! channel names, and the lease as a statement parameter. Pure text: no I/O here.
//!
//! A plain lock (`--slots 1`) has statements on one key (`$1 text`); a semaphore's
//! statements, on the keys of its slots, are built in `slots.rs` from the parts here.
//! `status` and `release --force` have one statement for both, on the keys of slots 0
//! to N-1 (`$1 text[]`, slot `i` at index `i + 1`; a plain lock's one key).

use std::time::Duration;

use super::{records, slots};
use crate::backend::BackendError;

/// The settings of every transaction, made at its start with `SET LOCAL` (never for
/// the session: through a transaction pool such as PgBouncer's, the next transaction
/// runs on another server connection, and a session setting would stay behind on this
/// one for another client). `synchronous_commit`: an acquisition (and the sequence
/// value it used) survives a server crash once it is answered, whatever the server's
/// default. The timeouts bound what a statement abandoned by the caller's timeout can
/// still hold on the server.
pub(super) const LOCAL_SETTINGS: &str = "SET LOCAL synchronous_commit = on; \
     SET LOCAL lock_timeout = '5s'; SET LOCAL statement_timeout = '10s'; \
     SET LOCAL idle_in_transaction_session_timeout = '10s'";

/// The first message of every step's transaction: it begins, makes the
/// [`LOCAL_SETTINGS`] and, for the steps that take it, waits for the transaction-level
/// advisory lock `lock` (`slots::name_lock`). Sent with the step's statement and
/// `COMMIT` in one round trip.
pub(super) fn begin(lock: Option<i64>) -> String {
    match lock {
        None => format!("BEGIN; {LOCAL_SETTINGS}"),
        Some(id) => format!("BEGIN; {LOCAL_SETTINGS}; {}", slots::name_lock(id)),
    }
}

/// The longest lease: a longer one is refused before anything is written, so that no
/// row is held for longer.
pub(super) use crate::backend::MAX_LEASE;

/// A lease as whole milliseconds (at least 1), the statements' parameter; a refusal
/// when it is longer than [`MAX_LEASE`].
pub(super) fn millis(d: Duration) -> Result<i64, BackendError> {
    if d > MAX_LEASE {
        return Err(BackendError::Refused(format!(
            "a lease of {} is longer than the 24 h a PostgreSQL lock row may be held: \
             use a shorter --ttl or --hold-at-least",
            humantime::format_duration(d)
        )));
    }
    Ok(i64::try_from(d.as_millis().max(1)).unwrap_or(i64::MAX))
}

/// The statements, with the table's name in them. Every holder they answer is the
/// columns of [`holder`].
pub(super) struct Sql {
    pub(super) setup: String,
    /// A plain lock's: `$1` key, `$2` token, `$3` host, `$4` pid, `$5` lease, `$6` the
    /// name's limit key (`slots::limit_key`), `$7` its queue key (`slots::queue_key`),
    /// `$8` the waiter's id (empty: not waiting), `$9` how long its place lasts (ms),
    /// `$10` the name's key in the layout before braces (`keys::legacy_key`).
    pub(super) acquire: String,
    /// A plain lock's renewal: `$1` key, `$2` token, `$3` lease.
    pub(super) extend: String,
    /// A plain lock's `--hold-at-least`, leaving the run's record: as
    /// [`Sql::extend`], `$4` the record key (`records::record_key`), `$5` the run's
    /// end (`records::end_param`).
    pub(super) keep: String,
    /// A plain lock's release, leaving the run's record: `$1` key, `$2` token, `$3`
    /// channel, `$4` and `$5` as [`Sql::keep`]'s.
    pub(super) release: String,
    /// A semaphore's (`slots::acquire`), in the transaction of `slots::name_lock`:
    /// `$1` keys, `$2` stored token (`slots::stored_token`), `$3` host, `$4` pid,
    /// `$5` lease, `$6` N, `$7` limit key, `$8` queue key, `$9` the waiter's id,
    /// `$10` how long its place lasts (ms).
    pub(super) acquire_slot: String,
    /// A semaphore's renewal: `$1` keys (the slot held, or all), `$2` stored token,
    /// `$3` lease, `$4` limit key, `$5` every slot's key.
    pub(super) extend_slot: String,
    /// A semaphore's `--hold-at-least`, in the name lock's transaction: as
    /// [`Sql::extend_slot`], with `$6` the record key and `$7` the run's end.
    pub(super) keep_slot: String,
    /// A semaphore's release, in the name lock's transaction: as [`Sql::keep_slot`]
    /// with `$3` the channel.
    pub(super) release_slot: String,
    /// Every live holder: `$1` keys, `$2` limit key, `$3` N (the limit row is a holder
    /// when it records another N).
    pub(super) inspect: String,
    /// Frees every slot, in the name lock's transaction: `$1` keys, `$2` channel, `$3`
    /// limit key.
    pub(super) force: String,
    /// A waiter leaves the queue: `$1` queue key, `$2` waiter id ([`leave`]).
    pub(super) leave: String,
    /// The last run's record: `$1` the record key (`records::last_run`).
    pub(super) last_run: String,
    /// Every row key under a prefix: `$1` the prefix and `{` (`records::names`).
    pub(super) names: String,
}

/// A statement on the row of a holder's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OnToken {
    /// A renewal: a new expiry.
    Extend,
    /// `--hold-at-least` at release: a new expiry, maybe sooner than the last, and
    /// the run's record.
    Keep,
    /// Frees the row, wakes the waiters and leaves the run's record.
    Release,
}

impl Sql {
    /// The statement that does `what` for a holder of a lock of `slots` slots, and
    /// whether it runs in the transaction of the name's lock.
    pub(super) fn on_token(&self, what: OnToken, slots: u32) -> (&str, bool) {
        match (what, slots) {
            (OnToken::Extend, 1) => (&self.extend, false),
            (OnToken::Keep, 1) => (&self.keep, false),
            (OnToken::Release, 1) => (&self.release, false),
            (OnToken::Extend, _) => (&self.extend_slot, false),
            (OnToken::Keep, _) => (&self.keep_slot, true),
            (OnToken::Release, _) => (&self.release_slot, true),
        }
    }
}

/// How long a row stays after its lease ended (released, or expired after a crash)
/// before an acquisition of a new name deletes it. Far longer than any statement of
/// ours can run (`statement_timeout`, `lock_timeout` above), which is what keeps
/// tokens increasing: see the module doc of `super`.
const RETENTION: &str = "1 day";

/// How many such rows one acquisition of a new name deletes at most: more than the one
/// row it adds, so a backlog drains, and few, so the statement stays short.
const CLEANUP_BATCH: u32 = 4;

/// Milliseconds since the epoch, and left until expiry, of row `r`.
const MS_COLUMNS: &str = "(extract(epoch FROM r.since) * 1000)::bigint, \
     greatest(0, extract(epoch FROM r.expires_at - now()) * 1000)::bigint";

/// The N a row was written with, from its token (`slots::stored_token`): 1 without a
/// `/N` suffix (a plain lock, and every row an older lockrun wrote).
pub(super) const SLOTS_OF_TOKEN: &str =
    "coalesce(substring(r.token FROM '/([0-9]{1,4})$')::bigint, 1)";

// Every N fits the 4 digits [`SLOTS_OF_TOKEN`] reads.
const _: () = assert!(crate::backend::MAX_SLOTS < 10_000);

/// The columns of a holder in the statements' answers, of row `r` in slot `slot` (an
/// SQL expression): fence, host, pid, since and time left in milliseconds, slot,
/// slots. `super::PostgresBackend::holder` reads them.
pub(super) fn holder(slot: &str) -> String {
    format!("r.fence, r.host, r.pid, {MS_COLUMNS}, {slot}::bigint, {SLOTS_OF_TOKEN}")
}

/// The conflict clause of an acquisition's INSERT: a row that is there is taken only
/// if its lease has ended, with a fencing token drawn under its row lock.
pub(super) fn take_expired(seq: &str) -> String {
    format!(
        "ON CONFLICT (name) DO UPDATE SET token = excluded.token, \
           fence = nextval('{seq}'), host = excluded.host, pid = excluded.pid, \
           since = excluded.since, expires_at = excluded.expires_at \
         WHERE r.expires_at <= now()"
    )
}

/// The cleanup of an acquisition that adds a row (`when`, an SQL condition): deletes
/// a few rows whose lease ended more than [`RETENTION`] ago, none of `own` (an SQL
/// condition on `name`), skipping rows that another statement has locked: the table
/// holds about a [`RETENTION`]'s worth of names.
pub(super) fn cleanup(table: &str, when: &str, own: &str) -> String {
    format!(
        "gone AS ( \
           DELETE FROM {table} WHERE {when} \
           AND name = ANY(ARRAY( \
             SELECT name FROM {table} \
             WHERE expires_at < now() - interval '{RETENTION}' AND {own} \
             LIMIT {CLEANUP_BATCH} FOR UPDATE SKIP LOCKED)))"
    )
}

impl Sql {
    pub(super) fn new(table: &str) -> Sql {
        let seq = format!("{table}_fence");
        let by_slot = holder("k.i - 1");
        let limit = holder("0");
        let live = "r.expires_at > now() AND r.token <> ''";
        Sql {
            setup: setup(table, &seq),
            acquire: acquire(table, &seq),
            acquire_slot: slots::acquire(table, &seq),
            // Renewal: a new expiry for our lease.
            extend: format!(
                "UPDATE {table} SET expires_at = now() + $3 * interval '1 millisecond' \
                 WHERE name = $1 AND token = $2 AND expires_at > now() RETURNING 1"
            ),
            keep: on_plain_end(
                table,
                "expires_at = now() + $3 * interval '1 millisecond'",
                "1",
            ),
            release: on_plain_end(
                table,
                "token = '', expires_at = now()",
                "pg_notify($3, '')::text",
            ),
            extend_slot: slots::extend(table),
            keep_slot: slots::keep(table),
            release_slot: slots::release(table),
            // A released row (empty token) is no holder, whatever its expiry.
            inspect: format!(
                "SELECT {by_slot} \
                 FROM unnest($1::text[]) WITH ORDINALITY AS k(name, i) \
                 JOIN {table} r ON r.name = k.name WHERE {live} \
                 UNION ALL \
                 SELECT {limit} FROM {table} r \
                 WHERE r.name = $2 AND {live} AND {SLOTS_OF_TOKEN} <> $3"
            ),
            force: force(table),
            leave: leave(table),
            last_run: records::last_run(table),
            names: records::names(table),
        }
    }
}

/// The statement that ends a plain lock's run: sets `set` on our row (as
/// [`Sql::extend`] finds it), leaves the run's record from it
/// ([`records::record_cte`]: slot 0) and answers `answer` if it was ours.
fn on_plain_end(table: &str, set: &str, answer: &str) -> String {
    format!(
        "WITH ended AS ( \
           UPDATE {table} SET {set} \
           WHERE name = $1 AND token = $2 AND expires_at > now() \
           RETURNING name, fence, host, pid, since), \
         {RECORDED} \
         SELECT {answer} FROM ended",
        RECORDED = records::record_cte(table, "ended", "$4", "0", "$5"),
    )
}

/// Creates the table and its sequence when missing. One simple query, so one implicit
/// transaction: the advisory lock makes concurrent first runs create the table one
/// after the other.
fn setup(table: &str, seq: &str) -> String {
    format!(
        "SELECT pg_advisory_xact_lock(1819239283, {key}); \
         CREATE TABLE IF NOT EXISTS {table} ( \
           name text PRIMARY KEY, token text NOT NULL, fence bigint NOT NULL, \
           host text NOT NULL, pid bigint NOT NULL, since timestamptz NOT NULL, \
           expires_at timestamptz NOT NULL); \
         CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint CACHE 1",
        key = fnv1a(table.to_ascii_lowercase().as_bytes()) as i32
    )
}

/// Breaks every slot of a name (`release --force`), answering the holders removed.
/// One NOTIFY however many slots it frees: PostgreSQL folds a transaction's
/// equal notifications into one. The limit row goes with the semaphore's
/// holders (never a plain lock's: no limit row records N = 1).
fn force(table: &str) -> String {
    format!(
        "WITH lifted AS ( \
           UPDATE {table} SET token = '', expires_at = now() \
           WHERE name = $3 AND token = '/' || array_length($1::text[], 1) \
           AND expires_at > now()) \
         UPDATE {table} AS l SET token = '', expires_at = now() FROM ( \
           SELECT t.*, k.i FROM unnest($1::text[]) WITH ORDINALITY AS k(name, i) \
           JOIN {table} t ON t.name = k.name \
           WHERE t.expires_at > now() AND t.token <> '' FOR UPDATE OF t) r \
         WHERE l.name = r.name \
         RETURNING {by_slot}, pg_notify($2, '')::text",
        by_slot = holder("r.i - 1")
    )
    .replace("now()", "statement_timestamp()")
}

/// The acquire statement of a plain lock: takes the row if it is missing or expired,
/// with a fencing token taken under the row lock; otherwise answers who holds it. The
/// INSERT's nextval counts only for a name without a row.
///
/// A live limit row of the name (`slots::limit_key`: holders of a semaphore, in any
/// slot) takes nothing: it is the answer, with the semaphore's N, and the caller
/// refuses. So does a live row of the name's key in the layout before braces
/// (`keys::legacy_key`, `$10`): a holder of an older lockrun is busy, not ignored.
///
/// The queue of waiters ([`queue`]) comes first: a free lock is taken only by a caller
/// with no live waiter before it (`ahead`), and a waiter joins or stays in the queue
/// when it takes nothing. Every answer ends with that count of waiters ahead; blocked
/// by them with no live holder to answer (the lock is free, and the first waiter takes
/// it at its next try), the answer is an unknown holder, not the last one.
///
/// A name without a row (in the statement's snapshot; a one-time filter, so that an
/// acquisition of a known name scans nothing more) also cleans up ([`cleanup`]),
/// never its own queue row.
fn acquire(table: &str, seq: &str) -> String {
    let busy = holder("0");
    format!(
        "WITH {QUEUE}, \
         lim AS ( \
           SELECT * FROM {table} r \
           WHERE r.name IN ($6, $10) AND r.expires_at > now() AND r.token <> ''), \
         taken AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           SELECT $1, $2, nextval('{seq}'), $3, $4, now(), \
             now() + $5 * interval '1 millisecond' \
           WHERE NOT EXISTS (SELECT 1 FROM lim) AND (SELECT n FROM ahead) = 0 \
           {TAKE_EXPIRED} \
           RETURNING fence), \
         {REQUEUE}, \
         {GONE} \
         SELECT true, fence, '', 0::bigint, 0::bigint, 0::bigint, 0::bigint, 1::bigint, \
           (SELECT n FROM ahead) \
         FROM taken \
         UNION ALL \
         SELECT false, {busy}, (SELECT n FROM ahead) FROM lim r \
         UNION ALL \
         SELECT false, {busy}, (SELECT n FROM ahead) FROM {table} r \
         WHERE r.name = $1 AND NOT EXISTS (SELECT 1 FROM taken) \
         AND NOT EXISTS (SELECT 1 FROM lim) \
         AND ((SELECT n FROM ahead) = 0 OR r.expires_at > now() AND r.token <> '') \
         UNION ALL \
         SELECT false, {UNKNOWN}, 1::bigint, n FROM ahead \
         WHERE n > 0 AND NOT EXISTS (SELECT 1 FROM lim) AND NOT EXISTS ( \
           SELECT 1 FROM {table} WHERE name = $1 AND expires_at > now() AND token <> '')",
        QUEUE = queue(table, "$7", "$8"),
        TAKE_EXPIRED = take_expired(seq),
        REQUEUE = requeue(table, "$7", "$8", "$9"),
        GONE = cleanup(
            table,
            &format!("NOT EXISTS (SELECT 1 FROM {table} WHERE name = $1)"),
            "name <> $1 AND name <> $7"
        ),
    )
}

/// The holder columns of an answer blocked by the queue with no lock row to show:
/// nothing known, no time left (the waiter ahead takes it at its next try).
pub(super) const UNKNOWN: &str = "0::bigint, '', 0::bigint, 0::bigint, 0::bigint, 0::bigint";

/// How a waiter's entry in a queue row looks: its id (hex), `:`, and the epoch
/// millisecond its place lapses. Anything else in the row (a hand edit) is dropped.
const ENTRY: &str = "^[0-9a-f]{1,32}:[0-9]{1,15}$";

/// The database's clock (see the module doc of `super`) in epoch milliseconds.
const NOW_MS: &str = "(extract(epoch FROM now()) * 1000)::bigint";

/// The entries of the queue text `list`, as rows `(i, id, until)` in the order they
/// joined; `until` is NULL for a malformed entry (which is then never live).
fn entries(list: &str) -> String {
    format!(
        "(SELECT e.i, split_part(e.v, ':', 1) AS id, \
           CASE WHEN e.v ~ '{ENTRY}' THEN split_part(e.v, ':', 2)::bigint END AS until \
         FROM unnest(string_to_array({list}, ' ')) WITH ORDINALITY AS e(v, i))"
    )
}

/// The waiters' queue as an acquisition reads it, first come first served: the CTEs
/// `q` (the queue row `qkey`, locked FOR UPDATE: acquisitions of one name read and
/// write it one after the other, each seeing the last one's queue), `waiters` (its
/// live entries: `i`, `id`) and `ahead` (`n`: the live waiters that joined before the
/// waiter `id`, all of them for a caller not in the queue, `id` empty). A waiter's
/// place lapses when it has not tried again within its `until` (it gave up, crashed,
/// or froze): the queue never waits for the dead for long.
pub(super) fn queue(table: &str, qkey: &str, id: &str) -> String {
    format!(
        "q AS (SELECT token FROM {table} WHERE name = {qkey} FOR UPDATE), \
         waiters AS ( \
           SELECT x.i, x.id, x.until FROM q, LATERAL {e} x WHERE x.until > {NOW_MS}), \
         ahead AS ( \
           SELECT count(*) AS n FROM waiters WHERE id <> {id} \
           AND i < coalesce((SELECT min(i) FROM waiters WHERE id = {id}), {LAST}))",
        e = entries("q.token"),
    )
}

/// An index after every entry's: where a newcomer goes.
const LAST: &str = "9223372036854775807";

/// The queue text `list` rewritten: the live entries but waiter `id`'s, and, with
/// `stay` (an SQL condition, and the lease `alive` in milliseconds), `id` in its old
/// place (at the end if it had none) until `alive` from now.
fn rewrite(list: &str, id: &str, stay: Option<(&str, &str)>) -> String {
    let e = entries(list);
    let ours = match stay {
        None => String::new(),
        Some((stay, alive)) => format!(
            "UNION ALL \
             SELECT coalesce((SELECT min(i) FROM {e} y WHERE until > {NOW_MS} AND id = {id}), \
               {LAST}), {id} || ':' || ({NOW_MS} + {alive}) \
             WHERE {stay}"
        ),
    };
    format!(
        "(SELECT coalesce(string_agg(v, ' ' ORDER BY i), '') FROM ( \
           SELECT i, id || ':' || until AS v FROM {e} x \
           WHERE until > {NOW_MS} AND id <> {id} {ours}) z)"
    )
}

/// The CTE `requeued` of an acquisition by waiter `id` (not empty: a caller that will
/// wait) that reads the queue with [`queue`]: when it took nothing, it joins the queue
/// row `qkey` (or keeps its place, for `alive` milliseconds more, at most once a
/// second: the first waiter tries every 100 ms, and need not write each time); when it
/// took the lock (`taken`, a CTE), it leaves the queue. Nothing is
/// written for a caller not waiting, nor for one that took the lock without having
/// queued. The rewrite starts from the row as it is when written (`r`), not as read: a
/// queue row made by another statement meanwhile keeps its entries; it drops the
/// places that lapsed.
pub(super) fn requeue(table: &str, qkey: &str, id: &str, alive: &str) -> String {
    let stay = "NOT EXISTS (SELECT 1 FROM taken)";
    format!(
        "requeued AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           SELECT {qkey}, {id} || ':' || ({NOW_MS} + {alive}), 0, '', 0, now(), \
             now() + {alive} * interval '1 millisecond' \
           WHERE {id} <> '' AND CASE WHEN {stay} \
             THEN NOT EXISTS (SELECT 1 FROM waiters \
               WHERE id = {id} AND until > {NOW_MS} + {alive} - 1000) \
             ELSE EXISTS (SELECT 1 FROM waiters WHERE id = {id}) END \
           ON CONFLICT (name) DO UPDATE SET token = {list}, \
             expires_at = greatest(r.expires_at, excluded.expires_at))",
        list = rewrite("r.token", id, Some((stay, alive))),
    )
}

/// The statement that takes waiter `$2` out of the queue row `$1` (it gave up
/// waiting). Answers a row if it was there.
pub(super) fn leave(table: &str) -> String {
    format!(
        "UPDATE {table} AS r SET token = {list} \
         WHERE name = $1 AND position($2 || ':' IN token) > 0 RETURNING 1",
        list = rewrite("r.token", "$2", None),
    )
}

/// 64-bit FNV-1a: a hash that every lockrun version computes alike.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The LISTEN/NOTIFY channel of lock key `key` in `table`: a plain identifier far
/// shorter than PostgreSQL's 63 bytes, whatever the name.
pub(super) fn channel(table: &str, key: &str) -> String {
    let text = format!("{}\0{key}", table.to_ascii_lowercase());
    format!("lockrun_{:016x}", fnv1a(text.as_bytes()))
}

#[cfg(test)]
mod tests;
