//! Unit tests of [`super`] (`backend::postgres::sql`).

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
    for s in [&sql.extend, &sql.keep, &sql.release] {
        assert!(
            s.contains("name = $1 AND token = $2 AND expires_at > now()"),
            "{s}"
        );
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
    assert!(sql.acquire.contains(&format!(
        "0::bigint, {SLOTS_OF_TOKEN}, (SELECT n FROM ahead) FROM t r"
    )));
}

#[test]
fn a_plain_acquisition_looks_at_its_row_and_the_names_limit_row_only() {
    let sql = Sql::new("t");
    let s = &sql.acquire;
    assert!(
        s.contains("r.name IN ($6, $10) AND r.expires_at > now()"),
        "{s}"
    );
    assert!(s.contains("WHERE NOT EXISTS (SELECT 1 FROM lim)"), "{s}");
    for s in [&sql.acquire, &sql.extend, &sql.keep, &sql.release] {
        assert!(!s.contains("ANY($1)") && !s.contains("[]"), "{s}");
        assert!(!s.contains("statement_timestamp"), "{s}");
    }
}

#[test]
fn every_step_is_a_transaction_with_local_settings_only() {
    assert!(!LOCAL_SETTINGS.replace("SET LOCAL", "").contains("SET "));
    assert!(begin(None).starts_with("BEGIN; SET LOCAL synchronous_commit = on;"));
    assert!(begin(Some(7)).ends_with("; SELECT pg_advisory_xact_lock(7)"));
}

#[test]
fn acquisitions_read_the_queue_locked_and_admit_only_with_no_waiter_ahead() {
    let sql = Sql::new("t");
    let (plain, slot) = (&sql.acquire, &sql.acquire_slot);
    assert!(plain.contains("q AS (SELECT token FROM t WHERE name = $7 FOR UPDATE)"));
    assert!(slot.contains("q AS (SELECT token FROM t WHERE name = $8 FOR UPDATE)"));
    assert!(plain.contains("AND (SELECT n FROM ahead) = 0"), "{plain}");
    assert!(slot.contains("(SELECT n FROM ahead) < (SELECT count(*) FROM seen WHERE NOT live)"));
    // The queue is rewritten from the row as written, and leaves the queue row of
    // the name to the cleanup of no one.
    for s in [plain, slot] {
        assert!(s.contains("unnest(string_to_array(r.token, ' '))"), "{s}");
        assert!(s.contains("WHERE NOT EXISTS (SELECT 1 FROM taken)"), "{s}");
    }
    assert!(plain.contains("name <> $1 AND name <> $7"));
    assert!(slot.contains("name <> $7 AND name <> $8"));
    assert!(sql.leave.starts_with("UPDATE t AS r SET token = "));
    assert!(!sql.leave.contains("taken"), "{}", sql.leave);
}

#[test]
fn holders_of_a_plain_lock_and_of_a_semaphore_have_their_statements() {
    let sql = Sql::new("t");
    assert_eq!(sql.on_token(OnToken::Extend, 1), (&*sql.extend, false));
    assert_eq!(sql.on_token(OnToken::Keep, 1), (&*sql.keep, false));
    assert_eq!(sql.on_token(OnToken::Release, 1), (&*sql.release, false));
    assert_eq!(sql.on_token(OnToken::Extend, 2), (&*sql.extend_slot, false));
    assert_eq!(sql.on_token(OnToken::Keep, 3), (&*sql.keep_slot, true));
    assert_eq!(
        sql.on_token(OnToken::Release, 1000),
        (&*sql.release_slot, true)
    );
}

#[test]
fn the_limit_row_is_a_holder_for_another_n_and_goes_with_a_forced_release() {
    let sql = Sql::new("t");
    assert!(sql.inspect.contains(&format!(
        "r.name = $2 AND r.expires_at > now() AND r.token <> '' AND {SLOTS_OF_TOKEN} <> $3"
    )));
    assert!(sql
        .force
        .contains("name = $3 AND token = '/' || array_length($1::text[], 1)"));
    assert!(!sql.force.contains("now()"), "{}", sql.force);
}

#[test]
fn the_end_of_a_run_leaves_its_record_in_the_same_statement() {
    let sql = Sql::new("t");
    // A renewal writes no record; a hold and a release do, from the row they change.
    assert!(!sql.extend.contains("recorded"), "{}", sql.extend);
    for s in [&sql.keep, &sql.release] {
        assert!(s.starts_with("WITH ended AS ( UPDATE t SET"), "{s}");
        assert!(s.contains("SELECT $4, 'run:' || 0 || ':'"), "{s}");
        assert!(s.contains("FROM ended f WHERE $5 <> ''"), "{s}");
    }
    assert!(sql
        .release
        .ends_with("SELECT pg_notify($3, '')::text FROM ended"));
    for s in [&sql.keep_slot, &sql.release_slot] {
        assert!(
            s.contains("SELECT $6, 'run:' || array_position($5::text[], f.name) - 1 || ':'"),
            "{s}"
        );
        assert!(s.contains("FROM kept f WHERE $7 <> ''"), "{s}");
        // The name lock's transaction judges by the statement's own clock.
        assert!(!s.contains("now()"), "{s}");
    }
    assert!(!sql.extend_slot.contains("recorded"));
}
