//! Taking the lock: the thin async driver of the pure acquire [`policy`](super::policy).
//! It sends the attempts the policy describes, waits for a release, sleeps before a
//! retry, gives back the tokens the policy abandons, and gives up when a signal
//! arrives; every decision is the policy's. Part of [`crate::run`].

use std::future::Future;
use std::time::Duration;

use super::policy::{splay_pause, Next, Policy, Random, Reply, Taken, Terms, Warn};
use super::{fail, millis, request_timeout};
use crate::backend::{Acquire, AcquireRequest, Backend, BackendError, Holder, Release};
use crate::clock::BootInstant;
use crate::config::RunConfig;
use crate::holder::Known;
use crate::lease::Params;
use crate::log::{emit, Event, Level};
use crate::outcome::Outcome;
use crate::supervisor::Signals;
use crate::units::ms;

/// `--splay`: pauses a random time up to the configured one before the first attempt,
/// holding nothing (nothing is asked of the backend yet). A signal to forward ends the
/// pause and the run: [`Outcome::Interrupted`], the command not started.
pub(super) async fn splay(
    cfg: &RunConfig,
    signals: &mut Signals,
    random: Random,
) -> Result<(), Outcome> {
    if cfg.splay.is_zero() {
        return Ok(());
    }
    let pause = splay_pause(cfg.splay, (random.number)());
    let msg = format!(
        "pausing {} before the first attempt (--splay {})",
        ms(pause),
        humantime::format_duration(cfg.splay)
    );
    emit(
        Level::Info,
        Event::Splay,
        &msg,
        &[("splay_ms", millis(pause))],
    );
    tokio::select! {
        () = tokio::time::sleep(pause) => Ok(()),
        sig = signals.recv_forwardable() => {
            let msg = format!(
                "interrupted by {sig} while pausing before the first attempt (--splay); \
                 the command was not started"
            );
            emit(Level::Error, Event::Interrupted, &msg, &[]);
            Err(Outcome::Interrupted(sig as i32))
        }
    }
}

/// Tries to take the lock until it is ours, `--wait` runs out, or the backend fails
/// for good. A signal meanwhile gives up (releasing whatever may have been taken).
/// The first attempt uses `request`'s token; an attempt that may have been applied
/// unseen is given back and its token never used again, so the [`Taken`] lease may
/// carry a later one.
pub(super) async fn acquire<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    request: AcquireRequest,
    signals: &mut Signals,
) -> Result<Taken, Outcome> {
    acquire_with(cfg, backend, request, signals, Random::OS).await
}

/// [`acquire`] with the policy's randomness given (fixed in tests).
async fn acquire_with<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    request: AcquireRequest,
    signals: &mut Signals,
    random: Random,
) -> Result<Taken, Outcome> {
    let terms = Terms {
        lease: Params::new(cfg.ttl, cfg.renew_every, cfg.kill_after),
        wait: cfg.wait,
        request_timeout: request_timeout(cfg.ttl),
        backend: cfg.backend.display.clone(),
    };
    let mut policy = Policy::new(terms, request, random, BootInstant::now());
    let mut said_waiting = false;
    loop {
        let reply = send(cfg, backend, &policy, signals).await?;
        match policy.on_reply(reply, BootInstant::now()) {
            Next::Take(taken) => return Ok(taken),
            Next::Wait {
                holder,
                for_at_most,
            } => {
                if !std::mem::replace(&mut said_waiting, true) {
                    log_waiting(cfg, &holder, for_at_most);
                }
                wait(cfg, backend, &policy, signals, &holder, for_at_most).await?
            }
            Next::GiveUpBusy { holder, waited } => {
                let stop = backend.stop_waiting(cfg.name.as_str());
                let _ = tokio::time::timeout(request_timeout(cfg.ttl), stop).await;
                return Err(busy(cfg, &holder, waited));
            }
            Next::Retry {
                after,
                abandon: old,
                error,
                warn,
                attempts,
            } => retry(cfg, backend, &policy, &old, (&error, warn, attempts, after)).await,
            Next::Fail {
                error,
                abandon: old,
                attempts,
                tried_for,
            } => {
                if let Some(old) = old {
                    let bound = policy.give_back_timeout(BootInstant::now(), true);
                    give_back(cfg, backend, &old, bound).await;
                }
                return Err(gave_up(&error, attempts, tried_for));
            }
        }
    }
}

/// After a transient failure (`error`, warned about as `warn`, after `attempts`): gives
/// back the token `old`, within the `--wait` left, then pauses `after` from the failure
/// (the give-back's time included).
async fn retry<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    policy: &Policy,
    old: &str,
    (error, warn, attempts, after): (&BackendError, Warn, u32, Duration),
) {
    let resume = tokio::time::Instant::now() + after;
    let bound = policy.give_back_timeout(BootInstant::now(), false);
    give_back(cfg, backend, old, bound).await;
    log_retry(error, warn, attempts, after);
    tokio::time::sleep_until(resume).await;
}

/// Sends one attempt, the policy's current request, within the policy's attempt
/// timeout. A signal meanwhile gives up.
async fn send<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    policy: &Policy,
    signals: &mut Signals,
) -> Result<Reply, Outcome> {
    let sent_at = BootInstant::now();
    let timeout = policy.attempt_timeout(sent_at);
    let attempt = tokio::time::timeout(
        timeout,
        backend.acquire(cfg.name.as_str(), policy.request()),
    );
    let answer = unless_signalled(cfg, backend, policy, signals, "acquiring", attempt).await?;
    Ok(match answer {
        Ok(Ok(Acquire::Acquired {
            fencing_token,
            slot,
        })) => Reply::Acquired {
            fencing_token,
            slot,
            sent_at,
        },
        Ok(Ok(Acquire::Granted {
            fencing_token,
            slot,
            asked_at,
        })) => Reply::Acquired {
            fencing_token,
            slot,
            sent_at: asked_at.min(sent_at),
        },
        Ok(Ok(Acquire::Busy(holder))) => Reply::Busy(holder),
        Ok(Err(e)) => Reply::Failed(e),
        Err(_elapsed) => Reply::TimedOut(timeout),
    })
}

/// Waits for a busy lock's release (or expiry), at most `for_at_most`. A signal
/// meanwhile gives up.
async fn wait<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    policy: &Policy,
    signals: &mut Signals,
    holder: &Holder,
    for_at_most: Duration,
) -> Result<(), Outcome> {
    let waiting = backend.wait_for_release(cfg.name.as_str(), holder, for_at_most);
    if let Err(e) = unless_signalled(cfg, backend, policy, signals, "waiting", waiting).await? {
        emit(Level::Debug, Event::WaitError, &e.to_string(), &[]);
    }
    Ok(())
}

/// Runs `step` (`doing` something) unless a signal to forward comes first: then gives
/// up with [`Outcome::Interrupted`], after giving back whatever the current attempt
/// may have taken.
async fn unless_signalled<B: Backend, T>(
    cfg: &RunConfig,
    backend: &B,
    policy: &Policy,
    signals: &mut Signals,
    doing: &str,
    step: impl Future<Output = T>,
) -> Result<T, Outcome> {
    tokio::select! {
        r = step => Ok(r),
        sig = signals.recv_forwardable() => {
            abandon(cfg, backend, &policy.request().token).await;
            let msg = format!("interrupted by {sig} while {doing}; the command was not started");
            emit(Level::Error, Event::Interrupted, &msg, &[]);
            Err(Outcome::Interrupted(sig as i32))
        }
    }
}

/// Best-effort cleanup when giving up: leave the queue and delete the lock if (and
/// only if) it holds our token. Bounded by one request timeout in all: if it fails,
/// the lease expires within the TTL anyway.
pub(super) async fn abandon<B: Backend>(cfg: &RunConfig, backend: &B, token: &str) {
    give_back(cfg, backend, token, request_timeout(cfg.ttl)).await;
}

/// [`abandon`], bounded by `bound` in all.
async fn give_back<B: Backend>(cfg: &RunConfig, backend: &B, token: &str, bound: Duration) {
    let name = cfg.name.as_str();
    let cleanup = async {
        let _ = backend.stop_waiting(name).await;
        let _ = backend.release(name, token, Release::Now, None).await;
    };
    let _ = tokio::time::timeout(bound, cleanup).await;
}

/// A failed attempt that is retried: a warning if the policy says so, else a debug line.
fn log_retry(error: &BackendError, warn: Warn, attempts: u32, after: Duration) {
    let fields = [("attempts", attempts.into()), ("retry_ms", millis(after))];
    let (level, msg) = match warn {
        Warn::Quietly => (Level::Debug, format!("{error}; retrying in {}", ms(after))),
        Warn::First => (
            Level::Warn,
            format!(
                "{error}; retrying with backoff until --wait runs out (this warning comes \
                 at most once a minute)"
            ),
        ),
        Warn::Again => (
            Level::Warn,
            format!("{error}; still retrying ({attempts} attempts so far)"),
        ),
    };
    emit(level, Event::AcquireFailed, &msg, &fields);
}

/// Gives up before the command started, with how many attempts were made over how long
/// when there were several.
fn gave_up(error: &BackendError, attempts: u32, tried_for: Duration) -> Outcome {
    if attempts <= 1 {
        return fail(&format!("{error}; the command was not started"));
    }
    let msg = format!(
        "{error}; gave up after {attempts} attempts over {}; the command was not started",
        ms(tried_for)
    );
    let fields = [
        ("attempts", attempts.into()),
        ("wait_ms", millis(tried_for)),
    ];
    emit(Level::Error, Event::Error, &msg, &fields);
    Outcome::Failed
}

/// The line said once, when a run first finds the lock busy and starts waiting.
fn log_waiting(cfg: &RunConfig, holder: &Holder, wait_left: Duration) {
    let known = Known::of(holder);
    let what = match cfg.backend.slots {
        1 => format!("is {}", known.held()),
        n => format!("has all {n} slots held"),
    };
    let msg = format!(
        "lock {:?} {what}; waiting up to {} for it",
        cfg.name.as_str(),
        ms(wait_left)
    );
    let fields = [("wait_left_ms", millis(wait_left))];
    emit(Level::Info, Event::Waiting, &msg, &fields);
}

fn busy(cfg: &RunConfig, holder: &Holder, waited: Duration) -> Outcome {
    let known = Known::of(holder);
    let name = cfg.name.as_str();
    let msg = match cfg.backend.slots {
        1 => format!(
            "lock {name:?} is {} ({} left); the command was not started",
            known.held(),
            ms(known.ttl_left)
        ),
        n => format!(
            "all {n} slots of lock {name:?} are held; the first to end is slot {}, {} ({} \
             left); the command was not started",
            holder.slot,
            known.held(),
            ms(known.ttl_left)
        ),
    };
    emit(
        Level::Warn,
        Event::Busy,
        &msg,
        &[
            ("holder_host", known.host.into()),
            ("holder_pid", known.pid.into()),
            ("fencing_token", known.fencing_token.into()),
            ("holder_slot", holder.slot.into()),
            ("wait_ms", millis(waited)),
        ],
    );
    Outcome::Busy(cfg.conflict_exit_code)
}

#[cfg(test)]
mod tests;
