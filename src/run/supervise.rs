//! Supervising the command under the lease: the select loop that feeds the pure
//! [`crate::lease`] machine with timer ticks, renewal answers and child exits, and
//! carries out its decisions. Part of [`crate::run`].

use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::error::Elapsed;

use super::policy::Taken;
use super::{request_timeout, Ended, LeaseAtEnd};
use crate::backend::{Backend, BackendError};
use crate::clock::{BootInstant, ContinueAt, Timer};
use crate::config::RunConfig;
use crate::lease::{Event, GroupSignal, Lease, Machine, Params, Stop, StopReason};
use crate::log::{emit, Event as LogEvent, Level};
use crate::outcome::Outcome;
use crate::supervisor::{reap, ChildExit, FromGuard, GuardStop, Job, Received, Signals};

type Renewal<'a> = Pin<Box<dyn Future<Output = Result<Result<(), BackendError>, Elapsed>> + 'a>>;

/// How often lockrun looks at the job itself while it waits for the job's end (the
/// guard reports it, but a stopped guard would not).
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// What lockrun knows of the job's end.
#[derive(Debug, Default)]
struct JobEnd {
    /// How the command (the leader) ended.
    leader: Option<ChildExit>,
    /// No process of the job is left.
    empty: bool,
    /// The guard's socket reached its end (the guard is gone or going).
    guard_eof: bool,
}

/// Runs the command to its end (and the end of its whole job) under the lease.
/// Returns how it ended and whether the lease is still ours to release.
pub(super) async fn supervise<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    signals: &mut Signals,
    job: &mut Job,
    taken: &Taken,
    (mut timer, mut alarm): (Timer, Option<ContinueAt>),
) -> Ended {
    let params = Params::new(cfg.ttl, cfg.renew_every, cfg.kill_after);
    let mut machine = Machine::new(params, taken.sent_at, BootInstant::now(), cfg.max_runtime);
    let mut renewal: Option<Renewal<'_>> = None;
    let reports = watch_guard(job);
    let mut end = JobEnd::default();
    let mut failures = 0u32;
    let mut told = None;
    tell_deadline(job, &mut alarm, &machine, &mut told);
    while !((end.leader.is_some() || job.is_guard_lost()) && end.empty) {
        let event = match arm(&mut timer, &machine) {
            Some(failed) => Some(failed),
            None => {
                let mut wake = Wake {
                    timer: &mut timer,
                    renewal: &mut renewal,
                    signals: &mut *signals,
                    reports: reports.as_ref(),
                    failures: &mut failures,
                };
                next_event(&mut wake, cfg, job, &mut end, &machine).await
            }
        };
        if job.is_guard_lost() && !end.empty {
            end.empty = job.is_empty();
        }
        let now = BootInstant::now();
        let event = event.unwrap_or(Event::Tick);
        let actions = machine.step(event, now);
        tell_deadline(job, &mut alarm, &machine, &mut told);
        signal_job(cfg, job, actions.signal, event);
        // After any kill: a read of /proc is no reason to wait. Nor is it once the job
        // is over: the release is next.
        if event == Event::Tick && !(end.leader.is_some() && end.empty) {
            warn_if_traced(job);
        }
        if !machine.holds_lease() {
            renewal = None;
        }
        if actions.renew {
            // Past the deadline an answer is useless: the request is abandoned there.
            let timeout = request_timeout(cfg.ttl).min(machine.renew_timeout(now));
            let renew = backend.renew(cfg.name.as_str(), &taken.token, cfg.ttl);
            renewal = Some(Box::pin(tokio::time::timeout(timeout, renew)));
        }
    }
    drop(renewal);
    drop(reports);
    ended(&machine, end.leader)
}

/// How the run ended, and whether the lease is still ours to release.
fn ended(machine: &Machine, leader: Option<ChildExit>) -> Ended {
    let lease = if machine.holds_lease() {
        LeaseAtEnd::Ours
    } else {
        LeaseAtEnd::Lost
    };
    Ended {
        outcome: outcome(machine, leader),
        lease,
    }
}

/// What can wake the driver.
struct Wake<'w, 'r> {
    timer: &'w mut Timer,
    renewal: &'w mut Option<Renewal<'r>>,
    signals: &'w mut Signals,
    reports: Option<&'w AsyncFd<RawFd>>,
    failures: &'w mut u32,
}

/// Waits for the next thing that happens and turns it into an event for the machine
/// (`None`: nothing for it, look again).
async fn next_event(
    w: &mut Wake<'_, '_>,
    cfg: &RunConfig,
    job: &mut Job,
    end: &mut JobEnd,
    machine: &Machine,
) -> Option<Event> {
    let killed = matches!(machine.stop(), Stop::Killed { .. });
    let draining = end.leader.is_some() || job.is_guard_lost() || w.reports.is_none() || killed;
    let reports = w.reports;
    tokio::select! {
        biased;
        _ = w.timer.fired() => Some(Event::Tick),
        r = async { w.renewal.as_mut().expect("guarded").await }, if w.renewal.is_some() => {
            *w.renewal = None;
            Some(renewal_event(r, w.failures, &cfg.backend.display))
        }
        received = w.signals.recv() => on_signal(received, job, end),
        ready = async { reports.expect("guarded").readable().await },
            if reports.is_some() && !end.guard_eof => {
            match ready {
                Ok(mut guard) => {
                    guard.clear_ready();
                    on_reports(job, end)
                }
                Err(_) => None,
            }
        }
        // While the job drains, look at it now and then: the guard reports its end,
        // but lockrun checks for itself too, and SIGKILL is sent again to whatever a
        // fork slipped past the last one.
        _ = tokio::time::sleep(DRAIN_POLL), if draining => {
            if killed {
                job.signal(nix::sys::signal::Signal::SIGKILL);
            }
            let event = if reports.is_none() { on_reports(job, end) } else { None };
            if end.leader.is_some() && !end.empty {
                end.empty = job.is_empty();
            }
            event
        }
    }
}

/// Gives the guard the lease's deadline when it moved (the guard's own kill, should
/// lockrun be stopped then), and sets lockrun's own alarm to it: stopped at the
/// deadline, lockrun is continued by the kernel and kills the job itself, even if its
/// guard was killed meanwhile (the job then is lockrun's alone).
fn tell_deadline(
    job: &Job,
    alarm: &mut Option<ContinueAt>,
    machine: &Machine,
    told: &mut Option<BootInstant>,
) {
    let deadline = lease_deadline(machine);
    if deadline != *told {
        if let Some(d) = deadline {
            job.set_deadline(d.since_boot());
            if let Some(a) = alarm.as_mut() {
                let _ = a.set(d.since_boot());
            }
        }
        *told = deadline;
    }
}

/// The lease's deadline as the machine knows it: SIGKILL is due by then.
fn lease_deadline(machine: &Machine) -> Option<BootInstant> {
    match machine.lease() {
        Lease::Held { deadline, .. } | Lease::Lost { deadline } => Some(deadline),
        Lease::Expired => None,
    }
}

/// The guard's socket, registered with the runtime; `None` if it cannot be (then the
/// drain poll reads it).
#[allow(unsafe_code)]
fn watch_guard(job: &Job) -> Option<AsyncFd<RawFd>> {
    let fd = job.guard_socket().as_raw_fd();
    // SAFETY: the descriptor belongs to `job`, which outlives the registration (it is
    // dropped before `supervise` returns) and never closes or replaces it meanwhile.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()
}

/// Reads what the guard reported: the command's exit, the job's end, or (end of file)
/// the guard's death.
fn on_reports(job: &mut Job, end: &mut JobEnd) -> Option<Event> {
    let mut event = None;
    loop {
        match job.report() {
            Ok(Some(FromGuard::Exited { exit, empty })) => {
                crate::clock::marks::mark("command_exited");
                if end.leader.is_none() {
                    end.leader = Some(exit);
                    log_exit(exit);
                }
                end.empty |= empty;
                if !empty {
                    event = Some(Event::CommandExited);
                }
            }
            Ok(Some(FromGuard::Empty)) => end.empty = true,
            // Nothing more for now; anything else is out of turn and changes nothing.
            Ok(None) => return event,
            Ok(Some(_)) => {}
            Err(_) => {
                end.guard_eof = true;
                return guard_gone(job, end).or(event);
            }
        }
    }
}

/// The guard is gone (its socket ended, or lockrun reaped it). Unless the job was
/// over already, that is a reason to stop it at once: nothing would stop the job if
/// lockrun died now.
fn guard_gone(job: &mut Job, end: &mut JobEnd) -> Option<Event> {
    if job.is_guard_lost() {
        return None;
    }
    job.guard_lost();
    if end.leader.is_some() && end.empty {
        return None;
    }
    Some(Event::GuardLost)
}

/// Sets the lease timer to the machine's next wake-up. If it cannot be set, nothing
/// is sure to wake lockrun at the lease deadline, so the kill before expiry can no
/// longer be guaranteed: fail closed, with [`Event::TimerFailed`], which the machine
/// answers with SIGKILL at once (a lost lease: exit status 124, "lost" in the log). A
/// clean stop with the kill signal would need the very timer that failed to bound
/// it. The lease itself is left alone: while still ours it is released once the
/// group is gone. Once the group has had SIGKILL nothing is left to guard, and the
/// driver waits for its end as usual.
fn arm(timer: &mut Timer, machine: &Machine) -> Option<Event> {
    let e = timer.set(machine.next_wakeup()).err()?;
    if matches!(machine.stop(), Stop::Killed { .. }) {
        return None;
    }
    let msg = format!("cannot set the lease timer: {e}; stopping the command now");
    emit(Level::Error, LogEvent::Error, &msg, &[]);
    Some(Event::TimerFailed)
}

/// Turns a renewal's answer into an event for the machine.
fn renewal_event(
    answer: Result<Result<(), BackendError>, Elapsed>,
    failures: &mut u32,
    display: &str,
) -> Event {
    match answer {
        Ok(Ok(())) => {
            *failures = 0;
            emit(Level::Debug, LogEvent::Renewed, "lease renewed", &[]);
            Event::RenewOk
        }
        Ok(Err(BackendError::NotOwner)) => Event::RenewLost,
        Ok(Err(e)) => renew_failed(failures, &e.to_string()),
        Err(_) => renew_failed(
            failures,
            &format!("the backend at {display} did not answer in time"),
        ),
    }
}

/// Handles a signal lockrun received: reaps on SIGCHLD (the guard's death, and once
/// it is gone the command's exit, are seen there), forwards the others to the job.
fn on_signal(received: Received, job: &mut Job, end: &mut JobEnd) -> Option<Event> {
    match received {
        Received::Child => {
            let reaped = reap(job.guard_pid(), job.leader());
            if let Some(exit) = reaped.leader.filter(|_| end.leader.is_none()) {
                end.leader = Some(exit);
                log_exit(exit);
            }
            if reaped.guard {
                return guard_gone(job, end);
            }
            if reaped.guard_stopped && !job.is_guard_lost() {
                return guard_stopped(job);
            }
            None
        }
        Received::Forward(sig) => {
            let msg = format!("forwarding {sig} to the command's job");
            emit(
                Level::Info,
                LogEvent::Forwarded,
                &msg,
                &[("signal", sig.as_str().into())],
            );
            job.signal(sig);
            Some(Event::Forwarded)
        }
    }
}

/// The guard was found stopped: lockrun continued it. If it stays stopped (a tracer)
/// or was stopped again at once, that is a reason to stop the job (should lockrun die
/// meanwhile, nothing would), and the guard is given up as lost: lockrun's SIGKILL
/// takes it too (a held guard would neither report the job's end nor let go of a
/// `file://` lock), and the job's end is lockrun's own to see.
fn guard_stopped(job: &mut Job) -> Option<Event> {
    let pid = job.guard_pid().as_raw();
    match job.guard_stopped() {
        GuardStop::Continued => {
            let msg = format!(
                "lockrun's guard process (pid {pid}) was stopped; continued it (stopped, \
                 it could not stop the job if lockrun died)"
            );
            emit(
                Level::Warn,
                LogEvent::GuardStopped,
                &msg,
                &[("pid", pid.into())],
            );
            None
        }
        GuardStop::Held => {
            job.guard_lost();
            Some(Event::GuardStopped)
        }
    }
}

/// Warns once per tracer when the guard is traced: a tracer may hold it where lockrun
/// sees no stop (docs/guarantees.md, "Property 10 in detail").
fn warn_if_traced(job: &mut Job) {
    if let Some(tracer) = job.new_guard_tracer() {
        let pid = job.guard_pid().as_raw();
        let msg = format!(
            "lockrun's guard process (pid {pid}) is traced by pid {tracer}: should lockrun \
             die while the tracer holds it stopped, the job would run on until the tracer \
             lets it go"
        );
        let fields = [("pid", pid.into()), ("tracer", tracer.into())];
        emit(Level::Warn, LogEvent::GuardTraced, &msg, &fields);
    }
}

/// How the run ended, once the whole job is gone.
fn outcome(machine: &Machine, leader: Option<ChildExit>) -> Outcome {
    // Every reason is named, so that a new one forces a decision here.
    let stopped = match machine.stop_reason() {
        Some(r @ (StopReason::LeaseLost | StopReason::LeaseExpiring | StopReason::TimerFailed)) => {
            Some((r, LogEvent::Lost, Outcome::LockLost))
        }
        Some(r @ StopReason::MaxRuntime) => Some((r, LogEvent::MaxRuntime, Outcome::MaxRuntime)),
        Some(r @ StopReason::GuardLost) => Some((r, LogEvent::GuardLost, Outcome::LockLost)),
        Some(r @ StopReason::GuardStopped) => Some((r, LogEvent::GuardStopped, Outcome::LockLost)),
        Some(StopReason::Leftovers | StopReason::Forwarded) | None => None,
    };
    if let Some((r, event, outcome)) = stopped {
        let msg = format!("stopped the command: {}", r.describe());
        emit(Level::Error, event, &msg, &[("reason", r.code().into())]);
        return outcome;
    }
    match leader {
        Some(ChildExit::Code(c)) => Outcome::Exited(c),
        Some(ChildExit::Signal(s)) => Outcome::Signaled(s),
        // The loop only ends once the leader was reaped.
        None => Outcome::LockLost,
    }
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
        LogEvent::RenewFailed,
        &format!("could not renew the lease: {why}; retrying"),
        &[("failures", (*failures).into())],
    );
    Event::RenewFailed
}

/// Sends the job what the machine decided after `event`.
fn signal_job(cfg: &RunConfig, job: &Job, signal: Option<GroupSignal>, event: Event) {
    match signal {
        Some(signal) => carry_out(cfg, job, signal),
        // Killed already, with the guard as the job's root: what it left is now below
        // lockrun, and must not wait for the next drain poll.
        None if event == Event::GuardLost => job.signal(nix::sys::signal::Signal::SIGKILL),
        None => {}
    }
}

fn carry_out(cfg: &RunConfig, job: &Job, signal: GroupSignal) {
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
        LogEvent::Killing,
        &format!("sending {sig} to the command's job: {}", reason.describe()),
        &[
            ("signal", sig.as_str().into()),
            ("reason", reason.code().into()),
        ],
    );
    job.signal(sig);
    if sig != nix::sys::signal::Signal::SIGKILL {
        // A stopped process would not act on the kill signal until continued (as
        // timeout(1) and systemd do, wake it so it can exit cleanly).
        job.signal(nix::sys::signal::Signal::SIGCONT);
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
    emit(Level::Info, LogEvent::Exited, &msg, &[field]);
}
