//! `--once-per D`: whether this run may start its command, judged while it holds the
//! lock, after acquisition and before the command starts (property 11 of
//! docs/guarantees.md). Two reads side by side, bounded by one request timeout, and
//! only with `--once-per`: the holders of the name (ours gives this run's start by the
//! backend's clock, the time every record keeps too) and the run record (its last
//! success, [`LastOk`]). So no local clock takes part: hosts whose clocks disagree
//! judge alike.
//!
//! The run is skipped (the conflict status, event `skipped`; the caller gives the
//! lock back without a record, so the last success stays) when a run that started
//! less than D before ours succeeded, or, with `--slots N`, when another slot is held
//! by a run that started less than D before ours (it may still succeed; of two that
//! started together, the lower slot runs). A failed run does not count. When the
//! reads fail, nothing can be judged: the command is not started either, and the run
//! ends with 125 (an outage is not reported as a skip).

use std::time::Duration;

use super::policy::Taken;
use super::{fail, request_timeout};
use crate::backend::{Backend, Holder, Period, RunRecord, Skip};
use crate::config::RunConfig;
use crate::log::{emit, Event, Level};
use crate::outcome::Outcome;
use crate::units::{ms, rfc3339_ms};

/// `Ok` when the command may start (always without `--once-per`); else the outcome
/// of a run that did not start, logged.
pub(super) async fn check<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    taken: &Taken,
) -> Result<(), Outcome> {
    let Some(period) = cfg.once_per else {
        return Ok(());
    };
    let name = cfg.name.as_str();
    let not_judged = |why: String| {
        fail(&format!(
            "cannot tell whether {name:?} succeeded within --once-per {}: {why}; the \
             command was not started",
            ms(period)
        ))
    };
    let timeout = request_timeout(cfg.ttl);
    // A backend that tells no time judges itself (etcd: by its leases' clock).
    match tokio::time::timeout(timeout, backend.once_per(name, &taken.token, period)).await {
        Ok(Ok(Period::Run)) => return Ok(()),
        Ok(Ok(Period::Skip(why))) => return Err(skipped(cfg, period, &why)),
        Ok(Ok(Period::ByRecords)) => {}
        Ok(Err(e)) => return Err(not_judged(e.to_string())),
        Err(_) => return Err(not_judged("the backend did not answer in time".into())),
    }
    let reads = async { tokio::join!(backend.inspect(name), backend.last_run(name)) };
    let (holders, last) = match tokio::time::timeout(timeout, reads).await {
        Ok((Ok(h), Ok(l))) => (h, l),
        Ok((Err(e), _) | (_, Err(e))) => return Err(not_judged(e.to_string())),
        Err(_) => return Err(not_judged("the backend did not answer in time".into())),
    };
    let Some(ours) = holders.iter().find(|h| h.slot == taken.slot) else {
        return Err(not_judged("this run no longer holds the lock".into()));
    };
    match judge(ours.since_ms, taken.slot, period, &holders, last.as_ref()) {
        None => Ok(()),
        Some(why) => Err(skipped(cfg, period, &why)),
    }
}

/// The verdict for a run that took slot `slot` at `now_ms` (backend clock), given the
/// name's `holders` and its record `last`: `None` to run.
fn judge(
    now_ms: u64,
    slot: u32,
    period: Duration,
    holders: &[Holder],
    last: Option<&RunRecord>,
) -> Option<Skip> {
    let within =
        |started_ms: u64| u128::from(now_ms.saturating_sub(started_ms)) < period.as_millis();
    if let Some(ok) = last.and_then(|r| r.last_ok.as_ref()) {
        if within(ok.started_ms) {
            return Some(Skip::Succeeded(ok.clone()));
        }
    }
    holders
        .iter()
        .filter(|h| h.slot != slot && (h.since_ms, h.slot) < (now_ms, slot))
        .find(|h| within(h.since_ms))
        .map(|h| Skip::Running(h.clone()))
}

/// Logs the skip and returns the conflict status.
fn skipped(cfg: &RunConfig, period: Duration, why: &Skip) -> Outcome {
    let name = cfg.name.as_str();
    let (what, host, started_ms) = match why {
        Skip::Succeeded(ok) => ("last succeeded", ok.host.as_str(), ok.started_ms),
        Skip::Running(h) => (
            "has a run still holding a slot that started",
            h.host.as_str(),
            h.since_ms,
        ),
    };
    let at = rfc3339_ms(started_ms).unwrap_or_else(|| "an invalid time".into());
    let msg = format!(
        "skipped: lock {name:?} {what} at {at} on {host:?}, within --once-per {}; the \
         command was not started",
        ms(period)
    );
    let fields = [
        ("host", host.into()),
        ("started_ms", started_ms.into()),
        ("running", matches!(why, Skip::Running(_)).into()),
        ("once_per_ms", (period.as_millis() as u64).into()),
    ];
    emit(Level::Warn, Event::Skipped, &msg, &fields);
    Outcome::Busy(cfg.conflict_exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LastOk;

    const HOUR: Duration = Duration::from_secs(3600);
    const NOW: u64 = 1_714_557_600_000;

    fn record(ok_started_ms: Option<u64>) -> RunRecord {
        RunRecord {
            exit_status: 3,
            last_ok: ok_started_ms.map(|started_ms| LastOk {
                started_ms,
                host: "web-2".into(),
            }),
            ..RunRecord::default()
        }
    }

    fn holder(slot: u32, since_ms: u64) -> Holder {
        Holder {
            slot,
            since_ms,
            ..Holder::default()
        }
    }

    #[test]
    fn a_success_within_the_period_skips_and_one_before_it_does_not() {
        let ours = [holder(0, NOW)];
        let j = |ok| judge(NOW, 0, HOUR, &ours, Some(&record(ok)));
        assert!(matches!(j(Some(NOW - 1)), Some(Skip::Succeeded(ok)) if ok.host == "web-2"));
        assert!(j(Some(NOW - 3_599_999)).is_some());
        assert_eq!(j(Some(NOW - 3_600_000)), None);
        // A success "after" ours (a clock stepped back) is within the period too.
        assert!(j(Some(NOW + 5_000)).is_some());
        // No success kept (only failures), or no record at all: run.
        assert_eq!(j(None), None);
        assert_eq!(judge(NOW, 0, HOUR, &ours, None), None);
    }

    #[test]
    fn with_slots_the_earlier_of_two_runs_within_the_period_runs() {
        let both = [holder(0, NOW), holder(1, NOW - 10)];
        assert!(matches!(judge(NOW, 0, HOUR, &both, None), Some(Skip::Running(h)) if h.slot == 1));
        assert_eq!(judge(NOW - 10, 1, HOUR, &both, None), None);
        // Started together: the lower slot runs.
        let same = [holder(0, NOW), holder(1, NOW)];
        assert_eq!(judge(NOW, 0, HOUR, &same, None), None);
        assert!(judge(NOW, 1, HOUR, &same, None).is_some());
        // A holder from before the period does not count.
        let old = [holder(0, NOW), holder(1, NOW - 3_600_000)];
        assert_eq!(judge(NOW, 0, HOUR, &old, None), None);
    }
}
