//! `--once-per D` on etcd, which tells no time: the period is measured by etcd's own
//! lease clock. Part of [`super`].
//!
//! **How.** A run with `--once-per`, once it holds its slot, grants a lease of
//! [`PERIOD_TTL`] (the period lease) and, in one transaction, puts its period key
//! `P{NAME}:run#FENCE` on it and reads the name's last success `P{NAME}:ok`, every
//! period key and every slot. A lease's age is its granted TTL less the TTL left, both
//! from etcd (`LeaseTimeToLive`): how long ago, by etcd's clock, the run that granted
//! it started. The run is skipped when the last success is on such a lease younger
//! than D, or (with `--slots`) a slot taken before ours is held by a run whose period
//! lease is younger than D ([`judge`]). The release of a run that exited 0 puts `:ok`
//! on its period lease, so the next run reads its age there; every release deletes
//! the run's period key, and afterwards revokes the lease a success no longer needs
//! (its own after a failure, the superseded success's after a success).
//!
//! **Whole seconds.** TTLs are whole seconds and the TTL left is rounded down, so an
//! age is known to a second: the judgment takes the lower bound, so two successes never
//! start within D, and a run may be skipped up to a second after D has passed.
//!
//! **What etcd does not tell.** A success recorded by a run without `--once-per` is on
//! the records' week lease, and a holder without `--once-per` has no period lease: their
//! ages come from the holders' clocks (the times the values keep), the best there is.
//! A new leader gives every lease its whole TTL again (unless lease checkpointing is
//! on), so after a leader change a success looks as young as the change: runs are
//! skipped for up to D longer, never run twice within D.

use std::time::Duration;

use super::record::ok_from;
use super::slots::SlotKeys;
use super::value::{holder_from, new_lease_id, ttl_secs};
use super::wire::{KeyValue, RequestOp, Response, TxnRequest};
use super::{EtcdBackend, OncePerLease, OurLease};
use crate::backend::{BackendError, Holder, LastOk, Period, Skip};

/// The TTL of a period lease: longer than the longest `--once-per` (7 days), so that a
/// success is still there for any later run's period.
pub const PERIOD_TTL: Duration = Duration::from_secs(8 * 24 * 3600);

/// What a run with `--once-per` found, with the ages (milliseconds, by etcd's lease
/// clock, at least) known of each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// When our run took the lock, by our clock (for ages etcd cannot tell).
    pub our_since_ms: u64,
    /// The last success, and its age if it is on a period lease.
    pub ok: Option<(LastOk, Option<u64>)>,
    /// The holders of slots taken before ours, each with its period lease's age.
    pub earlier: Vec<(Holder, Option<u64>)>,
}

/// The verdict for a run that found `seen`, with `--once-per period`.
pub fn judge(seen: &Seen, period: Duration) -> Period {
    let age = |known: Option<u64>, started_ms: u64| {
        known.unwrap_or_else(|| seen.our_since_ms.saturating_sub(started_ms))
    };
    let within = |age_ms: u64| u128::from(age_ms) < period.as_millis();
    if let Some((ok, known)) = &seen.ok {
        if within(age(*known, ok.started_ms)) {
            return Period::Skip(Skip::Succeeded(ok.clone()));
        }
    }
    for (h, known) in &seen.earlier {
        if within(age(*known, h.since_ms)) {
            return Period::Skip(Skip::Running(h.clone()));
        }
    }
    Period::Run
}

/// The age of a lease from `LeaseTimeToLive`'s `(ttl left, granted ttl)`: its lower
/// bound in milliseconds, if it is a period lease still alive.
pub fn lease_age_ms((left, granted): (i64, i64)) -> Option<u64> {
    let ours = granted == ttl_secs(PERIOD_TTL) && left > 0;
    // The TTL left is rounded down: the lease may be up to a second younger.
    let secs = granted.checked_sub(left)?.checked_sub(1)?.max(0);
    ours.then(|| u64::try_from(secs).unwrap_or(0) * 1000)
}

/// The value of a period key: who runs, for a reader of the key.
fn period_value(holder_value: &str, fence: u64) -> String {
    let h = holder_from(holder_value.as_bytes(), 0, 0);
    serde_json::json!({"host": h.host, "started_ms": h.since_ms, "fencing_token": fence})
        .to_string()
}

impl EtcdBackend {
    /// `--once-per period` for the run of `token`, which holds a slot of `name`.
    pub(super) async fn judge_once_per(
        &self,
        name: &str,
        token: &str,
        period: Duration,
    ) -> Result<Period, BackendError> {
        let Some((ours, slot)) = self.our_slot(token) else {
            return Err(BackendError::NotOwner);
        };
        let keys = self.keys(name);
        let [oks, periods, slots] = self.start_period(&keys, &ours, token).await?;
        let ok = oks
            .first()
            .and_then(|kv| ok_from(&kv.value).map(|ok| (ok, kv.lease)));
        let before_ours =
            |kv: &KeyValue| u64::try_from(kv.create_revision).unwrap_or(0) < ours.fence;
        let earlier: Vec<(Holder, i64)> = keys
            .read(slots)
            .held
            .into_iter()
            .filter(|(s, kv)| *s != slot && before_ours(kv))
            .map(|(s, kv)| {
                let h = Holder {
                    slot: s,
                    ..holder_from(&kv.value, kv.create_revision, 0)
                };
                let lease = period_lease(&periods, &keys.period_key(h.fencing_token));
                (h, lease)
            })
            .collect();
        let mut seen = Seen {
            our_since_ms: holder_from(ours.value.as_bytes(), 0, 0).since_ms,
            ..Seen::default()
        };
        if let Some((last, lease)) = ok {
            let age = self.age(lease).await?;
            if age.is_some() {
                self.note_superseded(token, lease);
            }
            seen.ok = Some((last, age));
        }
        for (h, lease) in earlier {
            let age = self.age(lease).await?;
            seen.earlier.push((h, age));
        }
        Ok(judge(&seen, period))
    }

    /// Grants our period lease and, in one transaction, puts our period key on it and
    /// reads the last success, every period key and every slot of `keys`' name.
    async fn start_period(
        &self,
        keys: &SlotKeys,
        ours: &OurLease,
        token: &str,
    ) -> Result<[Vec<KeyValue>; 3], BackendError> {
        let id = new_lease_id();
        // Noted before asking: the release revokes it, whatever the answer.
        if let Some(l) = self.local().lease.as_mut().filter(|l| l.token == token) {
            l.period = Some(OncePerLease {
                id,
                superseded: None,
            });
        }
        let secs = ttl_secs(PERIOD_TTL);
        self.call(async |c| c.lease_grant(id, secs).await).await?;
        let (first, end) = keys.period_range();
        let ok_key = keys.ok_key();
        let mine = period_value(&ours.value, ours.fence);
        let txn = TxnRequest {
            compare: vec![],
            success: vec![
                RequestOp::put(keys.period_key(ours.fence), &mine, id),
                RequestOp::range_of(&ok_key, format!("{ok_key}\0")),
                RequestOp::range_of(&first, &end),
                RequestOp::range_of(keys.start(), keys.end()),
            ],
            failure: vec![],
        };
        let reply = self.call(async |c| c.txn(txn.clone()).await).await?;
        let mut ranges = reply
            .responses
            .into_iter()
            .filter_map(|r| match r.response {
                Some(Response::Range(range)) => Some(range.kvs),
                None => None,
            });
        Ok(std::array::from_fn(|_| ranges.next().unwrap_or_default()))
    }

    /// The age of period lease `lease` (0: none), if it is one.
    async fn age(&self, lease: i64) -> Result<Option<u64>, BackendError> {
        if lease == 0 {
            return Ok(None);
        }
        let reply = self.call(async |c| c.lease_age(lease).await).await?;
        Ok(lease_age_ms(reply))
    }

    /// Notes the period lease of the success ours would supersede.
    fn note_superseded(&self, token: &str, lease: i64) {
        let mut local = self.local();
        let ours = local.lease.as_mut().filter(|l| l.token == token);
        if let Some(p) = ours.and_then(|l| l.period.as_mut()) {
            p.superseded = (lease != p.id).then_some(lease);
        }
    }

    /// After the release of a run with a period lease: revokes the lease no success
    /// needs any more (ours after a failure or a skip, the one our success superseded).
    /// A failed revoke leaves it to its TTL: nothing that counts is on it.
    pub(super) async fn after_period(&self, period: Option<OncePerLease>, succeeded: bool) {
        let Some(p) = period else { return };
        let spare = match succeeded {
            true => p.superseded,
            false => Some(p.id),
        };
        if let Some(id) = spare {
            let _ = self.revoke(id).await;
        }
    }
}

/// The lease of the period key `key` among `periods` (0: none).
fn period_lease(periods: &[KeyValue], key: &str) -> i64 {
    periods
        .iter()
        .find(|kv| kv.key == key.as_bytes())
        .map_or(0, |kv| kv.lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(started_ms: u64) -> LastOk {
        LastOk {
            started_ms,
            host: "a".into(),
        }
    }

    #[test]
    fn a_success_on_a_period_lease_is_judged_by_its_age_alone() {
        // Our clock says the success was days ago; etcd's lease says 10 s.
        let seen = Seen {
            our_since_ms: 10_000_000,
            ok: Some((ok(1), Some(10_000))),
            ..Seen::default()
        };
        assert!(matches!(
            judge(&seen, Duration::from_secs(11)),
            Period::Skip(Skip::Succeeded(_))
        ));
        assert_eq!(judge(&seen, Duration::from_secs(10)), Period::Run);
    }

    #[test]
    fn without_a_period_lease_the_holders_clocks_judge() {
        let seen = Seen {
            our_since_ms: 100_000,
            ok: Some((ok(95_000), None)),
            ..Seen::default()
        };
        assert!(matches!(
            judge(&seen, Duration::from_secs(6)),
            Period::Skip(_)
        ));
        assert_eq!(judge(&seen, Duration::from_secs(5)), Period::Run);
    }

    #[test]
    fn an_earlier_holder_within_the_period_skips_us() {
        let h = Holder {
            since_ms: 1,
            ..Holder::default()
        };
        let seen = Seen {
            our_since_ms: 10_000_000,
            earlier: vec![(h, Some(2_000))],
            ..Seen::default()
        };
        assert!(matches!(
            judge(&seen, Duration::from_secs(3)),
            Period::Skip(Skip::Running(_))
        ));
        assert_eq!(judge(&seen, Duration::from_secs(2)), Period::Run);
    }

    #[test]
    fn a_lease_age_is_a_lower_bound_and_only_a_period_leases() {
        let granted = ttl_secs(PERIOD_TTL);
        assert_eq!(lease_age_ms((granted - 10, granted)), Some(9_000));
        assert_eq!(lease_age_ms((granted, granted)), Some(0));
        assert_eq!(lease_age_ms((-1, granted)), None, "gone");
        assert_eq!(
            lease_age_ms((100, 15 * 24 * 3600)),
            None,
            "the week's lease"
        );
    }
}
