//! The SQL the PostgreSQL backend sends: one statement a step, with the table's name
//! in it (a checked identifier, see `config::valid_table_name`), and the LISTEN/NOTIFY
//! channel names, and the lease as a statement parameter. Pure text: no I/O here.

use std::time::Duration;

use crate::backend::BackendError;

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

/// The statements, with the table's name in them.
pub(super) struct Sql {
    pub(super) setup: String,
    pub(super) acquire: String,
    pub(super) extend: String,
    pub(super) release: String,
    pub(super) inspect: String,
    pub(super) force: String,
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

impl Sql {
    pub(super) fn new(table: &str) -> Sql {
        let seq = format!("{table}_fence");
        let ms = MS_COLUMNS;
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
            inspect: format!(
                "SELECT r.fence, r.host, r.pid, {ms} FROM {table} r \
                 WHERE r.name = $1 AND r.expires_at > now()"
            ),
            force: format!(
                "UPDATE {table} AS l SET token = '', expires_at = now() FROM ( \
                   SELECT * FROM {table} WHERE name = $1 AND expires_at > now() FOR UPDATE) r \
                 WHERE l.name = r.name \
                 RETURNING r.fence, r.host, r.pid, {ms}, pg_notify($2, '')::text"
            ),
        }
    }
}

/// The acquire statement: takes the row if it is missing or expired, with a fencing token
/// taken under the row lock; otherwise answers who holds it. The VALUES' nextval counts
/// only for a name without a row.
///
/// A name without a row (in the statement's snapshot; a one-time filter, so that an
/// acquisition of a known name scans nothing more) also deletes a few rows whose lease
/// ended more than [`RETENTION`] ago, never its own, skipping rows that another statement
/// has locked: the table holds about a [`RETENTION`]'s worth of names.
fn acquire(table: &str, seq: &str) -> String {
    let ms = MS_COLUMNS;
    format!(
        "WITH taken AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           VALUES ($1, $2, nextval('{seq}'), $3, $4, now(), now() + $5 * interval '1 millisecond') \
           ON CONFLICT (name) DO UPDATE SET token = excluded.token, \
             fence = nextval('{seq}'), host = excluded.host, pid = excluded.pid, \
             since = excluded.since, expires_at = excluded.expires_at \
           WHERE r.expires_at <= now() \
           RETURNING fence), \
         gone AS ( \
           DELETE FROM {table} \
           WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = $1) \
           AND name = ANY(ARRAY( \
             SELECT name FROM {table} \
             WHERE expires_at < now() - interval '{RETENTION}' AND name <> $1 \
             LIMIT {CLEANUP_BATCH} FOR UPDATE SKIP LOCKED))) \
         SELECT true, fence, '', 0::bigint, 0::bigint, 0::bigint FROM taken \
         UNION ALL \
         SELECT false, r.fence, r.host, r.pid, {ms} FROM {table} r \
         WHERE r.name = $1 AND NOT EXISTS (SELECT 1 FROM taken)"
    )
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
        assert!(sql.acquire.contains("nextval('locks.leases_fence')"));
        for s in [&sql.extend, &sql.release] {
            assert!(s.contains("token = $2 AND expires_at > now()"), "{s}");
        }
    }
}
