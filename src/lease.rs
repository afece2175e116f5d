//! The lease and the stopping of the command, as a pure state machine.
//!
//! No tokio, no I/O, no clock reads: [`Machine::step`] takes an [`Event`] and the
//! current [`BootInstant`] and says what to do ([`Actions`]); [`Machine::next_wakeup`] says
//! when it next needs a [`Event::Tick`]. The driver in [`crate::run`] feeds it timer
//! ticks and backend replies and carries out the actions. Everything that decides when
//! the command is renewed, warned and killed lives here, so it can be tested
//! exhaustively with plain unit tests.
//!
//! The safety rules enforced here:
//! - The lease deadline is counted from the moment *before* the acquiring or renewing
//!   request was sent (the server's TTL started later than that), minus a drift margin
//!   for clock-rate differences between this host and the server.
//! - The command's group gets SIGKILL no later than that deadline, whatever the backend
//!   does: an unanswered renewal never delays it.
//! - Transient renewal errors are retried while the lease is valid; the kill signal
//!   goes out a grace period before the deadline so the command can stop cleanly.
//! - A definite loss (the key is gone or holds another token) stops the command at once.
//! - Without its timer (it could not be set) nothing is sure to wake lockrun at the
//!   deadline, so the group gets SIGKILL at once: fail closed.

mod params;

use std::time::Duration;

pub use params::Params;

use crate::clock::BootInstant;

/// Why lockrun is stopping the command's process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The backend said the lock is no longer ours (key gone or another token).
    LeaseLost,
    /// Renewals kept failing and the lease deadline came close (or passed).
    LeaseExpiring,
    /// `--max-runtime` was reached.
    MaxRuntime,
    /// The command exited but left processes running in its group.
    Leftovers,
    /// The lease timer could not be set: the kill before the deadline could no longer
    /// be guaranteed.
    TimerFailed,
    /// A signal lockrun forwarded did not end the job within `--kill-after`.
    Forwarded,
    /// The guard process died: nothing would stop the job if lockrun died too.
    GuardLost,
    /// The guard process was held stopped (a tracer, or stopped again at once after
    /// lockrun continued it): the same danger.
    GuardStopped,
}

impl StopReason {
    /// True when the lock was lost (exit status 124 with a "lost" log line).
    #[cfg(test)]
    pub fn is_loss(self) -> bool {
        match self {
            StopReason::LeaseLost
            | StopReason::LeaseExpiring
            | StopReason::TimerFailed
            | StopReason::GuardLost
            | StopReason::GuardStopped => true,
            StopReason::MaxRuntime | StopReason::Leftovers | StopReason::Forwarded => false,
        }
    }

    /// A stable snake_case name for JSON logs.
    pub fn code(self) -> &'static str {
        match self {
            StopReason::LeaseLost => "lease_lost",
            StopReason::LeaseExpiring => "lease_expiring",
            StopReason::MaxRuntime => "max_runtime",
            StopReason::Leftovers => "leftovers",
            StopReason::TimerFailed => "timer_failed",
            StopReason::Forwarded => "forwarded_signal",
            StopReason::GuardLost => "guard_lost",
            StopReason::GuardStopped => "guard_stopped",
        }
    }

    /// A short phrase for logs.
    pub fn describe(self) -> &'static str {
        match self {
            StopReason::LeaseLost => "the lock was lost (it is gone or held by someone else)",
            StopReason::LeaseExpiring => "the lease could not be renewed before it expired",
            StopReason::MaxRuntime => "--max-runtime was reached",
            StopReason::Leftovers => "the command exited and left processes running",
            StopReason::TimerFailed => {
                "the lease timer could not be set, so the kill before the lease expires could not be guaranteed"
            }
            StopReason::Forwarded => {
                "the job was still running --kill-after after a signal lockrun forwarded"
            }
            StopReason::GuardLost => {
                "lockrun's guard process died, so nothing would stop the job if lockrun died too"
            }
            StopReason::GuardStopped => {
                "lockrun's guard process was held stopped, so nothing would stop the job if lockrun died"
            }
        }
    }
}

/// What lockrun knows about its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lease {
    /// Ours until `deadline`; renew at `next_renew`; `renewing` holds the send time of
    /// the renewal in flight.
    Held {
        /// SIGKILL is due at this instant at the latest.
        deadline: BootInstant,
        /// When the next renewal goes out.
        next_renew: BootInstant,
        /// Send time of the renewal in flight, if any.
        renewing: Option<BootInstant>,
    },
    /// The backend said it is no longer ours; `deadline` is the last one known,
    /// which still bounds SIGKILL.
    Lost {
        /// The deadline the lease had when it was found lost.
        deadline: BootInstant,
    },
    /// The deadline passed without a successful renewal: it may be someone else's.
    Expired,
}

/// Where the command's process group stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Running, nothing sent.
    Running,
    /// The kill signal was sent; SIGKILL follows at `kill_at`.
    Terminating {
        /// Why the group is being stopped.
        reason: StopReason,
        /// When SIGKILL is due.
        kill_at: BootInstant,
    },
    /// SIGKILL was sent.
    Killed {
        /// Why the group was stopped.
        reason: StopReason,
    },
}

/// Something that happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Time passed (the timer fired, or the driver woke for another reason).
    Tick,
    /// The renewal in flight succeeded.
    RenewOk,
    /// The renewal in flight failed for a reason that may pass (timeout, connection).
    RenewFailed,
    /// The renewal found the key gone or holding another token.
    RenewLost,
    /// The command (the group leader) exited, and its group still has processes.
    CommandExited,
    /// The driver could not set its timer to [`Machine::next_wakeup`]: nothing is sure
    /// to deliver the next [`Event::Tick`] in time.
    TimerFailed,
    /// lockrun forwarded a signal to the job: SIGKILL follows `--kill-after` later
    /// if the job is still there (as `timeout -k` does).
    Forwarded,
    /// The guard process died.
    GuardLost,
    /// The guard process stays stopped whatever lockrun does.
    GuardStopped,
}

/// A signal for the whole process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupSignal {
    /// The configured `--kill-signal`.
    Stop(StopReason),
    /// SIGKILL.
    Kill(StopReason),
}

/// What the driver must do after a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Actions {
    /// Send a renewal now (the machine recorded `now` as its send time).
    pub renew: bool,
    /// Signal the process group.
    pub signal: Option<GroupSignal>,
}

/// The whole state of a supervised run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Machine {
    params: Params,
    lease: Lease,
    stop: Stop,
    max_runtime_at: Option<BootInstant>,
}

impl Machine {
    /// A machine for a lease whose acquiring request was sent at `acquire_sent_at`,
    /// with the command started at `started_at`.
    pub fn new(
        params: Params,
        acquire_sent_at: BootInstant,
        started_at: BootInstant,
        max_runtime: Option<Duration>,
    ) -> Machine {
        Machine {
            params,
            lease: Lease::Held {
                deadline: params.deadline_from(acquire_sent_at),
                next_renew: acquire_sent_at + params.renew_every,
                renewing: None,
            },
            stop: Stop::Running,
            max_runtime_at: max_runtime.map(|d| started_at + d),
        }
    }

    /// The lease as it stands.
    pub fn lease(&self) -> Lease {
        self.lease
    }

    /// The stop state as it stands.
    pub fn stop(&self) -> Stop {
        self.stop
    }

    /// Why the group was or is being stopped, if it was.
    pub fn stop_reason(&self) -> Option<StopReason> {
        match self.stop {
            Stop::Running => None,
            Stop::Terminating { reason, .. } | Stop::Killed { reason } => Some(reason),
        }
    }

    /// True while the lease is still ours and should be released at the end.
    pub fn holds_lease(&self) -> bool {
        match self.lease {
            Lease::Held { .. } => true,
            Lease::Lost { .. } | Lease::Expired => false,
        }
    }

    /// The latest time a renewal request sent at `now` may wait for its answer: past
    /// the deadline an answer is useless, so the request is abandoned there.
    pub fn renew_timeout(&self, now: BootInstant) -> Duration {
        match self.lease {
            Lease::Held { deadline, .. } => deadline.saturating_since(now),
            Lease::Lost { .. } | Lease::Expired => Duration::ZERO,
        }
    }

    /// When the driver must next deliver a [`Event::Tick`], if ever.
    pub fn next_wakeup(&self) -> Option<BootInstant> {
        let mut at: Option<BootInstant> = None;
        let mut consider = |t: BootInstant| at = Some(at.map_or(t, |a| a.min(t)));
        if let Lease::Held {
            deadline,
            next_renew,
            renewing,
        } = self.lease
        {
            consider(deadline);
            if renewing.is_none() {
                consider(next_renew);
            }
            if self.stop == Stop::Running {
                consider(deadline - self.params.grace());
            }
        }
        match self.stop {
            Stop::Running => {
                if let Some(t) = self.max_runtime_at {
                    consider(t);
                }
            }
            Stop::Terminating { kill_at, .. } => consider(kill_at),
            Stop::Killed { .. } => {}
        }
        at
    }

    /// Applies `event` at time `now`, returning what to do.
    pub fn step(&mut self, event: Event, now: BootInstant) -> Actions {
        self.lease = self.next_lease(event, now);
        let mut actions = Actions {
            signal: self.next_stop(event, now),
            renew: false,
        };
        if let Lease::Held {
            deadline,
            next_renew,
            renewing: None,
        } = self.lease
        {
            if now >= next_renew {
                actions.renew = true;
                self.lease = Lease::Held {
                    deadline,
                    next_renew,
                    renewing: Some(now),
                };
            }
        }
        actions
    }

    /// The lease after `event`: renewal replies move the deadline, and a deadline
    /// reached turns it to [`Lease::Expired`].
    fn next_lease(&self, event: Event, now: BootInstant) -> Lease {
        let p = &self.params;
        let lease = match (self.lease, event) {
            (
                Lease::Held {
                    deadline,
                    renewing: Some(sent),
                    ..
                },
                Event::RenewOk,
            ) => Lease::Held {
                // The server applied the renewal after `sent`: the key lives at least
                // until sent + TTL. Never shorten a deadline already known.
                deadline: deadline.max(p.deadline_from(sent)),
                next_renew: sent + p.renew_every,
                renewing: None,
            },
            (
                Lease::Held {
                    deadline,
                    renewing: Some(_),
                    ..
                },
                Event::RenewFailed,
            ) => Lease::Held {
                deadline,
                next_renew: now + p.retry_every,
                renewing: None,
            },
            (
                Lease::Held {
                    deadline,
                    renewing: Some(_),
                    ..
                },
                Event::RenewLost,
            ) => Lease::Lost { deadline },
            // A reply with no renewal in flight is a driver bug; it changes nothing.
            (
                held @ Lease::Held { renewing: None, .. },
                Event::RenewOk | Event::RenewFailed | Event::RenewLost,
            ) => held,
            (
                held @ Lease::Held { .. },
                Event::Tick
                | Event::CommandExited
                | Event::TimerFailed
                | Event::Forwarded
                | Event::GuardLost
                | Event::GuardStopped,
            ) => held,
            (lost @ Lease::Lost { .. }, _) => lost,
            (Lease::Expired, _) => Lease::Expired,
        };
        expire(lease, now)
    }

    /// The stop state after `event`, and the signal to send, if any.
    fn next_stop(&mut self, event: Event, now: BootInstant) -> Option<GroupSignal> {
        match event {
            Event::TimerFailed => return self.kill_now(),
            Event::GuardLost => return self.kill_for_guard(StopReason::GuardLost),
            Event::GuardStopped => return self.kill_for_guard(StopReason::GuardStopped),
            Event::Tick
            | Event::RenewOk
            | Event::RenewFailed
            | Event::RenewLost
            | Event::CommandExited
            | Event::Forwarded => {}
        }
        let (stop, signal) = match self.stop {
            Stop::Running => self.stop_running(event, now),
            Stop::Terminating { reason, kill_at } => {
                // Whatever the first reason was, the lease deadline as it stands now
                // still bounds SIGKILL.
                let due = match self.lease {
                    Lease::Held { deadline, .. } | Lease::Lost { deadline } => {
                        kill_at.min(deadline)
                    }
                    Lease::Expired => now,
                };
                if now >= due {
                    (Stop::Killed { reason }, Some(GroupSignal::Kill(reason)))
                } else {
                    (Stop::Terminating { reason, kill_at }, None)
                }
            }
            Stop::Killed { reason } => (Stop::Killed { reason }, None),
        };
        self.stop = stop;
        signal
    }

    /// The stop state after `event` while the command runs untouched: why to stop it,
    /// if there is a reason now, and with which signal.
    fn stop_running(&self, event: Event, now: BootInstant) -> (Stop, Option<GroupSignal>) {
        let p = self.params;
        let max_runtime = self.max_runtime_at.is_some_and(|t| now >= t);
        let reason = match self.lease {
            Lease::Expired => Some(StopReason::LeaseExpiring),
            Lease::Lost { .. } => Some(StopReason::LeaseLost),
            Lease::Held { deadline, .. } if now >= deadline - p.grace() => {
                Some(StopReason::LeaseExpiring)
            }
            Lease::Held { .. } if max_runtime => Some(StopReason::MaxRuntime),
            Lease::Held { .. } if event == Event::CommandExited => Some(StopReason::Leftovers),
            Lease::Held { .. } if event == Event::Forwarded => Some(StopReason::Forwarded),
            Lease::Held { .. } => None,
        };
        match (reason, self.lease) {
            (None, _) => (Stop::Running, None),
            // The forwarded signal is the stop signal: only SIGKILL is left to schedule,
            // `--kill-after` from now (as `timeout -k`). The lease is still renewed
            // meanwhile; its deadline at each step still bounds SIGKILL (the
            // `Terminating` arm of `next_stop`).
            (Some(StopReason::Forwarded), Lease::Held { .. }) => (
                Stop::Terminating {
                    reason: StopReason::Forwarded,
                    kill_at: now + p.kill_after,
                },
                None,
            ),
            // Paused past the deadline (or never renewed in time): SIGKILL now.
            (Some(reason), Lease::Expired) => {
                (Stop::Killed { reason }, Some(GroupSignal::Kill(reason)))
            }
            (Some(reason), Lease::Held { deadline, .. } | Lease::Lost { deadline }) => (
                Stop::Terminating {
                    reason,
                    kill_at: (now + p.kill_after).min(deadline),
                },
                Some(GroupSignal::Stop(reason)),
            ),
        }
    }

    /// Fails closed when the timer is gone: SIGKILL now, whatever the stop state
    /// (unless it was sent already). The lease itself is not touched: while it is
    /// held it is renewed on the driver's other wake-ups and released at the end.
    fn kill_now(&mut self) -> Option<GroupSignal> {
        let reason = match (self.stop, self.lease) {
            (Stop::Killed { .. }, _) => return None,
            (Stop::Terminating { reason, .. }, _) => reason,
            (Stop::Running, Lease::Held { .. }) => StopReason::TimerFailed,
            (Stop::Running, Lease::Lost { .. }) => StopReason::LeaseLost,
            (Stop::Running, Lease::Expired) => StopReason::LeaseExpiring,
        };
        self.stop = Stop::Killed { reason };
        Some(GroupSignal::Kill(reason))
    }

    /// The guard died or is held stopped (`reason`): SIGKILL now, unless it was sent
    /// already.
    fn kill_for_guard(&mut self, reason: StopReason) -> Option<GroupSignal> {
        match self.stop {
            Stop::Killed { .. } => None,
            Stop::Running | Stop::Terminating { .. } => {
                self.stop = Stop::Killed { reason };
                Some(GroupSignal::Kill(reason))
            }
        }
    }
}

/// Past the deadline nothing is known any more, whatever the last answer was (a reply
/// read late after a pause included): the lease is expired and SIGKILL is due.
fn expire(lease: Lease, now: BootInstant) -> Lease {
    match lease {
        Lease::Held { deadline, .. } | Lease::Lost { deadline } if now >= deadline => {
            Lease::Expired
        }
        other => other,
    }
}

#[cfg(test)]
mod tests;
