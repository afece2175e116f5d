//! `lockrun run`: acquire, spawn, supervise, release. The thin async driver around
//! the pure [`crate::lease`] machine: it feeds the machine timer ticks, renewal
//! replies and the command's exit, and carries out what the machine decides. Every
//! backend call is bounded by a timeout shorter than the lease left, so a hung server
//! can never hold back a kill.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;
use tokio::time::error::Elapsed;

use crate::backend::{Acquire, AcquireRequest, Backend, BackendError, Holder, Release};
use crate::clock::{Instant, Timer};
use crate::config::RunConfig;
use crate::lease::{Event, GroupSignal, Machine, Params, StopReason};
use crate::log::{emit, Level};
use crate::metrics::RunReport;
use crate::outcome::Outcome;
use crate::supervisor::{reap, ChildExit, Group, Received, Signals, SpawnError};

/// The longest any single backend request may take, whatever the TTL.
const MAX_REQUEST_TIME: Duration = Duration::from_secs(5);

/// The timeout of one acquire or release request: a third of the TTL (so an answer
/// still leaves most of the lease), at most [`MAX_REQUEST_TIME`].
fn request_timeout(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(20), MAX_REQUEST_TIME)
}

/// A lease just taken.
struct Taken {
    /// When the acquiring request was sent (the lease counts from here).
    sent_at: Instant,
    fencing_token: u64,
    waited: Duration,
}

/// Runs `cfg` against `backend` and reports how it ended. Every outcome other than
/// the command's own exit has been logged when this returns.
pub async fn run<B: Backend>(cfg: &RunConfig, backend: &B) -> RunReport {
    let started = tokio::time::Instant::now();
    let report = |outcome: Outcome| RunReport {
        outcome,
        waited: started.elapsed(),
        held: Duration::ZERO,
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return report(fail(&format!("cannot install signal handlers: {e}"))),
    };
    if let Err(e) = crate::supervisor::become_subreaper() {
        emit(
            Level::Warn,
            "subreaper",
            &format!("cannot become a child subreaper ({e}): orphans of the command may escape"),
            &[],
        );
    }
    let mut req = AcquireRequest {
        token: crate::token::lock_token(),
        ttl: cfg.ttl,
        host: nix::unistd::gethostname()
            .map_or_else(|_| "unknown".into(), |h| h.to_string_lossy().into_owned()),
        pid: std::process::id(),
    };
    let taken = match acquire(cfg, backend, &mut req, &mut signals).await {
        Ok(t) => t,
        Err(outcome) => return report(outcome),
    };
    emit(
        Level::Info,
        "acquired",
        &format!(
            "acquired lock {:?} (fencing token {}) after {}",
            cfg.name.as_str(),
            taken.fencing_token,
            ms(taken.waited)
        ),
        &[
            ("fencing_token", taken.fencing_token.into()),
            ("wait_ms", millis(taken.waited)),
        ],
    );
    let env = [
        ("LOCKRUN_FENCING_TOKEN", taken.fencing_token.to_string()),
        ("LOCKRUN_LOCK_NAME", cfg.name.as_str().to_owned()),
    ];
    // The lease timer exists before the command does: without it the lease could
    // not be enforced, so a failure here means not starting at all.
    let timer = match Timer::new() {
        Ok(t) => t,
        Err(e) => {
            abandon(cfg, backend, &req.token).await;
            let msg = format!("cannot create the lease timer: {e}; the command was not started");
            return report(fail(&msg));
        }
    };
    let outcome = match Group::spawn(&cfg.command, &env) {
        Ok(group) => supervise(cfg, backend, &req, &mut signals, &group, &taken, timer).await,
        Err(e) => spawn_failed(cfg, e),
    };
    let hold = Instant::now().saturating_since(taken.sent_at);
    if outcome.1 {
        release(cfg, backend, &req.token, hold).await;
    }
    let fields = [
        ("hold_ms", millis(hold)),
        ("exit_code", outcome.0.exit_code().into()),
    ];
    emit(
        Level::Info,
        "finished",
        &format!("finished with exit status {}", outcome.0.exit_code()),
        &fields,
    );
    RunReport {
        outcome: outcome.0,
        waited: taken.waited,
        held: hold,
    }
}

/// Logs a failure before the command started and returns [`Outcome::Failed`].
pub fn fail(msg: &str) -> Outcome {
    emit(Level::Error, "error", msg, &[]);
    Outcome::Failed
}

fn spawn_failed(cfg: &RunConfig, e: SpawnError) -> (Outcome, bool) {
    let program = cfg
        .command
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (outcome, what) = match e {
        SpawnError::NotFound(e) => (
            Outcome::NotFound,
            format!("command not found: {program:?} ({e})"),
        ),
        SpawnError::CannotExecute(e) => (
            Outcome::CannotExecute,
            format!("cannot execute {program:?}: {e}"),
        ),
    };
    emit(Level::Error, "error", &what, &[]);
    (outcome, true)
}

/// Tries to take the lock until it is ours, `--wait` runs out, or the backend fails
/// for good. A signal meanwhile gives up (releasing whatever may have been taken).
/// On success `req.token` is the token the lock is held with: an attempt that may have
/// been applied unseen is given back and its token never used again.
async fn acquire<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    req: &mut AcquireRequest,
    signals: &mut Signals,
) -> Result<Taken, Outcome> {
    let name = cfg.name.as_str();
    let started = tokio::time::Instant::now();
    let give_up_at = started + cfg.wait;
    let params = Params::new(cfg.ttl, cfg.renew_every, cfg.kill_after);
    loop {
        let sent_at = Instant::now();
        let reply = tokio::select! {
            r = tokio::time::timeout(request_timeout(cfg.ttl), backend.acquire(name, &*req)) => r,
            sig = signals.recv_forwardable() => {
                abandon(cfg, backend, &req.token).await;
                emit(Level::Error, "interrupted", &format!("interrupted by {sig} while acquiring; the command was not started"), &[]);
                return Err(Outcome::Interrupted(sig as i32));
            }
        };
        let error = match reply {
            Ok(Ok(Acquire::Acquired { fencing_token })) => {
                if Instant::now() < params.deadline_from(sent_at) - params.grace() {
                    return Ok(Taken {
                        sent_at,
                        fencing_token,
                        waited: started.elapsed(),
                    });
                }
                // The answer came so late that most of the lease is gone.
                BackendError::Unavailable(format!(
                    "{} answered too slowly to use the lease",
                    cfg.backend.display
                ))
            }
            Ok(Ok(Acquire::Busy(holder))) => {
                let now = tokio::time::Instant::now();
                if now >= give_up_at {
                    let _ =
                        tokio::time::timeout(request_timeout(cfg.ttl), backend.stop_waiting(name))
                            .await;
                    return Err(busy(cfg, &holder, started.elapsed()));
                }
                tokio::select! {
                    r = backend.wait_for_release(name, &holder, give_up_at - now) => {
                        if let Err(e) = r {
                            emit(Level::Debug, "wait_error", &e.to_string(), &[]);
                        }
                    }
                    sig = signals.recv_forwardable() => {
                        abandon(cfg, backend, &req.token).await;
                        emit(Level::Error, "interrupted", &format!("interrupted by {sig} while waiting; the command was not started"), &[]);
                        return Err(Outcome::Interrupted(sig as i32));
                    }
                }
                continue;
            }
            Ok(Err(e)) => e,
            Err(_elapsed) => BackendError::Unavailable(format!(
                "the backend at {} did not answer within {}",
                cfg.backend.display,
                ms(request_timeout(cfg.ttl))
            )),
        };
        if error.is_transient() {
            // The attempt may have been applied on the server with its answer lost or
            // late: give back whatever it may have taken, and never use its token
            // again. A release of the old token that arrives late (it may be stuck in
            // the network too) then cannot remove a lock a later attempt takes.
            abandon(cfg, backend, &req.token).await;
            req.token = crate::token::lock_token();
        }
        let retry_in = Duration::from_millis(100 + crate::token::random_u64() % 400);
        if !error.is_transient() || tokio::time::Instant::now() + retry_in >= give_up_at {
            return Err(fail(&format!("{error}; the command was not started")));
        }
        emit(
            Level::Warn,
            "acquire_failed",
            &format!("{error}; retrying"),
            &[],
        );
        tokio::time::sleep(retry_in).await;
    }
}

/// Best-effort cleanup when giving up: leave the queue and delete the lock if (and
/// only if) it holds our token. Bounded by one request timeout in all: if it fails,
/// the lease expires within the TTL anyway.
async fn abandon<B: Backend>(cfg: &RunConfig, backend: &B, token: &str) {
    let name = cfg.name.as_str();
    let cleanup = async {
        let _ = backend.stop_waiting(name).await;
        let _ = backend.release(name, token, Release::Now).await;
    };
    let _ = tokio::time::timeout(request_timeout(cfg.ttl), cleanup).await;
}

fn busy(cfg: &RunConfig, holder: &Holder, waited: Duration) -> Outcome {
    let since = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_millis(holder.since_ms),
    );
    emit(
        Level::Warn,
        "busy",
        &format!(
            "lock {:?} is held by {} pid {} since {since} ({} left); the command was not started",
            cfg.name.as_str(),
            holder.host,
            holder.pid,
            ms(holder.ttl_left)
        ),
        &[
            ("holder_host", holder.host.clone().into()),
            ("holder_pid", holder.pid.into()),
            ("fencing_token", holder.fencing_token.into()),
            ("wait_ms", millis(waited)),
        ],
    );
    Outcome::Busy(cfg.conflict_exit_code)
}

type Renewal<'a> = Pin<Box<dyn Future<Output = Result<Result<(), BackendError>, Elapsed>> + 'a>>;

/// Runs the command to its end (and the end of its whole group) under the lease.
/// Returns the outcome and whether the lease is still ours to release.
async fn supervise<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    req: &AcquireRequest,
    signals: &mut Signals,
    group: &Group,
    taken: &Taken,
    mut timer: Timer,
) -> (Outcome, bool) {
    let name = cfg.name.as_str();
    let params = Params::new(cfg.ttl, cfg.renew_every, cfg.kill_after);
    let mut machine = Machine::new(params, taken.sent_at, Instant::now(), cfg.max_runtime);
    let mut renewal: Option<Renewal<'_>> = None;
    // The SIGCHLD handler was installed before the spawn, so an early exit of the
    // command is not missed: the first `signals.recv()` reports it.
    let mut leader: Option<ChildExit> = None;
    let mut failures = 0u32;
    loop {
        if leader.is_some() && group.is_empty() {
            break;
        }
        let _ = timer.set(machine.next_wakeup());
        let event = tokio::select! {
            biased;
            _ = timer.fired() => Some(Event::Tick),
            r = async { renewal.as_mut().expect("guarded").await }, if renewal.is_some() => {
                renewal = None;
                Some(match r {
                    Ok(Ok(())) => {
                        failures = 0;
                        emit(Level::Debug, "renewed", "lease renewed", &[]);
                        Event::RenewOk
                    }
                    Ok(Err(BackendError::NotOwner)) => Event::RenewLost,
                    Ok(Err(e)) => renew_failed(&mut failures, &e.to_string()),
                    Err(_) => renew_failed(&mut failures, &format!("the backend at {} did not answer in time", cfg.backend.display)),
                })
            }
            received = signals.recv() => match received {
                Received::Child => match (leader, reap(group.leader())) {
                    (None, Some(exit)) => {
                        leader = Some(exit);
                        log_exit(exit);
                        (!group.is_empty()).then_some(Event::CommandExited)
                    }
                    _ => None,
                },
                Received::Forward(sig) => {
                    emit(Level::Info, "forwarded", &format!("forwarding {sig} to the command"), &[("signal", sig.as_str().into())]);
                    group.signal(sig);
                    None
                }
            },
            // While leftovers drain, look for an empty group now and then: the last
            // one may have been a grandchild reaped by its own parent.
            _ = tokio::time::sleep(Duration::from_millis(50)), if leader.is_some() => None,
        };
        let now = Instant::now();
        let actions = machine.step(event.unwrap_or(Event::Tick), now);
        if let Some(signal) = actions.signal {
            carry_out(cfg, group, signal);
        }
        if !machine.holds_lease() {
            renewal = None;
        }
        if actions.renew {
            let timeout = request_timeout(cfg.ttl).min(machine.renew_timeout(now));
            renewal = Some(Box::pin(tokio::time::timeout(
                timeout,
                backend.renew(name, &req.token, cfg.ttl),
            )));
        }
    }
    drop(renewal);
    let outcome = match (machine.stop_reason(), leader) {
        (
            Some(r @ (StopReason::LeaseLost | StopReason::LeaseExpiring | StopReason::MaxRuntime)),
            _,
        ) => {
            let (event, outcome) = if r.is_loss() {
                ("lost", Outcome::LockLost)
            } else {
                ("max_runtime", Outcome::MaxRuntime)
            };
            let msg = format!("stopped the command: {}", r.describe());
            emit(Level::Error, event, &msg, &[("reason", r.code().into())]);
            outcome
        }
        (_, Some(ChildExit::Code(c))) => Outcome::Exited(c),
        (_, Some(ChildExit::Signal(s))) => Outcome::Signaled(s),
        // The loop only ends once the leader was reaped.
        (_, None) => Outcome::LockLost,
    };
    (outcome, machine.holds_lease())
}

fn renew_failed(failures: &mut u32, why: &str) -> Event {
    *failures += 1;
    let level = if *failures == 1 {
        Level::Warn
    } else {
        Level::Debug
    };
    emit(
        level,
        "renew_failed",
        &format!("could not renew the lease: {why}; retrying"),
        &[("failures", (*failures).into())],
    );
    Event::RenewFailed
}

fn carry_out(cfg: &RunConfig, group: &Group, signal: GroupSignal) {
    let (sig, reason) = match signal {
        GroupSignal::Stop(r) => (cfg.kill_signal, r),
        GroupSignal::Kill(r) => (nix::sys::signal::Signal::SIGKILL, r),
    };
    let level = if reason == StopReason::Leftovers {
        Level::Info
    } else {
        Level::Warn
    };
    emit(
        level,
        "killing",
        &format!(
            "sending {sig} to the command's process group: {}",
            reason.describe()
        ),
        &[
            ("signal", sig.as_str().into()),
            ("reason", reason.code().into()),
        ],
    );
    group.signal(sig);
    if sig != nix::sys::signal::Signal::SIGKILL {
        // A stopped process would not act on the kill signal until continued (as
        // timeout(1) and systemd do, wake it so it can exit cleanly).
        group.signal(nix::sys::signal::Signal::SIGCONT);
    }
}

fn log_exit(exit: ChildExit) {
    let (msg, field) = match exit {
        ChildExit::Code(c) => (
            format!("the command exited with status {c}"),
            ("exit_code", Value::from(c)),
        ),
        ChildExit::Signal(s) => (
            format!("the command was killed by signal {s}"),
            ("signal", Value::from(s)),
        ),
    };
    emit(Level::Info, "exited", &msg, &[field]);
}

/// Gives the lock back (or shortens it to `--hold-at-least`), after the whole group
/// is gone. A failure here only delays the next holder by at most the TTL.
async fn release<B: Backend>(cfg: &RunConfig, backend: &B, token: &str, held: Duration) {
    let how = match cfg.hold_at_least.checked_sub(held) {
        Some(left) if !left.is_zero() => Release::KeepFor(left),
        _ => Release::Now,
    };
    let reply = tokio::time::timeout(
        request_timeout(cfg.ttl),
        backend.release(cfg.name.as_str(), token, how),
    )
    .await;
    let fields = [("hold_ms", millis(held))];
    match (reply, how) {
        (Ok(Ok(())), Release::Now) => emit(
            Level::Info,
            "released",
            &format!("released lock {:?} after {}", cfg.name.as_str(), ms(held)),
            &fields,
        ),
        (Ok(Ok(())), Release::KeepFor(left)) => emit(
            Level::Info,
            "released",
            &format!(
                "lock {:?} kept for {} more (--hold-at-least)",
                cfg.name.as_str(),
                ms(left)
            ),
            &fields,
        ),
        (Ok(Err(BackendError::NotOwner)), _) => emit(
            Level::Warn,
            "release_failed",
            "the lock was no longer ours at release",
            &fields,
        ),
        (Ok(Err(e)), _) => emit(
            Level::Warn,
            "release_failed",
            &format!(
                "could not release the lock: {e}; it expires within {}",
                ms(cfg.ttl)
            ),
            &fields,
        ),
        (Err(_), _) => emit(
            Level::Warn,
            "release_failed",
            &format!(
                "the release timed out; the lock expires within {}",
                ms(cfg.ttl)
            ),
            &fields,
        ),
    }
}

fn ms(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

fn millis(d: Duration) -> Value {
    Value::from(d.as_millis() as u64)
}
