//! Tests of the acquire driver against a scripted backend: it sends the token the
//! policy gives, gives back the ones the policy abandons, and ends as it decides.

use std::cell::RefCell;
use std::collections::VecDeque;

use clap::Parser;

use super::*;
use crate::backend::{BackendError, RunEnd};
use crate::cli::{Cli, Command};
use crate::run::policy::tests::{counted_token, holder};

/// A backend that answers acquires from a script (`None`: never answers) and records
/// the tokens it was sent.
#[derive(Default)]
struct Scripted {
    replies: RefCell<VecDeque<Option<Result<Acquire, BackendError>>>>,
    acquired_with: RefCell<Vec<String>>,
    released: RefCell<Vec<String>>,
}

impl Scripted {
    fn new(replies: impl IntoIterator<Item = Option<Result<Acquire, BackendError>>>) -> Self {
        Scripted {
            replies: RefCell::new(replies.into_iter().collect()),
            ..Scripted::default()
        }
    }
}

impl Backend for Scripted {
    async fn acquire(&self, _: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        self.acquired_with.borrow_mut().push(req.token.clone());
        let reply = self.replies.borrow_mut().pop_front();
        match reply.expect("no more scripted replies") {
            Some(reply) => reply,
            None => std::future::pending().await,
        }
    }

    async fn renew(&self, _: &str, _: &str, _: Duration) -> Result<(), BackendError> {
        unreachable!("the acquire driver never renews")
    }

    async fn release(
        &self,
        _: &str,
        token: &str,
        _: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        assert_eq!(end, None, "an attempt given up leaves no run record");
        self.released.borrow_mut().push(token.to_owned());
        Ok(())
    }

    async fn inspect(&self, _: &str) -> Result<Vec<Holder>, BackendError> {
        unreachable!("the acquire driver never inspects")
    }

    async fn force_release(&self, _: &str) -> Result<Vec<Holder>, BackendError> {
        unreachable!("the acquire driver never breaks a lock")
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        unreachable!("the acquire driver never lists names")
    }

    async fn wait_for_release(&self, _: &str, _: &Holder, _: Duration) -> Result<(), BackendError> {
        Ok(())
    }

    async fn stop_waiting(&self, _: &str) -> Result<(), BackendError> {
        Ok(())
    }
}

/// A 300 ms lease (attempts time out after 100 ms), waiting `wait` for a busy lock.
fn config(wait: &str) -> RunConfig {
    let argv = [
        "lockrun", "run", "--ttl", "300ms", "--wait", wait, "job", "--", "true",
    ];
    let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else {
        unreachable!("a run command line")
    };
    RunConfig::from_args(&args, None).unwrap()
}

fn request() -> AcquireRequest {
    AcquireRequest {
        token: counted_token(),
        ttl: Duration::from_millis(300),
        host: "here".into(),
        pid: 1,
    }
}

/// Retries 100 ms after a failure.
const FIXED: Random = Random {
    token: counted_token,
    number: || 0,
};

async fn run_acquire(cfg: &RunConfig, backend: &Scripted) -> Result<Taken, Outcome> {
    let mut signals = Signals::install().unwrap();
    acquire_with(cfg, backend, request(), &mut signals, FIXED).await
}

/// Regression (found by the soak): after an error and after a timeout, the attempt's
/// token is released and the next attempt carries a new one.
#[tokio::test(flavor = "current_thread")]
async fn ambiguous_attempts_are_given_back_and_never_reused() {
    let backend = Scripted::new([
        Some(Err(BackendError::Unavailable("connection reset".into()))),
        None,
        Some(Ok(Acquire::Acquired {
            fencing_token: 7,
            slot: 0,
        })),
    ]);
    let taken = run_acquire(&config("60s"), &backend).await.unwrap();
    let sent = backend.acquired_with.borrow().clone();
    assert_eq!(sent.len(), 3);
    assert!(sent[0] != sent[1] && sent[1] != sent[2] && sent[0] != sent[2]);
    assert_eq!(*backend.released.borrow(), sent[..2]);
    assert_eq!(taken.token, sent[2]);
    assert_eq!(taken.fencing_token, 7);
}

#[tokio::test(flavor = "current_thread")]
async fn a_busy_lock_is_waited_for_with_the_same_token() {
    let backend = Scripted::new([
        Some(Ok(Acquire::Busy(holder()))),
        Some(Ok(Acquire::Acquired {
            fencing_token: 4,
            slot: 2,
        })),
    ]);
    let taken = run_acquire(&config("60s"), &backend).await.unwrap();
    let sent = backend.acquired_with.borrow().clone();
    assert_eq!(sent[0], sent[1]);
    assert_eq!(taken.token, sent[0]);
    assert_eq!((taken.fencing_token, taken.slot), (4, 2));
    assert!(backend.released.borrow().is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_busy_lock_without_wait_ends_busy_and_releases_nothing() {
    let backend = Scripted::new([Some(Ok(Acquire::Busy(holder())))]);
    let outcome = run_acquire(&config("0s"), &backend).await.unwrap_err();
    assert_eq!(outcome, Outcome::Busy(75));
    assert!(backend.released.borrow().is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_permanent_error_fails_after_one_attempt() {
    let backend = Scripted::new([Some(Err(BackendError::Refused("WRONGPASS".into())))]);
    let outcome = run_acquire(&config("60s"), &backend).await.unwrap_err();
    assert_eq!(outcome, Outcome::Failed);
    assert_eq!(backend.acquired_with.borrow().len(), 1);
    assert!(backend.released.borrow().is_empty());
}

/// A lock granted by the holder's release counts its lease from the waiter's busy
/// attempt the grant came after, not from the call that reported it (property 2).
#[tokio::test(flavor = "current_thread")]
async fn a_granted_lease_counts_from_the_busy_attempt_before_it() {
    let asked_at = BootInstant::now() - Duration::from_millis(20);
    let backend = Scripted::new([Some(Ok(Acquire::Granted {
        fencing_token: 9,
        slot: 1,
        asked_at,
    }))]);
    let taken = run_acquire(&config("60s"), &backend).await.unwrap();
    assert_eq!(taken.sent_at, asked_at);
    assert_eq!((taken.fencing_token, taken.slot), (9, 1));
}

/// A grant with none of its lease (300 ms) left, so counted, is not used: its token is
/// given back and the next attempt carries a new one.
#[tokio::test(flavor = "current_thread")]
async fn a_grant_with_its_lease_nearly_gone_is_given_back() {
    let backend = Scripted::new([
        Some(Ok(Acquire::Granted {
            fencing_token: 9,
            slot: 0,
            asked_at: BootInstant::now() - Duration::from_millis(300),
        })),
        Some(Ok(Acquire::Acquired {
            fencing_token: 10,
            slot: 0,
        })),
    ]);
    let taken = run_acquire(&config("60s"), &backend).await.unwrap();
    let sent = backend.acquired_with.borrow().clone();
    assert_eq!(sent.len(), 2);
    assert_eq!(*backend.released.borrow(), sent[..1]);
    assert_eq!(
        (taken.token.as_str(), taken.fencing_token),
        (sent[1].as_str(), 10)
    );
}
