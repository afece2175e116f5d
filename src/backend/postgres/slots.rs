//! A semaphore's rows and SQL (`--slots N`, N > 1): the keys of its slots and of its
//! limit row, the token its holders store, the statements on them and the name's lock;
//! and the key of the waiters' queue row, which a plain lock has too. Pure text: no
//! I/O here. Part of [`super`]; the parts
//! shared with a plain lock's statements are in `sql.rs`.
//!
//! Rows of name `KEY` (`PREFIX{NAME}`, `keys.rs`), in the lock table:
//! - `KEY`: slot 0, the plain lock's row, as ever;
//! - `KEY#i`: slot `i`;
//! - `KEY#slots`: the limit row, live while any slot is held, with the holders' N in
//!   its token (`/N`) and the latest of their expiries: what a plain lock, or a
//!   semaphore with another N, looks at to see holders in slots it does not read;
//! - `KEY#queue`: the queue of the name's waiters, plain lock or semaphore
//!   (`sql::queue`), never a holder;
//! - `KEY#last`: the record of the name's last run that ended, plain lock or
//!   semaphore (`records.rs`), never a holder.
//!
//! The suffixes follow the `}` that closes the name, so none of these is another
//! (prefix, name) pair's key (`keys.rs`).

use super::records::record_cte;
use super::sql::{cleanup, fnv1a, holder, queue, requeue, take_expired, SLOTS_OF_TOKEN, UNKNOWN};

/// The key of slot `slot` of the lock whose plain key is `key` (`PREFIX{NAME}`): slot 0
/// is that key itself, the row a plain lock has; slot `i` is `KEY#i`.
pub(super) fn slot_key(key: &str, slot: u32) -> String {
    match slot {
        0 => key.to_owned(),
        i => format!("{key}#{i}"),
    }
}

/// The keys of slots 0 to `slots` - 1, in order.
pub(super) fn slot_keys(key: &str, slots: u32) -> Vec<String> {
    (0..slots).map(|i| slot_key(key, i)).collect()
}

/// The key of the limit row of the lock whose plain key is `key`.
pub(super) fn limit_key(key: &str) -> String {
    format!("{key}#slots")
}

/// The key of the queue row of the waiters for the lock whose plain key is `key`
/// (`sql::queue`).
pub(super) fn queue_key(key: &str) -> String {
    format!("{key}#queue")
}

/// What a holder of a name taken with `--slots slots` stores as its token: the token
/// itself for a plain lock (exactly what lockrun always stored), `TOKEN/N` for a
/// semaphore, so that its row records N (`sql::SLOTS_OF_TOKEN`) without a new column:
/// an existing table keeps working, whoever owns it. A token is hex: no token has a
/// `/`.
pub(super) fn stored_token(token: &str, slots: u32) -> String {
    match slots {
        1 => token.to_owned(),
        n => format!("{token}/{n}"),
    }
}

/// The statement before a semaphore's acquisition, release or `--hold-at-least`, and
/// `release --force`, in the same transaction (after `sql::begin`): it waits for the
/// lock on the name (the transaction-level advisory lock `id`, see [`name_lock_id`]).
/// The step that follows is a statement of its own, so its snapshot is taken once the
/// lock is ours: it sees every such step committed before, and no other is under way
/// (two acquisitions could otherwise pick one free slot, or see no holder of another
/// N, from one snapshot; a release could end the limit row while an acquisition
/// extends it). Sent with the step and the COMMIT in one round trip; a transaction
/// lock, so it works through a transaction pool.
pub(super) fn name_lock(id: i64) -> String {
    format!("SELECT pg_advisory_xact_lock({id})")
}

/// The advisory lock of lock key `key` in `table`: a hash, in the one-bigint key
/// space (the table's creation locks in the two-int space). Two names sharing one only
/// wait for each other.
pub(super) fn name_lock_id(table: &str, key: &str) -> i64 {
    let text = format!("{}\0{key}\0slots", table.to_ascii_lowercase());
    fnv1a(text.as_bytes()) as i64
}

/// The acquire statement of a semaphore, run after [`name_lock`] in its transaction:
/// reads the rows of slots 0 to N-1 (`seen`: a missing row is free) and the limit row
/// (`lim`); refuses (takes nothing, answers that holder first) if a live holder, or
/// the limit row, records another N; otherwise takes the lowest free slot, as the
/// plain statement takes its row (the same conflict clause, which keeps it safe from a
/// writer that does not take the name's lock: a plain lockrun, an older one), and
/// makes the limit row cover its lease. Answers the slot taken and its token, or the
/// holder whose lease ends first (every slot held), or nothing (a slot seen free was
/// taken meanwhile by such a writer: the caller asks again).
///
/// Its clock is `statement_timestamp()`, not `now()`: in a transaction, `now()` is the
/// transaction's start, before the wait for the name's lock, and a lease written from
/// it would be shorter by that wait. The statement's own start is as good a clock: one
/// value for the whole statement, never later than the checks, never earlier than the
/// request's sending. A row whose token is empty was released: free, whatever its
/// expiry (a release that started after this statement can have committed before it
/// looked; its `now()` is then later than this statement's).
///
/// The waiters' queue (`sql::queue`) comes first, as for a plain lock: a caller takes
/// a slot only while fewer live waiters came before it than slots are free (so a
/// second slot freed goes to the second waiter), and a waiter that takes none joins
/// or keeps its place. Every answer ends with that count of waiters ahead; blocked by
/// them with no live holder to answer (slots free for the waiters ahead), the answer
/// is an unknown holder.
///
/// A slot taken that had no row cleans up as the plain statement does, never a row of
/// this name.
pub(super) fn acquire(table: &str, seq: &str) -> String {
    let busy = holder("r.slot");
    let columns = "fence, host, pid, since, expires_at, token, slot, slots";
    format!(
        "WITH {QUEUE}, \
         seen AS ( \
           SELECT k.i - 1 AS slot, k.name, r.token, r.fence, r.host, r.pid, r.since, \
             r.expires_at, r.name IS NOT NULL AS stored, \
             coalesce(r.expires_at > now() AND r.token <> '', false) AS live, \
             {SLOTS_OF_TOKEN} AS slots \
           FROM unnest($1::text[]) WITH ORDINALITY AS k(name, i) \
           LEFT JOIN {table} r ON r.name = k.name), \
         lim AS ( \
           SELECT r.*, 0 AS slot, {SLOTS_OF_TOKEN} AS slots FROM {table} r \
           WHERE r.name = $7 AND r.expires_at > now() AND r.token <> ''), \
         pick AS ( \
           SELECT slot, name, stored FROM seen \
           WHERE NOT live AND NOT EXISTS (SELECT 1 FROM seen WHERE live AND slots <> $6) \
           AND NOT EXISTS (SELECT 1 FROM lim WHERE slots <> $6) \
           AND (SELECT n FROM ahead) < (SELECT count(*) FROM seen WHERE NOT live) \
           ORDER BY slot LIMIT 1), \
         taken AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           SELECT name, $2, nextval('{seq}'), $3, $4, now(), \
             now() + $5 * interval '1 millisecond' FROM pick \
           {TAKE_EXPIRED} OR r.token = '' \
           RETURNING fence, expires_at), \
         limited AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           SELECT $7, '/' || $6, fence, '', 0, now(), expires_at FROM taken \
           ON CONFLICT (name) DO UPDATE SET token = excluded.token, fence = excluded.fence, \
             since = excluded.since, expires_at = {COVER}), \
         {REQUEUE}, \
         {GONE} \
         SELECT true, t.fence, '', 0::bigint, 0::bigint, 0::bigint, p.slot::bigint, $6, \
           (SELECT n FROM ahead) \
         FROM taken t, pick p \
         UNION ALL \
         (SELECT false, {busy}, (SELECT n FROM ahead) FROM ( \
            SELECT {columns} FROM seen WHERE live \
            UNION ALL SELECT {columns} FROM lim WHERE slots <> $6) r \
          WHERE NOT EXISTS (SELECT 1 FROM pick) \
          ORDER BY r.slots = $6, r.expires_at, r.slot LIMIT 1) \
         UNION ALL \
         SELECT false, {UNKNOWN}, $6, n FROM ahead \
         WHERE n > 0 AND NOT EXISTS (SELECT 1 FROM pick) \
         AND NOT EXISTS (SELECT 1 FROM seen WHERE live) \
         AND NOT EXISTS (SELECT 1 FROM lim WHERE slots <> $6)",
        QUEUE = queue(table, "$8", "$9"),
        REQUEUE = requeue(table, "$8", "$9", "$10"),
        TAKE_EXPIRED = take_expired(seq),
        COVER = COVER,
        GONE = cleanup(
            table,
            "EXISTS (SELECT 1 FROM pick WHERE NOT stored)",
            "name <> ALL($1) AND name <> $7 AND name <> $8"
        ),
    )
    .replace("now()", "statement_timestamp()")
}

/// The limit row's new expiry in an upsert (`r` the row there, `excluded` ours): the
/// later of both while it records our N and is live, else ours.
const COVER: &str = "CASE WHEN r.token = excluded.token AND r.expires_at > now() \
     THEN greatest(r.expires_at, excluded.expires_at) ELSE excluded.expires_at END";

/// A semaphore's renewal: a new expiry for our slot's row, found by its token among
/// `$1`, and the limit row made to cover it (written again if it went: an operator's
/// DELETE, a release that raced this renewal). Never shortens the limit row: no
/// transaction, no lock wait, as a plain renewal.
pub(super) fn extend(table: &str) -> String {
    format!(
        "WITH kept AS ( \
           UPDATE {table} SET expires_at = now() + $3 * interval '1 millisecond' \
           WHERE name = ANY($1) AND token = $2 AND expires_at > now() RETURNING expires_at), \
         covered AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           SELECT $4, '/' || array_length($5::text[], 1), 0, '', 0, now(), max(expires_at) \
           FROM kept HAVING count(*) > 0 \
           ON CONFLICT (name) DO UPDATE SET token = excluded.token, expires_at = {COVER} \
           WHERE r.token IN (excluded.token, '') OR r.expires_at <= now()) \
         SELECT 1 FROM kept"
    )
}

/// What the statements that end a run return of our slot's row: what [`recover`] and
/// the record ([`recorded`]) read.
const ENDED: &str = "name, expires_at, fence, host, pid, since";

/// The record of the run that held our slot (`kept`): the record row `$6`, its slot
/// the index of the row's key among every slot's (`$5`), its end `$7`
/// (`records::record_cte`).
fn recorded(table: &str) -> String {
    record_cte(
        table,
        "kept",
        "$6",
        "array_position($5::text[], f.name) - 1",
        "$7",
    )
}

/// A semaphore's `--hold-at-least`, after [`name_lock`]: a new expiry for our slot's
/// row, maybe sooner than the last, the limit row's expiry made the latest of the
/// live slots' ([`recover`]), and the run's record ([`recorded`]).
pub(super) fn keep(table: &str) -> String {
    format!(
        "WITH kept AS ( \
           UPDATE {table} SET expires_at = now() + $3 * interval '1 millisecond' \
           WHERE name = ANY($1) AND token = $2 AND expires_at > now() \
           RETURNING {ENDED}), \
         {RECOVER}, \
         {RECORDED} \
         SELECT 1 FROM kept",
        RECOVER = recover(table),
        RECORDED = recorded(table),
    )
    .replace("now()", "statement_timestamp()")
}

/// A semaphore's release, after [`name_lock`]: frees our slot's row and wakes the
/// waiters; the limit row's expiry becomes the latest of the other live slots', and
/// the limit row goes with the last holder ([`recover`]); the run's record
/// ([`recorded`]).
pub(super) fn release(table: &str) -> String {
    format!(
        "WITH kept AS ( \
           UPDATE {table} SET token = '', expires_at = now() \
           WHERE name = ANY($1) AND token = $2 AND expires_at > now() \
           RETURNING {ENDED}), \
         {RECOVER}, \
         {RECORDED} \
         SELECT pg_notify($3, '')::text FROM kept",
        RECOVER = recover(table),
        RECORDED = recorded(table),
    )
    .replace("now()", "statement_timestamp()")
}

/// After a holder's slot changed (`kept`: its name and new expiry, past if released):
/// the limit row (`$4`, of our N: `$5` holds every slot's key) lasts until the latest
/// expiry of the live slots, or ends now when none is live.
fn recover(table: &str) -> String {
    format!(
        "covered AS ( \
       UPDATE {table} AS l SET expires_at = coalesce(m.until, now()), \
         token = CASE WHEN m.until IS NULL THEN '' ELSE l.token END \
       FROM (SELECT max(e) AS until FROM ( \
           SELECT expires_at AS e FROM kept WHERE expires_at > now() \
           UNION ALL \
           SELECT o.expires_at FROM {table} o \
           WHERE o.name = ANY($5) AND o.expires_at > now() AND o.token <> '' \
           AND o.name NOT IN (SELECT name FROM kept)) x) m \
       WHERE l.name = $4 AND l.token = '/' || array_length($5::text[], 1) \
       AND EXISTS (SELECT 1 FROM kept))"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::postgres::sql::Sql;

    #[test]
    fn slot_0_is_the_plain_key_and_other_rows_have_keys_no_name_has() {
        assert_eq!(slot_key("lockrun:job", 0), "lockrun:job");
        assert_eq!(slot_key("lockrun:job", 7), "lockrun:job#7");
        assert_eq!(
            slot_keys("p:a/b", 3),
            ["p:a/b", "p:a/b#1", "p:a/b#2"].map(String::from)
        );
        assert_eq!(slot_keys("k", 1), ["k".to_owned()]);
        assert_eq!(slot_keys("k", 1000).len(), 1000);
        assert_eq!(limit_key("lockrun:job"), "lockrun:job#slots");
        assert_eq!(queue_key("lockrun:job"), "lockrun:job#queue");
        // Names cannot hold `#`: no row of one name is another name's.
        assert!(crate::name::LockName::parse("job#1").is_err());
        let mut all = std::collections::HashSet::new();
        for name in ["a", "a:1", "a1", "a/slots", "slots"] {
            let key = format!("lockrun:{name}");
            let others = [limit_key(&key), queue_key(&key)];
            for k in slot_keys(&key, 12).into_iter().chain(others) {
                assert!(all.insert(k.clone()), "{k} twice");
            }
        }
    }

    #[test]
    fn a_semaphores_token_records_its_n_and_a_plain_token_is_unchanged() {
        let token = "0123456789abcdef0123456789abcdef";
        assert_eq!(stored_token(token, 1), token);
        assert_eq!(stored_token(token, 3), format!("{token}/3"));
        assert_eq!(stored_token(token, 1000), format!("{token}/1000"));
        // The pattern the statements read N with takes up to 4 digits after the `/`.
        assert!(SLOTS_OF_TOKEN.contains("'/([0-9]{1,4})$'"));
    }

    #[test]
    fn the_name_lock_is_a_stable_hash_of_table_and_key() {
        let id = name_lock_id("lockrun_locks", "lockrun:job");
        assert_eq!(id, name_lock_id("LOCKRUN_LOCKS", "lockrun:job"));
        assert_ne!(id, name_lock_id("lockrun_locks", "lockrun:job2"));
        assert_ne!(id, name_lock_id("other", "lockrun:job"));
        assert_eq!(name_lock(-5), "SELECT pg_advisory_xact_lock(-5)");
    }

    #[test]
    fn statements_in_the_name_locks_transaction_judge_by_their_own_clock() {
        let sql = Sql::new("t");
        for s in [
            &sql.acquire_slot,
            &sql.keep_slot,
            &sql.release_slot,
            &sql.force,
        ] {
            assert!(!s.contains("now()"), "{s}");
            assert!(s.contains("statement_timestamp()"), "{s}");
        }
        // A renewal runs alone, as a plain one.
        assert!(sql.extend_slot.contains("expires_at > now() RETURNING"));
    }

    #[test]
    fn a_semaphores_acquisition_checks_n_then_takes_the_lowest_free_slot() {
        let s = Sql::new("t").acquire_slot;
        assert!(s.contains("expires_at <= statement_timestamp() OR r.token = ''"));
        // A live holder or limit row with another N stops the pick, and is the answer
        // first.
        assert!(s.contains("NOT EXISTS (SELECT 1 FROM seen WHERE live AND slots <> $6)"));
        assert!(s.contains("NOT EXISTS (SELECT 1 FROM lim WHERE slots <> $6)"));
        assert!(s.contains("ORDER BY slot LIMIT 1"));
        assert!(s.contains("ORDER BY r.slots = $6, r.expires_at"));
        // The limit row covers the lease taken; cleanup spares every row of the name.
        assert!(s.contains("SELECT $7, '/' || $6, fence, '', 0"));
        assert!(s.contains("name <> ALL($1) AND name <> $7"));
    }

    #[test]
    fn the_limit_row_follows_the_holders() {
        let sql = Sql::new("t");
        assert!(sql
            .extend_slot
            .contains("greatest(r.expires_at, excluded.expires_at)"));
        for s in [&sql.keep_slot, &sql.release_slot] {
            assert!(
                s.contains("coalesce(m.until, statement_timestamp())"),
                "{s}"
            );
            assert!(s.contains("o.name NOT IN (SELECT name FROM kept)"), "{s}");
        }
        assert!(sql.release_slot.contains("pg_notify($3, '')"));
    }
}
