//! Unit tests of the acquire policy: every kind of answer, at every side of the two
//! time limits (the late-answer cut-off and the give-up time), and the token rotation
//! after an ambiguous attempt.

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

/// Jitter of 150 ms: retries 250 ms after a failure.
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
    }
}

fn acquired(sent_at: u64) -> Reply {
    Reply::Acquired {
        fencing_token: 9,
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
        } => {
            assert_eq!(after, 250 * MS);
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
    for (reply, now) in [(Reply::TimedOut, 2000), (unavailable(), 3000)] {
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
    match p.on_reply(Reply::TimedOut, at(2000)) {
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
                abandon: None
            }
        );
        assert_eq!(p.request().token, token);
    }
}

#[test]
fn a_retry_that_would_come_at_or_after_the_give_up_time_fails_instead() {
    // Give up at 11000 ms; a retry comes 250 ms after the failure.
    let mut p = policy();
    assert!(matches!(
        p.on_reply(unavailable(), at(10_749)),
        Next::Retry { .. }
    ));
    let old = p.request().token.clone();
    match p.on_reply(unavailable(), at(10_750)) {
        Next::Fail {
            error: BackendError::Unavailable(_),
            abandon: Some(abandon),
        } => assert_eq!(abandon, old, "the ambiguous attempt is still given back"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn without_wait_a_transient_failure_fails() {
    let mut p = policy_waiting(Duration::ZERO);
    assert!(matches!(
        p.on_reply(Reply::TimedOut, at(1000)),
        Next::Fail {
            abandon: Some(_),
            ..
        }
    ));
}

#[test]
fn retry_jitter_is_100_to_499_ms() {
    fn retry_after(number: fn() -> u64) -> Duration {
        let mut p = policy();
        p.random.number = number;
        match p.on_reply(unavailable(), at(1000)) {
            Next::Retry { after, .. } => after,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(retry_after(|| 0), 100 * MS);
    assert_eq!(retry_after(|| 399), 499 * MS);
    assert_eq!(retry_after(|| 400), 100 * MS);
    assert_eq!(
        retry_after(|| u64::MAX),
        Duration::from_millis(100 + u64::MAX % 400)
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
