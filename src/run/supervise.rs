//! Supervising the command under the lease: the select loop that feeds the pure
//! [`crate::lease`] machine with timer ticks, renewal answers and child exits, and
//! carries out its decisions. Part of [`crate::run`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;
use tokio::time::error::Elapsed;

use super::policy::Taken;
use super::{request_timeout, Ended, LeaseAtEnd};
use crate::backend::{Backend, BackendError};
use crate::clock::{BootInstant, Timer};
use crate::config::RunConfig;
use crate::lease::{Event, GroupSignal, Machine, Params, Stop, StopReason};
use crate::log::{emit, Event as LogEvent, Level};
use crate::outcome::Outcome;
use crate::supervisor::{reap, ChildExit, Group, Received, Signals};

type Renewal<'a> = Pin<Box<dyn Future<Output = Result<Result<(), BackendError>, Elapsed>> + 'a>>;

/// Runs the command to its end (and the end of its whole group) under the lease.
/// Returns how it ended and whether the lease is still ours to release.
pub(super) async fn supervise<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    signals: &mut Signals,
    group: &Group,
    taken: &Taken,
    mut timer: Timer,
) -> Ended {
    let params = Params::new(cfg.ttl, cfg.renew_every, cfg.kill_after);
    let mut machine = Machine::new(params, taken.sent_at, BootInstant::now(), cfg.max_runtime);
    let mut renewal: Option<Renewal<'_>> = None;
    // The SIGCHLD handler was installed before the spawn, so an early exit of the
    // command is not missed: the first `signals.recv()` reports it.
    let mut leader: Option<ChildExit> = None;
    let mut failures = 0u32;
    loop {
        if leader.is_some() && group.is_empty() {
            break;
        }
        let event = match arm(&mut timer, &machine) {
            Some(failed) => Some(failed),
            None => tokio::select! {
                biased;
                _ = timer.fired() => Some(Event::Tick),
                r = async { renewal.as_mut().expect("guarded").await }, if renewal.is_some() => {
                    renewal = None;
                    Some(renewal_event(r, &mut failures, &cfg.backend.display))
                }
                received = signals.recv() => on_signal(received, group, &mut leader),
                // While leftovers drain, look for an empty group now and then: the last
                // one may have been a grandchild reaped by its own parent.
                _ = tokio::time::sleep(Duration::from_millis(50)), if leader.is_some() => None,
            },
        };
        let now = BootInstant::now();
        let actions = machine.step(event.unwrap_or(Event::Tick), now);
        if let Some(signal) = actions.signal {
            carry_out(cfg, group, signal);
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
    let lease = if machine.holds_lease() {
        LeaseAtEnd::Ours
    } else {
        LeaseAtEnd::Lost
    };
    Ended {
        outcome: outcome(&machine, leader),
        lease,
    }
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

/// Handles a signal lockrun received: reaps on SIGCHLD (reporting the command's exit
/// while its group lives on), forwards the others to the group.
fn on_signal(received: Received, group: &Group, leader: &mut Option<ChildExit>) -> Option<Event> {
    match received {
        Received::Child => match (*leader, reap(group.leader())) {
            (None, Some(exit)) => {
                *leader = Some(exit);
                log_exit(exit);
                (!group.is_empty()).then_some(Event::CommandExited)
            }
            _ => None,
        },
        Received::Forward(sig) => {
            let msg = format!("forwarding {sig} to the command");
            emit(
                Level::Info,
                LogEvent::Forwarded,
                &msg,
                &[("signal", sig.as_str().into())],
            );
            group.signal(sig);
            None
        }
    }
}

/// How the run ended, once the whole group is gone.
fn outcome(machine: &Machine, leader: Option<ChildExit>) -> Outcome {
    // Every reason is named, so that a new one forces a decision here.
    let stopped = match machine.stop_reason() {
        Some(r @ (StopReason::LeaseLost | StopReason::LeaseExpiring | StopReason::TimerFailed)) => {
            Some((r, LogEvent::Lost, Outcome::LockLost))
        }
        Some(r @ StopReason::MaxRuntime) => Some((r, LogEvent::MaxRuntime, Outcome::MaxRuntime)),
        Some(StopReason::Leftovers) | None => None,
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
        LogEvent::Killing,
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
    emit(Level::Info, LogEvent::Exited, &msg, &[field]);
}
