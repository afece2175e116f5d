//! The record of a lock's last run on etcd: the key `P{NAME}:last`, and beside it
//! `P{NAME}:ok`, the last run that succeeded (see [`super::slots`] for why no other key
//! is either), their values, and the lease they live on. Pure: no I/O. Part of
//! [`super`]; depends on [`super::value`] and [`super::wire`].
//!
//! **Values.** `:last` is JSON `{"host", "pid", "fencing_token", "slot", "started_ms",
//! "ended_ms", "exit_status", "ended_by"}`: the holder as this lockrun stored it in the
//! lock key (`started_ms` is its `since_ms`), and how and when the run ended. Both
//! times are the holder's clock: etcd tells no time. The token is not in it. `:ok` is
//! JSON `{"host", "started_ms"}` of the last run that exited 0: a key of its own, put
//! only by such a run (in the same transaction), so that a failed run leaves it as it
//! was without reading it first.
//!
//! **Expiry.** An etcd key expires only with a lease. One lease per record would cost a
//! grant per run and leave a lease per run alive for days; instead every record written
//! under one prefix in one week (weeks since the Unix epoch, by the writer's clock)
//! goes on one shared lease of [`RECORD_TTL`], whose ID every lockrun derives from the
//! prefix and the week ([`lease_id`]): nobody asks which lease it is. The release puts
//! the record on it in the transaction that deletes the lock key; when etcd answers that
//! the lease does not exist (the first release of a week), the release grants it and
//! sends the transaction again: that one run makes two calls more. The lease is granted
//! at or after the week began, so a record written in the week lives at least
//! `RECORD_TTL` - 1 week = 8 days after its run (a writer's clock a day off leaves 7),
//! and at most 15 (22 if the lease was granted late by a clock a week behind).
//!
//! etcd gives every lease its whole TTL again when the leader changes (unless lease
//! checkpointing is on): a cluster whose leader changes more often than every 15 days
//! would keep a week's lease for ever. So the release that grants week W's lease also
//! revokes those of weeks W-3 to W-5 under the prefix ([`SWEPT`]), whose records were
//! written at least 14 days before; a lease already gone answers "not found".

use std::time::Duration;

use super::value::holder_from;
use super::wire::RequestOp;
use crate::backend::{LastOk, RunEnd, RunRecord};

/// A week, in seconds: the records of one week share a lease.
pub const WEEK_SECS: u64 = 7 * 24 * 3600;

/// The TTL of a week's lease: the week, then the 7 days every record is kept, and a
/// day for writers' clocks.
pub const RECORD_TTL: Duration = Duration::from_secs(15 * 24 * 3600);

/// The weeks back whose leases the grant of a week's lease revokes: every earlier
/// week's records are older than the 7 days kept by then, and a lease extended by
/// leader changes goes here (a prefix unused for more than two weeks leaves older
/// ones to their TTL).
pub const SWEPT: std::ops::RangeInclusive<u64> = 3..=5;

/// The week (since the Unix epoch) of `unix_secs`.
pub fn week_of(unix_secs: u64) -> u64 {
    unix_secs / WEEK_SECS
}

/// The ID of the lease the records written under `prefix` in `week` share: the first
/// 63 bits of a SHA-256 of both, positive (0 asks etcd to choose). A random lease ID
/// of a lock (also 63 bits) is as likely to be it as any other.
pub fn lease_id(prefix: &str, week: u64) -> i64 {
    let text = format!("lockrun run records\0{prefix}\0{week}");
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    i64::try_from(u64::from_be_bytes(first) >> 1)
        .unwrap_or(1)
        .max(1)
}

/// The record a release writes: the keys, their values, and their week's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordPut {
    /// `P{NAME}:last`.
    pub key: String,
    /// The JSON value.
    pub value: String,
    /// `P{NAME}:ok` and its value, for a run that succeeded.
    pub ok: Option<(String, String)>,
    /// The week it was written in (by this lockrun's clock).
    pub week: u64,
    /// That week's lease under the prefix ([`lease_id`]).
    pub lease: i64,
    /// The lease `:ok` goes on: the week's, or the run's period lease with
    /// `--once-per` (`period.rs`).
    pub ok_lease: i64,
    /// With `--once-per`: the run's period key, deleted by the release.
    pub period_key: Option<String>,
}

impl RecordPut {
    /// The record of the run that held `slot` with fencing token `fence`, as stored
    /// in its lock key's `value` (host, pid, since), ended as `end` now (this lockrun's
    /// clock), to be kept at `keys` (`:last`, `:ok`) on the lease of its week under
    /// `prefix`.
    pub fn new(
        keys: [String; 2],
        prefix: &str,
        value: &str,
        held: (u32, u64),
        end: RunEnd,
    ) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let [key, ok_key] = keys;
        let ok = (end.exit_status == 0).then(|| (ok_key, ok_value(value)));
        let value = record_value(value, held, end, now.as_millis() as u64);
        let week = week_of(now.as_secs());
        RecordPut {
            key,
            value,
            ok,
            week,
            lease: lease_id(prefix, week),
            ok_lease: lease_id(prefix, week),
            period_key: None,
        }
    }

    /// The transaction's operations that write it.
    pub fn ops(&self) -> Vec<RequestOp> {
        let ok = self
            .ok
            .iter()
            .map(|(k, v)| RequestOp::put(k, v, self.ok_lease));
        let last = RequestOp::put(&self.key, &self.value, self.lease);
        let period = self.period_key.iter().map(RequestOp::delete);
        std::iter::once(last).chain(ok).chain(period).collect()
    }
}

/// The value of `:ok` for the holder described in `value` (our lock key's).
fn ok_value(value: &str) -> String {
    let h = holder_from(value.as_bytes(), 0, 0);
    serde_json::json!({"host": h.host, "started_ms": h.since_ms}).to_string()
}

/// The last success read back from `:ok` (`None` for a value that is not one).
pub fn ok_from(value: &[u8]) -> Option<LastOk> {
    LastOk::from_json(&serde_json::from_slice(value).ok()?)
}

/// The record's value: the holder described in `value` (our lock key's) that held
/// `(slot, fencing token)`, ended as `end` at `ended_ms`.
pub fn record_value(value: &str, (slot, fence): (u32, u64), end: RunEnd, ended_ms: u64) -> String {
    let h = holder_from(value.as_bytes(), 0, 0);
    serde_json::json!({
        "host": h.host, "pid": h.pid, "fencing_token": fence, "slot": slot,
        "started_ms": h.since_ms, "ended_ms": ended_ms,
        "exit_status": end.exit_status, "ended_by": end.ended_by.as_str(),
    })
    .to_string()
}

/// A record read back; `None` for a value that is not one (written by hand, or by
/// something else): `status` then shows no last run.
pub fn record_from(value: &[u8]) -> Option<RunRecord> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    RunRecord::from_json(&v, v.get("ended_ms")?.as_u64()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{AcquireRequest, EndedBy};

    #[test]
    fn a_record_round_trips_without_the_token() {
        let req = AcquireRequest {
            token: "ab".repeat(16),
            ttl: Duration::from_secs(30),
            host: "web1".into(),
            pid: 4242,
        };
        let stored = super::super::value::holder_value(&req, 2, 3);
        let end = RunEnd {
            exit_status: 124,
            ended_by: EndedBy::MaxRuntime,
        };
        let value = record_value(&stored, (2, 77), end, 1_800_000_000_000);
        assert!(!value.contains(&req.token), "{value}");
        let r = record_from(value.as_bytes()).expect("a record");
        assert_eq!((r.host.as_str(), r.pid, r.slot), ("web1", 4242, 2));
        assert_eq!((r.fencing_token, r.exit_status), (77, 124));
        assert_eq!(r.ended_by, "max_runtime");
        assert!(r.started_ms > 1_600_000_000_000 && r.started_ms <= r.ended_ms);
        assert_eq!(r.ended_ms, 1_800_000_000_000);
        let keys = ["p{n}:last".to_owned(), "p{n}:ok".to_owned()];
        let failed = RecordPut::new(keys.clone(), "p", &stored, (2, 77), end);
        assert_eq!((failed.ok.clone(), failed.ops().len()), (None, 1));
        let ok = RunEnd {
            exit_status: 0,
            ended_by: EndedBy::Exited,
        };
        let put = RecordPut::new(keys, "p", &stored, (2, 77), ok);
        let (key, value) = put.ok.clone().expect("a success writes :ok");
        assert_eq!(key, "p{n}:ok");
        let last_ok = ok_from(value.as_bytes()).expect("a last success");
        assert_eq!(
            (last_ok.host.as_str(), last_ok.started_ms),
            ("web1", r.started_ms)
        );
        assert_eq!(put.ops().len(), 2);
        assert_eq!(ok_from(b"{}"), None);
    }

    #[test]
    fn anything_else_is_no_record() {
        for bad in [
            &b"not json"[..],
            b"{}",
            b"[1]",
            br#"{"host":"h","pid":1,"fencing_token":1,"slot":0,"started_ms":1,"ended_ms":2,"exit_status":256,"ended_by":"exited"}"#,
            br#"{"host":"h","pid":-1,"fencing_token":1,"slot":0,"started_ms":1,"ended_ms":2,"exit_status":0,"ended_by":"exited"}"#,
        ] {
            assert_eq!(record_from(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn each_prefix_and_week_has_a_lease_of_its_own_that_every_lockrun_finds() {
        let week = week_of(1_800_000_000);
        assert_eq!(week_of(week * WEEK_SECS), week);
        assert_eq!(week_of(week * WEEK_SECS - 1), week - 1);
        let id = lease_id("lockrun:", week);
        assert!(id > 0);
        assert_eq!(id, lease_id("lockrun:", week), "derived, not random");
        assert_ne!(id, lease_id("lockrun:", week + 1));
        assert_ne!(id, lease_id("other:", week));
    }

    #[test]
    fn a_record_outlives_the_seven_days_kept_and_the_sweep_spares_them() {
        // Written at the very end of its week on a lease granted at its very start.
        let kept = RECORD_TTL.as_secs() - WEEK_SECS;
        assert!(kept >= 8 * 24 * 3600, "{kept}");
        // The sweep at the start of week W revokes week W-3 at the earliest: its last
        // record is two whole weeks old.
        let youngest = (SWEPT.start() - 1) * WEEK_SECS;
        assert!(youngest >= 14 * 24 * 3600);
    }
}
