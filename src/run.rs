//! `lockrun run`: acquire, spawn, supervise, release. The thin async driver around
//! two pure machines: the acquire policy (`run/policy.rs`), fed the answers to acquire
//! attempts, and the lease machine [`crate::lease`], fed timer ticks, renewal replies
//! and the command's exit; the driver carries out what they decide. The command gets
//! lockrun's environment less the credentials (`run/child_env.rs`). Every backend call is bounded by a timeout shorter than the lease left, so a hung server
//! can never hold back a kill.

mod acquire;
mod child_env;
mod once_per;
mod ping;
mod policy;
mod supervise;

use std::time::Duration;

use serde_json::Value;

use crate::backend::{AcquireRequest, Backend, BackendError, EndedBy, Release, RunEnd};
use crate::clock::{marks, BootInstant, ContinueAt, Timer};
use crate::config::RunConfig;
use crate::lease::Params;
use crate::log::{emit, Event, Level};
use crate::metrics::RunReport;
use crate::outcome::Outcome;
use crate::supervisor::{self, Boundary, Guard, Job, Signals, SpawnError};
use crate::units::ms;
use acquire::{abandon, acquire, splay};
use ping::Pinger;
use policy::{Random, Taken};
use supervise::supervise;

/// The longest any single backend request may take, whatever the TTL.
const MAX_REQUEST_TIME: Duration = Duration::from_secs(5);

/// The timeout of one acquire or release request: a third of the TTL (so an answer
/// still leaves most of the lease), at most [`MAX_REQUEST_TIME`].
fn request_timeout(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(20), MAX_REQUEST_TIME)
}

/// How the command's run ended.
struct Ended {
    /// The exit status to report.
    outcome: Outcome,
    /// Whether the lease is still ours, to release.
    lease: LeaseAtEnd,
}

/// The lease when the command's whole group is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseAtEnd {
    /// Still ours: release it (or keep it for `--hold-at-least`).
    Ours,
    /// Lost or expired: it may be someone else's now, so it is left alone.
    Lost,
}

/// Runs `cfg` against `backend`, the command started by `guard` (forked at start, see
/// [`crate::supervisor`]), and reports how it ended. Every outcome other than the
/// command's own exit has been logged when this returns.
pub async fn run<B: Backend>(cfg: &RunConfig, backend: &B, guard: Guard) -> RunReport {
    let mut signals = match prepare(cfg).await {
        Ok(s) => s,
        Err(outcome) => {
            return RunReport {
                outcome,
                waited: Duration::ZERO,
                held: Duration::ZERO,
            }
        }
    };
    marks::mark("prepared");
    // The time waited for the lock starts after `--splay`'s pause.
    let started = BootInstant::now();
    let report = |outcome: Outcome| RunReport {
        outcome,
        waited: BootInstant::now().saturating_since(started),
        held: Duration::ZERO,
    };
    let taken = match take(cfg, backend, &mut signals).await {
        Ok(t) => t,
        Err(outcome) => return report(outcome),
    };
    marks::mark("acquired");
    let env = command_env(cfg, &taken);
    // The lease timer exists before the command does: without it the lease could
    // not be enforced, so a failure here means not starting at all.
    let timer = match Timer::new() {
        Ok(t) => t,
        Err(e) => {
            abandon(cfg, backend, &taken.token).await;
            let msg = format!("cannot create the lease timer: {e}; the command was not started");
            return report(fail(&msg));
        }
    };
    let (ended, pinger, job) = job(cfg, backend, guard, &env, &mut signals, &taken, timer).await;
    let hold = BootInstant::now().saturating_since(taken.sent_at);
    if ended.lease == LeaseAtEnd::Ours {
        release(cfg, backend, &taken.token, hold, run_end(ended.outcome)).await;
    }
    marks::mark("released");
    // The guard let go meanwhile (a `file://` lock is free only once it has).
    if let Some(job) = job {
        job.finish();
    }
    marks::mark("guard_gone");
    // After the release: a slow ping server never holds the lock.
    if let Some(pinger) = pinger {
        pinger.end(ended.outcome.exit_code(), &mut signals).await;
    }
    log_finished(ended.outcome.exit_code(), hold);
    RunReport {
        outcome: ended.outcome,
        waited: taken.waited,
        held: hold,
    }
}

/// Gives the guard the lease's deadline before the command exists (the supervise loop
/// sends each later one), and sets lockrun's own alarm to it: stopped from now on,
/// lockrun is continued at the deadline.
fn first_deadline(cfg: &RunConfig, taken: &Taken, guard: &Guard) -> Option<ContinueAt> {
    let params = Params::new(cfg.ttl, cfg.renew_every, cfg.kill_after);
    let first = params.deadline_from(taken.sent_at).since_boot();
    guard.deadline(first);
    continue_alarm(first)
}

/// lockrun's alarm for its lease deadlines ([`ContinueAt`]), set to `first` (time since
/// boot). Without one (the kernel refused a timer), a stopped lockrun is left to its
/// guard, and lockrun says so.
fn continue_alarm(first: Duration) -> Option<ContinueAt> {
    match ContinueAt::new().and_then(|mut a| a.set(first).map(|()| a)) {
        Ok(a) => Some(a),
        Err(e) => {
            let msg = format!(
                "cannot set an alarm to continue lockrun at the lease deadline ({e}): if \
                 lockrun is stopped and its guard killed, the job runs until lockrun is \
                 continued"
            );
            emit(Level::Warn, Event::GuardStopped, &msg, &[]);
            None
        }
    }
}

/// Starts the command (and `--ping`'s start ping) and supervises it until its whole
/// group is gone; the guard has been told so (returned for [`Job::finish`] after the
/// release).
async fn job<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    guard: Guard,
    env: &[crate::supervisor::EnvChange],
    signals: &mut Signals,
    taken: &Taken,
    timer: Timer,
) -> (Ended, Option<Pinger>, Option<Job>) {
    let hold = backend.lock_fds(cfg.name.as_str());
    let alarm = first_deadline(cfg, taken, &guard);
    // The run's duration for `--ping`: from before the command's start.
    let starting = tokio::time::Instant::now();
    marks::mark("spawning");
    match Job::start(guard, env, &hold, request_timeout(cfg.ttl)) {
        Ok(mut job) => {
            marks::mark("spawned");
            log_contained(&job);
            let pinger = Pinger::start(cfg, taken, starting);
            let timers = (timer, alarm);
            // Off the run's way: a task of its own, dropped with the run if it is short.
            let trim = tokio::spawn(async {
                tokio::time::sleep(supervisor::TRIM_AFTER).await;
                supervisor::give_back_program_pages();
            });
            let ended = supervise(cfg, backend, signals, &mut job, taken, timers).await;
            trim.abort();
            marks::mark("job_gone");
            // The whole job is gone: the guard may let go of the lock's files, beside
            // the release.
            job.done();
            (ended, pinger, Some(job))
        }
        Err(e) => (spawn_failed(cfg, e), None, None),
    }
}

/// Takes the lock and, with `--once-per`, judges whether the command may start
/// (`run/once_per.rs`); a run that may not gives the lock back, with no record.
async fn take<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    signals: &mut Signals,
) -> Result<Taken, Outcome> {
    let taken = acquire(cfg, backend, request(cfg), signals).await?;
    log_acquired(cfg, &taken);
    if let Err(outcome) = once_per::check(cfg, backend, &taken).await {
        abandon(cfg, backend, &taken.token).await;
        return Err(outcome);
    }
    Ok(taken)
}

/// What the command's environment gets on top of lockrun's, less the credentials.
fn command_env(cfg: &RunConfig, taken: &Taken) -> Vec<crate::supervisor::EnvChange> {
    child_env::changes(vec![
        ("LOCKRUN_FENCING_TOKEN", taken.fencing_token.to_string()),
        ("LOCKRUN_LOCK_NAME", cfg.name.as_str().to_owned()),
        ("LOCKRUN_SLOT", taken.slot.to_string()),
    ])
}

/// The run's last line: its exit status, and how long the lock was held.
fn log_finished(code: u8, hold: Duration) {
    let fields = [("hold_ms", millis(hold)), ("exit_code", code.into())];
    let msg = format!("finished with exit status {code}");
    emit(Level::Info, Event::Finished, &msg, &fields);
}

/// Installs lockrun's signal handlers (saying which signals stay ignored) and makes it
/// a child subreaper, before anything is taken; then pauses for `--splay`.
async fn prepare(cfg: &RunConfig) -> Result<Signals, Outcome> {
    let mut signals =
        Signals::install().map_err(|e| fail(&format!("cannot install signal handlers: {e}")))?;
    for sig in signals.ignored() {
        let msg =
            format!("{sig} was ignored when lockrun started: it stays ignored, not forwarded");
        let fields = [("signal", sig.as_str().into())];
        emit(Level::Info, Event::SignalIgnored, &msg, &fields);
    }
    if let Err(e) = crate::supervisor::become_subreaper() {
        let msg =
            format!("cannot become a child subreaper ({e}): orphans of the command may escape");
        emit(Level::Warn, Event::Subreaper, &msg, &[]);
    }
    splay(cfg, &mut signals, Random::OS).await?;
    Ok(signals)
}

/// The first acquire request: a fresh token, and who this is for `status`.
fn request(cfg: &RunConfig) -> AcquireRequest {
    AcquireRequest {
        token: crate::token::lock_token(),
        ttl: cfg.ttl,
        host: nix::unistd::gethostname()
            .map_or_else(|_| "unknown".into(), |h| h.to_string_lossy().into_owned()),
        pid: std::process::id(),
    }
}

/// Says (at `-v`) what holds the job: its own cgroup, or the process tree below the
/// guard.
fn log_contained(job: &Job) {
    let guard = job.guard_pid().as_raw();
    let (msg, boundary) = match job.boundary() {
        Boundary::Cgroup(c) => (
            format!(
                "the job is held in cgroup {} (cgroup.kill) below the guard process {guard}",
                c.dir().display()
            ),
            "cgroup",
        ),
        Boundary::Tree => (
            format!(
                "the job is held by the process tree below the guard process {guard} (a child subreaper); no cgroup of its own"
            ),
            "process_tree",
        ),
    };
    let fields = [
        ("boundary", boundary.into()),
        ("guard_pid", guard.into()),
        ("pid", job.leader().as_raw().into()),
    ];
    emit(Level::Info, Event::Contained, &msg, &fields);
}

fn log_acquired(cfg: &RunConfig, taken: &Taken) {
    let slots = cfg.backend.slots;
    let slot = match slots {
        1 => String::new(),
        n => format!(" slot {} of {n}", taken.slot),
    };
    let msg = format!(
        "acquired lock {:?}{slot} (fencing token {}) after {}",
        cfg.name.as_str(),
        taken.fencing_token,
        ms(taken.waited)
    );
    let fields = [
        ("fencing_token", taken.fencing_token.into()),
        ("slot", taken.slot.into()),
        ("slots", slots.into()),
        ("wait_ms", millis(taken.waited)),
    ];
    emit(Level::Info, Event::Acquired, &msg, &fields);
}

/// Logs a failure before the command started and returns [`Outcome::Failed`].
pub fn fail(msg: &str) -> Outcome {
    emit(Level::Error, Event::Error, msg, &[]);
    Outcome::Failed
}

/// The command could not be started: log why; the lease is still ours to release.
fn spawn_failed(cfg: &RunConfig, e: SpawnError) -> Ended {
    let program = cfg
        .command
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (outcome, what) = match e {
        SpawnError::GuardLost { why, job_gone } => {
            let msg = format!("stopped the command: lockrun's guard process {why}; everything it started was killed");
            let fields = [("reason", "guard_lost".into())];
            emit(Level::Error, Event::GuardLost, &msg, &fields);
            let lease = if job_gone {
                LeaseAtEnd::Ours
            } else {
                // Something of the job may still run: the lock is left to expire.
                LeaseAtEnd::Lost
            };
            return Ended {
                outcome: Outcome::LockLost,
                lease,
            };
        }
        SpawnError::NotFound(e) => (
            Outcome::NotFound,
            format!("command not found: {program:?} ({e})"),
        ),
        SpawnError::CannotExecute(e) => (
            Outcome::CannotExecute,
            format!("cannot execute {program:?}: {e}"),
        ),
        SpawnError::Guard(e) => (
            Outcome::Failed,
            format!("cannot start the command: {e}; nothing of it runs"),
        ),
    };
    emit(Level::Error, Event::Error, &what, &[]);
    Ended {
        outcome,
        lease: LeaseAtEnd::Ours,
    }
}

/// How the run ended, for its record in the backend.
fn run_end(outcome: Outcome) -> RunEnd {
    let ended_by = match outcome {
        Outcome::Exited(_) => EndedBy::Exited,
        Outcome::Signaled(_) | Outcome::Interrupted(_) => EndedBy::Signal,
        Outcome::LockLost => EndedBy::Lost,
        Outcome::MaxRuntime => EndedBy::MaxRuntime,
        Outcome::Failed
        | Outcome::CannotExecute
        | Outcome::NotFound
        | Outcome::Busy(_)
        | Outcome::Held
        | Outcome::Free
        | Outcome::ForceReleased
        | Outcome::Listed => EndedBy::NotStarted,
    };
    RunEnd {
        exit_status: outcome.exit_code(),
        ended_by,
    }
}

/// Gives the lock back (or shortens it to `--hold-at-least`), after the whole group
/// is gone, leaving the run's record (`end`) where the backend keeps one. A failure
/// here only delays the next holder by at most the TTL.
async fn release<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    token: &str,
    held: Duration,
    end: RunEnd,
) {
    let how = match cfg.hold_at_least.checked_sub(held) {
        Some(left) if !left.is_zero() => Release::KeepFor(left),
        _ => Release::Now,
    };
    let reply = tokio::time::timeout(
        request_timeout(cfg.ttl),
        backend.release(cfg.name.as_str(), token, how, Some(end)),
    )
    .await;
    let fields = [("hold_ms", millis(held))];
    match (reply, how) {
        (Ok(Ok(())), Release::Now) => emit(
            Level::Info,
            Event::Released,
            &format!("released lock {:?} after {}", cfg.name.as_str(), ms(held)),
            &fields,
        ),
        (Ok(Ok(())), Release::KeepFor(left)) => emit(
            Level::Info,
            Event::Released,
            &format!(
                "lock {:?} kept for {} more (--hold-at-least)",
                cfg.name.as_str(),
                ms(left)
            ),
            &fields,
        ),
        (Ok(Err(BackendError::NotOwner)), _) => emit(
            Level::Warn,
            Event::ReleaseFailed,
            "the lock was no longer ours at release",
            &fields,
        ),
        (Ok(Err(e)), _) => emit(
            Level::Warn,
            Event::ReleaseFailed,
            &format!(
                "could not release the lock: {e}; it expires within {}",
                ms(cfg.ttl)
            ),
            &fields,
        ),
        (Err(_), _) => emit(
            Level::Warn,
            Event::ReleaseFailed,
            &format!(
                "the release timed out; the lock expires within {}",
                ms(cfg.ttl)
            ),
            &fields,
        ),
    }
}

fn millis(d: Duration) -> Value {
    Value::from(d.as_millis() as u64)
}
