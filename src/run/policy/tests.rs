//! Unit tests of the acquire policy: every kind of answer, at every side of the two
//! time limits (the late-answer cut-off and the give-up time), the token rotation
//! after an ambiguous attempt, and the backoff and warnings after failures.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

const MS: Duration = Duration::from_millis(1);

fn at(ms: u64) -> BootInstant {
    BootInstant::from_since_boot(Duration::from_millis(ms))
}

/// Distinct tokens, as the OS generator gives (also for the driver's tests).
pub(in crate::run) fn counted_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("token-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A random number of 150: the first retry 49 ms after a failure (150 mod 101).
const FIXED: Random = Random {
    token: counted_token,
    number: || 150,
};

/// TTL 3000 ms, renew every 1000 ms, kill-after 500 ms: drift 80 ms, grace 500 ms, so
/// an answer to a request sent at `s` is usable until `s + 2420 ms` (exclusive).
/// `--wait` 10 s from a start at 1000 ms: give up at 11000 ms.
fn policy_waiting(wait: Duration) -> Policy {
    let terms = Terms {
        lease: Params::new(3000 * MS, 1000 * MS, 500 * MS),
        wait,
        request_timeout: 1000 * MS,
        backend: "127.0.0.1:6379".into(),
    };
    let request = AcquireRequest {
        token: counted_token(),
        ttl: 3000 * MS,
        host: "here".into(),
        pid: 42,
    };
    Policy::new(terms, request, FIXED, at(1000))
}

fn policy() -> Policy {
    policy_waiting(10_000 * MS)
}

/// Someone else holding the lock (also for the driver's tests).
pub(in crate::run) fn holder() -> Holder {
    Holder {
        host: "there".into(),
        pid: 7,
        since_ms: 1,
        fencing_token: 3,
        ttl_left: 2000 * MS,
        ..Holder::default()
    }
}

fn acquired(sent_at: u64) -> Reply {
    Reply::Acquired {
        fencing_token: 9,
        slot: 0,
        sent_at: at(sent_at),
    }
}

fn unavailable() -> Reply {
    Reply::Failed(BackendError::Unavailable("connection refused".into()))
}

#[test]
fn an_answer_in_time_is_taken_with_the_token_it_was_sent_with() {
    let mut p = policy();
    let token = p.request().token.clone();
    let next = p.on_reply(acquired(1500), at(1500 + 2419));
    assert_eq!(
        next,
        Next::Take(Taken {
            sent_at: at(1500),
            fencing_token: 9,
            slot: 0,
            token,
            waited: (500 + 2419) * MS,
        })
    );
}

#[test]
fn an_answer_after_the_deadline_less_the_grace_is_not_taken() {
    let mut p = policy();
    let old = p.request().token.clone();
    match p.on_reply(acquired(1500), at(1500 + 2420)) {
        Next::Retry {
            after,
            abandon,
            error: BackendError::Unavailable(why),
            ..
        } => {
            assert_eq!(after, 49 * MS, "150 ms of jitter modulo 101 ms");
            assert_eq!(abandon, old, "the late lease is given back");
            assert!(why.contains("answered too slowly"), "{why}");
        }
        other => panic!("a late answer must not be taken: {other:?}"),
    }
    assert_ne!(p.request().token, old, "and its token never used again");
}

/// Regression (found by the soak): after an ambiguous attempt the old token is given
/// back and every later attempt carries a new one, so a late release of the old token
/// cannot remove a lock a later attempt takes.
#[test]
fn ambiguous_attempts_abandon_their_token_and_the_next_uses_a_new_one() {
    let mut p = policy();
    let mut used = vec![p.request().token.clone()];
    for (reply, now) in [(Reply::TimedOut(1000 * MS), 2000), (unavailable(), 3000)] {
        match p.on_reply(reply, at(now)) {
            Next::Retry { abandon, .. } => assert_eq!(&abandon, used.last().unwrap()),
            other => panic!("a transient failure is retried: {other:?}"),
        }
        assert!(
            !used.contains(&p.request().token),
            "a token is never reused"
        );
        used.push(p.request().token.clone());
    }
    match p.on_reply(acquired(4000), at(4100)) {
        Next::Take(taken) => assert_eq!(&taken.token, used.last().unwrap()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_timeout_says_which_backend_did_not_answer_and_how_long_it_was_given() {
    let mut p = policy();
    match p.on_reply(Reply::TimedOut(1000 * MS), at(2000)) {
        Next::Retry { error, .. } => assert_eq!(
            error.to_string(),
            "the backend at 127.0.0.1:6379 did not answer within 1s"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn permanent_errors_fail_at_once_and_keep_the_token() {
    for error in [
        BackendError::Refused("WRONGPASS".into()),
        BackendError::NotOwner,
    ] {
        let mut p = policy();
        let token = p.request().token.clone();
        let next = p.on_reply(Reply::Failed(error.clone()), at(1001));
        assert_eq!(
            next,
            Next::Fail {
                error,
                abandon: None,
                attempts: 1,
                tried_for: MS,
            }
        );
        assert_eq!(p.request().token, token);
    }
}

#[test]
fn the_last_retry_comes_when_wait_runs_out_and_a_failure_then_gives_up() {
    // Give up at 11000 ms; after many failures the backoff may draw up to 5 s.
    let mut p = policy();
    p.random.number = || 4999;
    p.failures = 10;
    match p.on_reply(unavailable(), at(10_900)) {
        Next::Retry { after, .. } => assert_eq!(after, 100 * MS, "cut to the give-up time"),
        other => panic!("{other:?}"),
    }
    let old = p.request().token.clone();
    match p.on_reply(unavailable(), at(11_000)) {
        Next::Fail {
            error: BackendError::Unavailable(why),
            abandon: Some(abandon),
            attempts: 2,
            tried_for,
        } => {
            assert_eq!(abandon, old, "the ambiguous attempt is still given back");
            assert_eq!(why, "connection refused", "the last error is reported");
            assert_eq!(tried_for, 10_000 * MS);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn without_wait_a_transient_failure_fails() {
    let mut p = policy_waiting(Duration::ZERO);
    assert!(matches!(
        p.on_reply(Reply::TimedOut(1000 * MS), at(1000)),
        Next::Fail {
            abandon: Some(_),
            attempts: 1,
            ..
        }
    ));
}

#[test]
fn the_backoff_ceiling_doubles_from_100_ms_to_at_most_5_s() {
    let ceilings: Vec<u128> = (1..=8).map(|n| retry_ceiling(n).as_millis()).collect();
    assert_eq!(ceilings, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    assert_eq!(retry_ceiling(0), 100 * MS);
    assert_eq!(retry_ceiling(u32::MAX), RETRY_CAP);
}

#[test]
fn the_pause_is_full_jitter_from_0_to_the_ceiling() {
    fn retry_after(number: fn() -> u64, failures_before: u32) -> Duration {
        let mut p = policy_waiting(1000 * 1000 * MS);
        p.random.number = number;
        p.failures = failures_before;
        match p.on_reply(unavailable(), at(1000)) {
            Next::Retry { after, .. } => after,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(retry_after(|| 0, 0), Duration::ZERO);
    assert_eq!(retry_after(|| 100, 0), 100 * MS);
    assert_eq!(retry_after(|| 101, 0), Duration::ZERO);
    assert_eq!(retry_after(|| 200, 1), 200 * MS, "the second failure");
    assert_eq!(retry_after(|| 5000, 20), 5000 * MS);
    assert_eq!(
        retry_after(|| u64::MAX, 20),
        Duration::from_millis(u64::MAX % 5001)
    );
}

#[test]
fn an_answer_from_the_backend_starts_the_backoff_over() {
    let mut p = policy();
    p.on_reply(unavailable(), at(1000));
    p.on_reply(Reply::TimedOut(1000 * MS), at(2000));
    assert_eq!(p.failures, 2);
    p.on_reply(Reply::Busy(holder()), at(3000));
    assert_eq!(p.failures, 0);
    p.on_reply(unavailable(), at(4000));
    assert_eq!(p.failures, 1);
}

#[test]
fn failures_are_warned_about_once_then_at_most_once_a_minute() {
    let mut p = policy_waiting(1000 * 1000 * MS);
    let mut warned = Vec::new();
    for (i, now) in [1000, 2000, 60_999, 61_000, 61_500, 121_000, 125_000]
        .into_iter()
        .enumerate()
    {
        match p.on_reply(unavailable(), at(now)) {
            Next::Retry { warn, attempts, .. } => {
                assert_eq!(attempts, i as u32 + 1);
                if warn != Warn::Quietly {
                    warned.push((now, warn));
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        warned,
        [
            (1000, Warn::First),
            (61_000, Warn::Again),
            (121_000, Warn::Again)
        ]
    );
}

#[test]
fn busy_before_the_give_up_time_waits_for_the_rest_of_it() {
    let mut p = policy();
    let token = p.request().token.clone();
    assert_eq!(
        p.on_reply(Reply::Busy(holder()), at(4000)),
        Next::Wait {
            holder: holder(),
            for_at_most: 7000 * MS,
        }
    );
    assert_eq!(p.request().token, token, "a busy answer is not ambiguous");
}

#[test]
fn busy_at_or_after_the_give_up_time_gives_up_with_the_holder() {
    for now in [11_000, 12_000] {
        let mut p = policy();
        assert_eq!(
            p.on_reply(Reply::Busy(holder()), at(now)),
            Next::GiveUpBusy {
                holder: holder(),
                waited: Duration::from_millis(now - 1000),
            }
        );
    }
}

#[test]
fn without_wait_busy_gives_up_at_once() {
    let mut p = policy_waiting(Duration::ZERO);
    assert!(matches!(
        p.on_reply(Reply::Busy(holder()), at(1000)),
        Next::GiveUpBusy { .. }
    ));
}

#[test]
fn the_splay_pause_covers_zero_to_the_splay_uniformly_and_never_more() {
    let max = Duration::from_secs(2);
    assert_eq!(splay_pause(max, 0), Duration::ZERO);
    assert!(splay_pause(max, u64::MAX) <= max);
    assert!(splay_pause(max, u64::MAX) > max - MS);
    assert_eq!(splay_pause(max, 1 << 63), Duration::from_secs(1));
    assert_eq!(
        splay_pause(Duration::from_secs(4), 1 << 62),
        Duration::from_secs(1)
    );
    // The longest splay does not overflow.
    assert!(splay_pause(Duration::from_secs(86_400), u64::MAX) <= Duration::from_secs(86_400));
}
