//! Run records on PostgreSQL: the last run of a name, kept in the lock table itself
//! (no new table, column or grant), written by the release's own statement (one round
//! trip, as before) and read by `status`. Pure text and parsing; part of [`super`].
//!
//! The record of lock key `KEY` (`PREFIX{NAME}`) is the row `KEY#last`
//! ([`record_key`]): a key no lock, slot, limit or queue row has (see `keys.rs`). Its
//! columns are the released holder's `fence`, `host`, `pid` and `since` (the start, by
//! the database's clock), `expires_at` the end plus [`KEEP`], and `token` the rest,
//! `run:SLOT:ENDED_MS:EXIT:ENDED_BY`, then `|OK_STARTED_MS|OK_HOST` once a run of the
//! name succeeded ([`RecordToken`]; the last success, which `--once-per` judges by: a
//! run that exits 0 writes its own, any other keeps the one before): it is never
//! empty and never a holder's (hex, or hex and `/N`). The end is the statement's
//! clock, as every expiry. The acquisitions' cleanup (`sql::cleanup`) deletes the row
//! a day after it expired, as every other row; `status` shows it only while it has
//! not.
//!
//! A release (or `--hold-at-least`) of a run writes it from the row it frees (or
//! keeps), in the same statement: [`record_cte`]. An attempt given up (no command ran)
//! passes an empty end, and writes nothing. With `--slots N` it is the run of any slot
//! that ended last.

use std::time::Duration;

use tokio_postgres::Row;

use crate::backend::{LastOk, RunEnd, RunRecord, MAX_SLOTS};

/// How long a record lasts after its run ended: the 7 days of the SPEC ("as long as
/// the fencing counter", which on PostgreSQL is a sequence that never expires), as
/// Redis keeps its records.
pub(super) const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// The key of the record row of the lock whose plain key is `key`.
pub(super) fn record_key(key: &str) -> String {
    format!("{key}#last")
}

/// What a release passes for the record: `EXIT:ENDED_BY`, or empty (no record).
pub(super) fn end_param(end: Option<RunEnd>) -> String {
    match end {
        Some(e) => format!("{}:{}", e.exit_status, e.ended_by.as_str()),
        None => String::new(),
    }
}

/// The CTE `recorded` of a release or a hold: from the holder rows of CTE `from`
/// (columns `name`, `fence`, `host`, `pid`, `since`; at most one is used), writes the
/// record row `key` (an SQL expression) with slot `slot` (an SQL expression on the
/// row, `f`) and the end `end` (a parameter from [`end_param`]; empty: nothing
/// written). The row is the record's whatever it held before; its last success stays
/// unless this run exited 0 (or the row had expired).
pub(super) fn record_cte(table: &str, from: &str, key: &str, slot: &str, end: &str) -> String {
    let keep_ms = KEEP.as_millis();
    format!(
        "recorded AS ( \
           INSERT INTO {table} AS r (name, token, fence, host, pid, since, expires_at) \
           SELECT {key}, 'run:' || {slot} || ':' || \
             (extract(epoch FROM now()) * 1000)::bigint || ':' || {end} || \
             CASE WHEN {end} LIKE '0:%' THEN '|' || \
               coalesce((extract(epoch FROM f.since) * 1000)::bigint, 0) || '|' || \
               coalesce(f.host, '') ELSE '' END, \
             f.fence, f.host, f.pid, f.since, now() + interval '{keep_ms} milliseconds' \
           FROM {from} f WHERE {end} <> '' ORDER BY f.name LIMIT 1 \
           ON CONFLICT (name) DO UPDATE SET token = excluded.token || \
             CASE WHEN {end} LIKE '0:%' OR r.expires_at <= now() THEN '' \
             ELSE coalesce(substring(r.token FROM '[|].*$'), '') END, fence = excluded.fence, \
             host = excluded.host, pid = excluded.pid, since = excluded.since, \
             expires_at = excluded.expires_at)"
    )
}

/// The statement `status` reads the record with: `$1` the record key. Answers
/// `fence, host, pid, since_ms, token` while the record lasts.
pub(super) fn last_run(table: &str) -> String {
    format!(
        "SELECT fence, host, pid, (extract(epoch FROM since) * 1000)::bigint, token \
         FROM {table} WHERE name = $1 AND expires_at > now()"
    )
}

/// The statement `lockrun list` finds the names with: `$1` the prefix and `{`.
/// Answers the key of every row under it, live or not (a name's holders and record
/// are then read as `status` reads them).
pub(super) fn names(table: &str) -> String {
    format!("SELECT name FROM {table} WHERE starts_with(name, $1)")
}

/// The fields a record keeps in its `token` column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RecordToken {
    slot: u32,
    ended_ms: u64,
    exit_status: u8,
    ended_by: String,
    last_ok: Option<LastOk>,
}

impl RecordToken {
    /// Parses `run:SLOT:ENDED_MS:EXIT:ENDED_BY[|OK_STARTED_MS|OK_HOST]` (`ENDED_BY`
    /// is any non-empty text up to a `|`, `OK_HOST` the rest, both shown with care as
    /// every stored field); `None` if malformed.
    pub(super) fn parse(token: &str) -> Option<RecordToken> {
        let mut parts = token.strip_prefix("run:")?.splitn(4, ':');
        let mut next = || {
            parts
                .next()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        };
        let slot = next()?.parse().ok().filter(|&s| s < MAX_SLOTS)?;
        let ended_ms = next()?.parse().ok()?;
        let exit_status = next()?.parse().ok()?;
        let rest = parts.next()?;
        let (ended_by, ok) = match rest.split_once('|') {
            Some((by, ok)) => (by, Some(ok)),
            None => (rest, None),
        };
        let last_ok = match ok {
            Some(ok) => {
                let (started, host) = ok.split_once('|')?;
                let digits = !started.is_empty() && started.bytes().all(|b| b.is_ascii_digit());
                Some(LastOk {
                    started_ms: started.parse().ok().filter(|_| digits)?,
                    host: host.to_owned(),
                })
            }
            None => None,
        };
        Some(RecordToken {
            slot,
            ended_ms,
            exit_status,
            ended_by: Some(ended_by).filter(|b| !b.is_empty())?.to_owned(),
            last_ok,
        })
    }
}

/// The record of the [`last_run`] answer row `row`; `None` if any field is not one a
/// record can have (a row written by hand, a table that is not lockrun's).
pub(super) fn parse_row(row: &Row) -> Option<RunRecord> {
    let fence: i64 = row.try_get(0).ok()?;
    let pid: i64 = row.try_get(2).ok()?;
    let since: i64 = row.try_get(3).ok()?;
    let token: String = row.try_get(4).ok()?;
    let t = RecordToken::parse(&token)?;
    Some(RunRecord {
        host: row.try_get(1).ok()?,
        pid: u32::try_from(pid).ok()?,
        fencing_token: u64::try_from(fence).ok()?,
        slot: t.slot,
        started_ms: u64::try_from(since).ok()?,
        ended_ms: t.ended_ms,
        exit_status: t.exit_status,
        ended_by: t.ended_by,
        last_ok: t.last_ok,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::EndedBy;

    #[test]
    fn the_record_token_reads_back_and_refuses_what_a_run_never_writes() {
        let end = end_param(Some(RunEnd {
            exit_status: 124,
            ended_by: EndedBy::MaxRuntime,
        }));
        assert_eq!(end, "124:max_runtime");
        assert_eq!(end_param(None), "");
        assert_eq!(
            RecordToken::parse(&format!("run:2:1714557605000:{end}")),
            Some(RecordToken {
                slot: 2,
                ended_ms: 1_714_557_605_000,
                exit_status: 124,
                ended_by: "max_runtime".into(),
                last_ok: None,
            })
        );
        let ok = RecordToken::parse("run:0:9:3:exited|1714557600000|web-2").unwrap();
        assert_eq!((ok.exit_status, ok.ended_by.as_str()), (3, "exited"));
        assert_eq!(
            ok.last_ok,
            Some(LastOk {
                started_ms: 1_714_557_600_000,
                host: "web-2".into()
            })
        );
        for bad in [
            "run:0:9:3:exited|",
            "run:0:9:3:exited|x|h",
            "run:0:9:3:|1|h",
            "run:0:9:3:exited||h",
        ] {
            assert_eq!(RecordToken::parse(bad), None, "{bad:?}");
        }
        // The reason is the rest, whatever it holds.
        let odd = RecordToken::parse("run:0:1:3:a:b c").unwrap();
        assert_eq!(odd.ended_by, "a:b c");
        for bad in [
            "",
            "run:",
            "run:0:1:3:",
            "run:0:1:3",
            "run:0:1:256:exited",
            "run:-1:1:3:exited",
            "run:+1:1:3:exited",
            "run:0:x:3:exited",
            "run:1000:1:3:exited",
            "0123456789abcdef0123456789abcdef",
            "0123456789abcdef0123456789abcdef/3",
            "/3",
        ] {
            assert_eq!(RecordToken::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_record_row_has_a_key_of_its_own_and_expires() {
        assert_eq!(record_key("lockrun:{job}"), "lockrun:{job}#last");
        let cte = record_cte("t", "kept", "$4", "0", "$5");
        assert!(cte.contains("FROM kept f WHERE $5 <> '' ORDER BY f.name LIMIT 1"));
        assert!(
            cte.contains("now() + interval '604800000 milliseconds'"),
            "{cte}"
        );
        // Only a success replaces the last success; any other run keeps it.
        assert!(cte.contains("CASE WHEN $5 LIKE '0:%' THEN '|'"), "{cte}");
        assert!(cte.contains("substring(r.token FROM '[|].*$')"), "{cte}");
        assert!(last_run("t").ends_with("WHERE name = $1 AND expires_at > now()"));
    }
}
