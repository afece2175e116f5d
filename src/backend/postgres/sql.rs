//! The SQL the PostgreSQL backend sends: one statement a step, with the table's name
//! in it (a checked identifier, see `config::valid_table_name`), and the LISTEN/NOTIFY
//! channel names, and the lease as a statement parameter; the row keys of a semaphore's
//! slots and the token a semaphore's holder stores. Pure text: no I/O here.
//!
//! A plain lock (`--slots 1`) has statements on one key (`$1 text`); a semaphore has
//! statements on the keys of its slots (`$1 text[]`, slot `i` at index `i + 1`), and
//! its acquisition runs in a transaction of its own after a lock on the name
//! ([`name_lock`]).

use std::time::Duration;

use crate::backend::{BackendError, MAX_WAIT_SLICE};

/// Session settings, sent once per connection. `synchronous_commit`: an acquisition
/// (and the sequence value it used) survives a server crash once it is answered,
/// whatever the server's default. The timeouts bound what a statement abandoned by
/// the caller's timeout can still hold on the server.
pub(super) const SESSION: &str = "SET synchronous_commit = on; SET lock_timeout = '5s'; \
                       SET statement_timeout = '10s'; SET idle_in_transaction_session_timeout = '10s'";

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
/// columns of `holder`.
pub(super) struct Sql {
    pub(super) setup: String,
    /// A plain lock's: `$1` key, `$2` token, `$3` host, `$4` pid, `$5` lease.
    pub(super) acquire: String,
    /// A plain lock's: `$1` key, `$2` token, `$3` lease.
    pub(super) extend: String,
    /// A plain lock's: `$1` key, `$2` token, `$3` channel.
    pub(super) release: String,
    /// A semaphore's, in the transaction of [`name_lock`]: `$1` keys, `$2` stored token
    /// ([`stored_token`]), `$3` host, `$4` pid, `$5` lease, `$6` N.
    pub(super) acquire_slot: String,
    /// A semaphore's: `$1` keys (the slot held, or all), `$2` stored token, `$3` lease.
    pub(super) extend_slot: String,
    /// A semaphore's: `$1` keys (the slot held, or all), `$2` stored token, `$3` channel.
    pub(super) release_slot: String,
    /// Every live holder: `$1` keys.
    pub(super) inspect: String,
    /// Frees every slot: `$1` keys, `$2` channel.
    pub(super) force: String,
}

/// A statement on the row of a holder's token.
#[derive(Clone, Copy)]
pub(super) enum OnToken {
    /// A new expiry: a renewal, or `--hold-at-least` at release.
    Extend,
    /// Frees the row and wakes the waiters.
    Release,
}

impl Sql {
    /// The statement that does `what` for a holder of a lock of `slots` slots.
    pub(super) fn on_token(&self, what: OnToken, slots: u32) -> &str {
        match (what, slots) {
            (OnToken::Extend, 1) => &self.extend,
            (OnToken::Release, 1) => &self.release,
            (OnToken::Extend, _) => &self.extend_slot,
            (OnToken::Release, _) => &self.release_slot,
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

/// The N a holder's row was taken with, from its token ([`stored_token`]): 1 without
/// a `/N` suffix (a plain lock, and every row an older lockrun wrote).
const SLOTS_OF_TOKEN: &str = "coalesce(substring(r.token FROM '/([0-9]{1,4})$')::bigint, 1)";

// Every N fits the 4 digits [`SLOTS_OF_TOKEN`] reads.
const _: () = assert!(crate::backend::MAX_SLOTS < 10_000);

/// The columns of a holder in the statements' answers, of row `r` in slot `slot` (an
/// SQL expression): fence, host, pid, since and time left in milliseconds, slot,
/// slots. `super::PostgresBackend::holder` reads them.
fn holder(slot: &str) -> String {
    format!("r.fence, r.host, r.pid, {MS_COLUMNS}, {slot}::bigint, {SLOTS_OF_TOKEN}")
}

/// The key of slot `slot` of the lock whose plain key is `key` (`PREFIX + NAME`): slot 0
/// is that key itself, the row a plain lock has (and that an older lockrun reads);
/// slot `i` is `KEY#i`. No name has a `#`, so no other name's slot 0 is it.
pub(super) fn slot_key(key: &str, slot: u32) -> String {
    match slot {
        0 => key.to_owned(),
        i => format!("{key}#{i}"),
    }
}

/// The keys of slots 0 to `slots` - 1, in order: a semaphore's `$1`.
pub(super) fn slot_keys(key: &str, slots: u32) -> Vec<String> {
    (0..slots).map(|i| slot_key(key, i)).collect()
}

/// What a holder of a name taken with `--slots slots` stores as its token: the token
/// itself for a plain lock (exactly what lockrun always stored), `TOKEN/N` for a
/// semaphore, so that its row records N ([`SLOTS_OF_TOKEN`]) without a new column:
/// an existing table keeps working, whoever owns it. A token is hex: no token has a
/// `/`.
pub(super) fn stored_token(token: &str, slots: u32) -> String {
    match slots {
        1 => token.to_owned(),
        n => format!("{token}/{n}"),
    }
}

/// The statement before a semaphore's acquisition, in the same transaction: it begins
/// the transaction and waits for the lock on the name (the transaction-level advisory
/// lock `id`, see [`name_lock_id`]), which every semaphore acquisition of the name
/// takes. The acquisition that follows is a statement of its own, so its snapshot is
/// taken once the lock is ours: it sees every acquisition committed before, and no
/// other is under way (two could otherwise pick one free slot, or see no holder of
/// another N, from one snapshot). Sent with the acquisition and the COMMIT in one
/// round trip.
pub(super) fn name_lock(id: i64) -> String {
    format!("BEGIN; SELECT pg_advisory_xact_lock({id})")
}

/// The advisory lock of lock key `key` in `table`: a hash, in the one-bigint key
/// space (the table's creation locks in the two-int space). Two names sharing one only
/// wait for each other.
pub(super) fn name_lock_id(table: &str, key: &str) -> i64 {
    let text = format!("{}\0{key}\0slots", table.to_ascii_lowercase());
    fnv1a(text.as_bytes()) as i64
}

impl Sql {
    pub(super) fn new(table: &str) -> Sql {
        let seq = format!("{table}_fence");
        let by_slot = holder("k.i - 1");
        Sql {
            // One simple query, so one implicit transaction: the advisory lock makes
            // concurrent first runs create the table one after the other.
            setup: format!(
                "SELECT pg_advisory_xact_lock(1819239283, {key}); \
                 CREATE TABLE IF NOT EXISTS {table} ( \
                   name text PRIMARY KEY, token text NOT NULL, fence bigint NOT NULL, \
                   host text NOT NULL, pid bigint NOT NULL, since timestamptz NOT NULL, \
                   expires_at timestamptz NOT NULL); \
                 CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint CACHE 1",
                key = fnv1a(table.to_ascii_lowercase().as_bytes()) as i32
            ),
            acquire: acquire(table, &seq),
            acquire_slot: acquire_slot(table, &seq),
            // Renewal, and `--hold-at-least` at release: a new expiry for our lease.
            extend: format!(
                "UPDATE {table} SET expires_at = now() + $3 * interval '1 millisecond' \
                 WHERE name = $1 AND token = $2 AND expires_at > now() RETURNING 1"
            ),
            release: format!(
                "UPDATE {table} SET token = '', expires_at = now() \
                 WHERE name = $1 AND token = $2 AND expires_at > now() \
                 RETURNING pg_notify($3, '')::text"
            ),
            extend_slot: format!(
                "UPDATE {table} SET expires_at = now() + $3 * interval '1 millisecond' \
                 WHERE name = ANY($1) AND token = $2 AND expires_at > now() RETURNING 1"
            ),
            release_slot: format!(
                "UPDATE {table} SET token = '', expires_at = now() \
                 WHERE name = ANY($1) AND token = $2 AND expires_at > now() \
                 RETURNING pg_notify($3, '')::text"
            ),
            inspect: format!(
                "SELECT {by_slot} \
                 FROM unnest($1::text[]) WITH ORDINALITY AS k(name, i) \
                 JOIN {table} r ON r.name = k.name \
                 WHERE r.expires_at > now() AND r.token <> '' ORDER BY k.i"
            ),
            // One NOTIFY however many slots it frees: PostgreSQL folds a transaction's
            // equal notifications into one.
            force: format!(
                "UPDATE {table} AS l SET token = '', expires_at = now() FROM ( \
                   SELECT t.*, k.i FROM unnest($1::text[]) WITH ORDINALITY AS k(name, i) \
                   JOIN {table} t ON t.name = k.name \
                   WHERE t.expires_at > now() AND t.token <> '' FOR UPDATE OF t) r \
                 WHERE l.name = r.name \
                 RETURNING {by_slot}, pg_notify($2, '')::text",
                by_slot = holder("r.i - 1")
            ),
        }
    }
}

/// The acquire statement of a plain lock: takes the row if it is missing or expired,
/// with a fencing token taken under the row lock; otherwise answers who holds it. The
/// VALUES' nextval counts only for a name without a row.
///
/// A name without a row (in the statement's snapshot; a one-time filter, so that an
/// acquisition of a known name scans nothing more) also deletes a few rows whose lease
/// ended more than [`RETENTION`] ago, never its own, skipping rows that another statement
/// has locked: the table holds about a [`RETENTION`]'s worth of names.
fn acquire(table: &str, seq: &str) -> String {
    let busy = holder("0");
    format!(
        "WITH taken AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           VALUES ($1, $2, nextval('{seq}'), $3, $4, now(), now() + $5 * interval '1 millisecond') \
           {TAKE_EXPIRED} \
           RETURNING fence), \
         gone AS ( \
           DELETE FROM {table} \
           WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = $1) \
           AND name = ANY(ARRAY( \
             SELECT name FROM {table} \
             WHERE expires_at < now() - interval '{RETENTION}' AND name <> $1 \
             LIMIT {CLEANUP_BATCH} FOR UPDATE SKIP LOCKED))) \
         SELECT true, fence, '', 0::bigint, 0::bigint, 0::bigint, 0::bigint, 1::bigint \
         FROM taken \
         UNION ALL \
         SELECT false, {busy} FROM {table} r \
         WHERE r.name = $1 AND NOT EXISTS (SELECT 1 FROM taken)",
        TAKE_EXPIRED = take_expired(seq),
    )
}

/// The conflict clause of an acquisition's INSERT: a row that is there is taken only
/// if its lease has ended, with a fencing token drawn under its row lock.
fn take_expired(seq: &str) -> String {
    format!(
        "ON CONFLICT (name) DO UPDATE SET token = excluded.token, \
           fence = nextval('{seq}'), host = excluded.host, pid = excluded.pid, \
           since = excluded.since, expires_at = excluded.expires_at \
         WHERE r.expires_at <= now()"
    )
}

/// The acquire statement of a semaphore, run after [`name_lock`] in its transaction:
/// reads the rows of slots 0 to N-1 (`seen`: a missing row is free); refuses
/// (takes nothing, answers that holder first) if a live holder was taken with another
/// N; otherwise takes the lowest free slot, as the plain statement takes its row
/// (the same conflict clause, which keeps it safe from a writer that does not take
/// the name's lock: a plain lockrun, an older one). Answers the slot taken and its
/// token, or the holder whose lease ends first (every slot held), or nothing (a slot
/// seen free was taken meanwhile by such a writer: the caller asks again).
///
/// Its clock is `statement_timestamp()`, not `now()`: in a transaction, `now()` is the
/// transaction's start, before the wait for the name's lock, and a lease written from
/// it would be shorter by that wait. The statement's own start is as good a clock: one
/// value for the whole statement, never later than the checks, never earlier than the
/// request's sending. A row whose token is empty was released: free, whatever its
/// expiry (a release that started after this statement can have committed before it
/// looked; its `now()` is then later than this statement's).
///
/// A slot taken that had no row cleans up as the plain statement does, never a row of
/// this name.
fn acquire_slot(table: &str, seq: &str) -> String {
    let busy = holder("r.slot");
    format!(
        "WITH seen AS ( \
           SELECT k.i - 1 AS slot, k.name, r.token, r.fence, r.host, r.pid, r.since, \
             r.expires_at, r.name IS NOT NULL AS stored, \
             coalesce(r.expires_at > now() AND r.token <> '', false) AS live, \
             {SLOTS_OF_TOKEN} AS slots \
           FROM unnest($1::text[]) WITH ORDINALITY AS k(name, i) \
           LEFT JOIN {table} r ON r.name = k.name), \
         pick AS ( \
           SELECT slot, name, stored FROM seen \
           WHERE NOT live AND NOT EXISTS (SELECT 1 FROM seen WHERE live AND slots <> $6) \
           ORDER BY slot LIMIT 1), \
         taken AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           SELECT name, $2, nextval('{seq}'), $3, $4, now(), \
             now() + $5 * interval '1 millisecond' FROM pick \
           {TAKE_EXPIRED} OR r.token = '' \
           RETURNING fence), \
         gone AS ( \
           DELETE FROM {table} \
           WHERE EXISTS (SELECT 1 FROM pick WHERE NOT stored) \
           AND name = ANY(ARRAY( \
             SELECT name FROM {table} \
             WHERE expires_at < now() - interval '{RETENTION}' AND name <> ALL($1) \
             LIMIT {CLEANUP_BATCH} FOR UPDATE SKIP LOCKED))) \
         SELECT true, t.fence, '', 0::bigint, 0::bigint, 0::bigint, p.slot::bigint, $6 \
         FROM taken t, pick p \
         UNION ALL \
         (SELECT false, {busy} FROM seen r \
          WHERE r.live AND NOT EXISTS (SELECT 1 FROM pick) \
          ORDER BY r.slots = $6, r.expires_at, r.slot LIMIT 1)",
        TAKE_EXPIRED = take_expired(seq),
    )
    .replace("now()", "statement_timestamp()")
}

/// The queue of a semaphore's waiters: a session-level advisory lock of the name (its
/// id from [`queue_lock_id`]), which PostgreSQL grants first come first served. Its
/// holder is the head of the queue, the one waiter that tries again when a slot frees;
/// the others wait for the lock. These are the first two of the three messages that
/// join it, sent at once (each message gets its own statement timer, whatever the
/// server's version); the third is `COMMIT`. The wait is bounded by `wait` (the
/// `--wait` left, at most [`MAX_QUEUE_WAIT`]), not by the session's `lock_timeout`; a
/// wait that runs out rolls the transaction back. A head idle for longer than
/// [`HEAD_IDLE`] (frozen, or its host gone while its connection looks open) is ended by
/// the server (`idle_session_timeout`, PostgreSQL 14 and later), which lets the next
/// waiter on; a waiter whose connection closes leaves the queue with its session.
pub(super) fn join_queue(id: i64, wait: Duration) -> [String; 2] {
    let ms = wait.min(MAX_QUEUE_WAIT).as_millis().max(1);
    [
        format!(
            "BEGIN; SET LOCAL lock_timeout = {ms}; SET LOCAL statement_timeout = {}",
            ms + 1000
        ),
        format!(
            "SELECT pg_advisory_lock({id}); {}",
            idle_session_timeout(HEAD_IDLE.as_millis())
        ),
    ]
}

/// The statement that leaves the queue of [`join_queue`] (its head has a slot), and
/// ends the idle timeout: the session now holds a lease, renewed as seldom as
/// `--renew-every` says.
pub(super) fn leave_queue(id: i64) -> String {
    format!(
        "SELECT pg_advisory_unlock({id}); {}",
        idle_session_timeout(0)
    )
}

/// How long the head of a queue may be idle: its waits last at most
/// `MAX_WAIT_SLICE` (plus jitter) between two tries, so three of them is a head that
/// no longer tries.
pub(super) const HEAD_IDLE: Duration = Duration::from_secs(3 * MAX_WAIT_SLICE.as_secs());

/// The longest single wait in a queue; a longer `--wait` joins it again after that.
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// Sets `idle_session_timeout` to `ms` for the session, on servers that have it.
fn idle_session_timeout(ms: u128) -> String {
    format!(
        "SELECT set_config('idle_session_timeout', '{ms}', false) \
         WHERE current_setting('server_version_num')::int >= 140000"
    )
}

/// The queue lock of lock key `key` in `table` (see [`join_queue`]): a hash, like
/// [`name_lock_id`]'s but another.
pub(super) fn queue_lock_id(table: &str, key: &str) -> i64 {
    let text = format!("{}\0{key}\0queue", table.to_ascii_lowercase());
    fnv1a(text.as_bytes()) as i64
}

/// 64-bit FNV-1a: a hash that every lockrun version computes alike.
fn fnv1a(bytes: &[u8]) -> u64 {
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
mod tests {
    use super::*;

    #[test]
    fn channels_are_short_stable_identifiers() {
        let c = channel("lockrun_locks", &format!("lockrun:{}", "x".repeat(200)));
        assert!(c.len() <= 63 && c.starts_with("lockrun_"), "{c}");
        assert!(c
            .chars()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_'));
        assert_eq!(
            c,
            channel("LOCKRUN_LOCKS", &format!("lockrun:{}", "x".repeat(200)))
        );
        assert_ne!(c, channel("lockrun_locks", "lockrun:y"));
        // FNV-1a test vectors: the hash must never change between versions.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn leases_are_whole_milliseconds_up_to_a_day() {
        let ms = Duration::from_millis;
        assert_eq!(millis(Duration::ZERO), Ok(1));
        assert_eq!(millis(ms(1500)), Ok(1500));
        assert_eq!(millis(MAX_LEASE), Ok(86_400_000));
        for long in [MAX_LEASE + ms(1), Duration::from_secs(u64::MAX)] {
            let Err(BackendError::Refused(e)) = millis(long) else {
                panic!("{long:?} was taken")
            };
            assert!(e.contains("24 h"), "{e}");
        }
    }

    #[test]
    fn statements_name_the_table_and_its_sequence() {
        let sql = Sql::new("locks.leases");
        assert!(sql
            .setup
            .contains("CREATE TABLE IF NOT EXISTS locks.leases ("));
        assert!(sql
            .setup
            .contains("CREATE SEQUENCE IF NOT EXISTS locks.leases_fence"));
        for s in [&sql.acquire, &sql.acquire_slot] {
            assert!(s.contains("nextval('locks.leases_fence')"), "{s}");
            assert!(s.contains("INSERT INTO locks.leases AS r"), "{s}");
        }
        for s in [&sql.extend, &sql.release] {
            assert!(
                s.contains("name = $1 AND token = $2 AND expires_at > now()"),
                "{s}"
            );
        }
        for s in [&sql.extend_slot, &sql.release_slot] {
            assert!(s.contains("name = ANY($1) AND token = $2 AND expires_at > now()"));
        }
        // A released row (empty token) is no holder, whatever its expiry.
        assert!(sql.inspect.contains("r.token <> ''"));
        assert!(sql.force.contains("t.token <> ''"));
    }

    #[test]
    fn statements_answer_holders_with_their_slot_and_slots() {
        let sql = Sql::new("t");
        let columns = format!("{SLOTS_OF_TOKEN}, pg_notify");
        assert!(sql.force.contains(&columns), "{}", sql.force);
        for s in [&sql.acquire, &sql.acquire_slot, &sql.inspect] {
            assert!(s.contains(SLOTS_OF_TOKEN), "{s}");
        }
        assert!(sql.acquire.contains("r.pid, (extract"));
        // The plain lock's answer: slot 0, its holder's slots from the token.
        assert!(sql
            .acquire
            .contains(&format!("0::bigint, {SLOTS_OF_TOKEN} FROM t r")));
    }

    #[test]
    fn the_plain_statements_are_those_of_a_lock_without_slots() {
        let sql = Sql::new("t");
        for s in [&sql.acquire, &sql.extend, &sql.release] {
            assert!(!s.contains("ANY($1)") && !s.contains("[]"), "{s}");
            assert!(!s.contains("statement_timestamp"), "{s}");
        }
        assert_eq!(sql.on_token(OnToken::Extend, 1), sql.extend);
        assert_eq!(sql.on_token(OnToken::Release, 1), sql.release);
        assert_eq!(sql.on_token(OnToken::Extend, 2), sql.extend_slot);
        assert_eq!(sql.on_token(OnToken::Release, 1000), sql.release_slot);
    }

    #[test]
    fn a_semaphores_acquisition_judges_by_its_statements_clock() {
        let s = Sql::new("t").acquire_slot;
        assert!(!s.contains("now()"), "{s}");
        assert!(s.contains("expires_at <= statement_timestamp() OR r.token = ''"));
        // A live holder with another N stops the pick, and is the answer first.
        assert!(s.contains("NOT EXISTS (SELECT 1 FROM seen WHERE live AND slots <> $6)"));
        assert!(s.contains("ORDER BY r.slots = $6, r.expires_at"));
        // Its cleanup never deletes a row of its own name.
        assert!(s.contains("name <> ALL($1)"));
    }

    #[test]
    fn slot_0_is_the_plain_key_and_other_slots_keys_no_name_has() {
        assert_eq!(slot_key("lockrun:job", 0), "lockrun:job");
        assert_eq!(slot_key("lockrun:job", 7), "lockrun:job#7");
        assert_eq!(
            slot_keys("p:a/b", 3),
            ["p:a/b", "p:a/b#1", "p:a/b#2"].map(String::from)
        );
        assert_eq!(slot_keys("k", 1), ["k".to_owned()]);
        assert_eq!(slot_keys("k", 1000).len(), 1000);
        // Names cannot hold `#`: slot i of one name is never another name's key.
        assert!(crate::config::LockName::parse("job#1").is_err());
        let all: std::collections::HashSet<String> = ["a", "a#1", "a:1", "a1"]
            .iter()
            .filter(|n| crate::config::LockName::parse(n).is_ok())
            .flat_map(|n| slot_keys(&format!("lockrun:{n}"), 12))
            .collect();
        assert_eq!(all.len(), 3 * 12);
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
        assert_eq!(name_lock(-5), "BEGIN; SELECT pg_advisory_xact_lock(-5)");
        // Never the channel's hash: a key's lock and channel are unrelated numbers.
        let channel_hash = fnv1a(b"lockrun_locks\0lockrun:job");
        assert_ne!(id, channel_hash as i64);
    }
}
