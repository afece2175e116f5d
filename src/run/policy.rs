//! The acquire policy: every decision about taking the lock, as a pure state machine.
//!
//! No tokio, no I/O, no clock reads and no randomness of its own: [`Policy::on_reply`]
//! takes the answer to one attempt and the current time and says what to do next
//! ([`Next`]). The driver (`run/acquire.rs`) only sends the attempts the policy's
//! [`Policy::request`] describes, waits, sleeps, gives tokens back and watches for
//! signals. Depends on [`crate::backend`]'s types, [`crate::clock`] and
//! [`crate::lease::Params`] only.
//!
//! The rules enforced here:
//! - An `Acquired` answer read after the lease deadline minus the kill grace (both
//!   counted from the moment *before* the request was sent) is not taken: so little of
//!   the lease is left that the command would be stopped as it starts. It counts as a
//!   transient failure, and is retried like one.
//! - An attempt whose outcome is ambiguous (a transient error, a timeout, an answer too
//!   late to use) may have been applied on the server unseen. Its token is given back
//!   and never used again: the next attempt carries a fresh one. A release of the old
//!   token that arrives late (it may be stuck in the network too) then cannot remove the
//!   lock a later attempt takes. The soak test found the bug this rule closes.
//! - A busy lock is waited for until `--wait` runs out, then given up with its holder.
//! - A permanent error fails at once. A transient one is retried with capped exponential
//!   backoff and full jitter (the n-th failure in a row waits a random time from 0 to
//!   min(5 s, 100 ms × 2ⁿ⁻¹)), so that a backend that is down is not hammered and the
//!   hosts waiting for it do not all come back at once; the last retry comes when
//!   `--wait` runs out, and a failure then gives up. Only the first failure and then at
//!   most one a minute are warned about (a cron mail is not a log of every attempt);
//!   giving up says how many attempts were made over how long.

use std::time::Duration;

use crate::backend::{AcquireRequest, BackendError, Holder};
use crate::clock::BootInstant;
use crate::lease::Params;
use crate::units::ms;

/// The longest pause before the first retry after a transient error; each further
/// failure in a row doubles it, up to [`RETRY_CAP`].
const RETRY_BASE: Duration = Duration::from_millis(100);

/// The longest pause between two attempts, however many failed.
const RETRY_CAP: Duration = Duration::from_secs(5);

/// After the first warning about failed attempts, at most one this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The shortest timeout an attempt gets under `--wait`, however little of it is left
/// (the last retry comes when it runs out): a healthy backend answers in milliseconds,
/// so this only bounds how far a silent one can take the run past `--wait`.
const MIN_ATTEMPT: Duration = Duration::from_millis(500);

/// The longest the give-back after giving up may take. The attempt given back may have
/// been applied unseen, and the give-back frees the lock before its TTL; but a backend
/// that did not answer the attempt is unlikely to answer it, and the run must end close
/// to the time its last line states.
const GIVE_BACK_AT_END: Duration = Duration::from_secs(1);

/// Where the policy's randomness comes from: the OS in a run, fixed values in tests.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Random {
    /// A fresh lock token, never handed out before.
    pub token: fn() -> String,
    /// A random number, for retry jitter.
    pub number: fn() -> u64,
}

impl Random {
    /// The operating system's CSPRNG ([`crate::token`]).
    pub const OS: Random = Random {
        token: crate::token::lock_token,
        number: crate::token::random_u64,
    };
}

/// The pause before the first attempt for `--splay max`, from the random number `r`:
/// uniform over [0, max] (`r`'s share of 2^64, to the nanosecond; no modulo bias).
pub(crate) fn splay_pause(max: Duration, r: u64) -> Duration {
    let nanos = max.as_nanos().min(u128::from(u64::MAX) - 1) + 1;
    let pause = (nanos * u128::from(r)) >> 64;
    Duration::from_nanos(u64::try_from(pause).unwrap_or(u64::MAX))
}

/// The fixed terms of one acquisition, from the configuration.
#[derive(Clone, Debug)]
pub(crate) struct Terms {
    /// The lease's timings (deadline and kill grace of an answer).
    pub lease: Params,
    /// `--wait`: how long a busy lock is waited for.
    pub wait: Duration,
    /// The longest timeout of one attempt; [`Policy::attempt_timeout`] cuts it to the
    /// `--wait` left.
    pub request_timeout: Duration,
    /// The backend as shown in messages (`host:port`, never credentials).
    pub backend: String,
}

/// The answer to one attempt, as the driver saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The backend says the lock is ours.
    Acquired {
        /// The fencing token it handed out.
        fencing_token: u64,
        /// The slot taken (0 for a plain lock).
        slot: u32,
        /// When the attempt was sent (the lease counts from here).
        sent_at: BootInstant,
    },
    /// Someone else holds it.
    Busy(Holder),
    /// The backend answered with an error.
    Failed(BackendError),
    /// No answer within the attempt's timeout, this long.
    TimedOut(Duration),
}

/// A lease just taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Taken {
    /// When the acquiring request was sent (the lease counts from here).
    pub sent_at: BootInstant,
    /// The fencing token handed out with the lease.
    pub fencing_token: u64,
    /// The slot held, 0 to N-1 (0 for a plain lock).
    pub slot: u32,
    /// The token the lock is held with (for renewals and the release).
    pub token: String,
    /// How long taking it took.
    pub waited: Duration,
}

/// What the driver does after an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The lock is ours: start the command.
    Take(Taken),
    /// The lock is busy: wait for its release (or expiry), at most this long, then
    /// send the next attempt.
    Wait {
        /// Who holds it.
        holder: Holder,
        /// The `--wait` left.
        for_at_most: Duration,
    },
    /// The lock is busy and `--wait` has run out: stop waiting, report the holder.
    GiveUpBusy {
        /// Who holds it.
        holder: Holder,
        /// How long lockrun tried.
        waited: Duration,
    },
    /// A transient failure: give `abandon` back, log (a warning if `warn`), sleep
    /// `after`, try again (with the new token [`Policy::request`] now carries).
    Retry {
        /// The pause before the next attempt.
        after: Duration,
        /// The token of the ambiguous attempt: release it, never use it again.
        abandon: String,
        /// What went wrong.
        error: BackendError,
        /// Whether to warn about it, rather than log it at debug level.
        warn: Warn,
        /// The attempts made so far, this one included.
        attempts: u32,
    },
    /// Give up: the command is not started.
    Fail {
        /// What went wrong.
        error: BackendError,
        /// The token of an attempt that may have been applied unseen, to give back.
        abandon: Option<String>,
        /// The attempts made, this one included.
        attempts: u32,
        /// From the start to this answer.
        tried_for: Duration,
    },
}

/// Whether a failed attempt is warned about: the first one and then at most one a
/// minute are; the others are logged at debug level only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Warn {
    /// Not warned about.
    Quietly,
    /// The first warning of this run.
    First,
    /// A reminder, a minute or more after the last warning.
    Again,
}

/// The acquire policy of one run.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    terms: Terms,
    request: AcquireRequest,
    random: Random,
    started_at: BootInstant,
    give_up_at: BootInstant,
    /// Attempts answered so far.
    attempts: u32,
    /// Transient failures in a row (the backoff's exponent).
    failures: u32,
    /// When a failure was last warned about.
    warned_at: Option<BootInstant>,
}

impl Policy {
    /// A policy for acquiring with `request` (its token is the first attempt's),
    /// started at `started_at`.
    pub fn new(
        terms: Terms,
        request: AcquireRequest,
        random: Random,
        started_at: BootInstant,
    ) -> Self {
        Policy {
            give_up_at: started_at + terms.wait,
            terms,
            request,
            random,
            started_at,
            attempts: 0,
            failures: 0,
            warned_at: None,
        }
    }

    /// The request the next attempt must send (with the current token).
    pub fn request(&self) -> &AcquireRequest {
        &self.request
    }

    /// The timeout of an attempt sent at `now`: the request timeout, cut to the
    /// `--wait` left (at least [`MIN_ATTEMPT`]) when waiting, so that a silent backend
    /// ends the run when `--wait` runs out, not a whole request timeout later. Without
    /// `--wait` the one attempt gets the whole request timeout.
    pub fn attempt_timeout(&self, now: BootInstant) -> Duration {
        let full = self.terms.request_timeout;
        if self.terms.wait.is_zero() {
            return full;
        }
        // Rounded up to 10 ms: the first attempt, sent a few microseconds after the
        // start, is given all of `--wait`, and its line says so in round figures.
        let left = self
            .give_up_at
            .saturating_since(now)
            .as_millis()
            .div_ceil(10)
            * 10;
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX));
        left.clamp(MIN_ATTEMPT.min(full), full)
    }

    /// How long the give-back of an abandoned attempt may take at `now`: before a
    /// retry, the `--wait` left (at most the request timeout); after giving up
    /// (`at_end`), [`GIVE_BACK_AT_END`] at most.
    pub fn give_back_timeout(&self, now: BootInstant, at_end: bool) -> Duration {
        let full = self.terms.request_timeout;
        if at_end {
            return GIVE_BACK_AT_END.min(full);
        }
        self.give_up_at.saturating_since(now).min(full)
    }

    /// Decides what follows `reply`, read at `now`.
    pub fn on_reply(&mut self, reply: Reply, now: BootInstant) -> Next {
        self.attempts = self.attempts.saturating_add(1);
        if matches!(reply, Reply::Acquired { .. } | Reply::Busy(_)) {
            // The backend answered: the backoff starts over after the next failure.
            self.failures = 0;
        }
        match reply {
            Reply::Acquired {
                fencing_token,
                slot,
                sent_at,
            } => {
                let lease = &self.terms.lease;
                if now < lease.deadline_from(sent_at) - lease.grace() {
                    return Next::Take(Taken {
                        sent_at,
                        fencing_token,
                        slot,
                        token: self.request.token.clone(),
                        waited: now.saturating_since(self.started_at),
                    });
                }
                let why = format!(
                    "{} answered too slowly to use the lease",
                    self.terms.backend
                );
                self.failed(BackendError::Unavailable(why), now)
            }
            Reply::Busy(holder) if now >= self.give_up_at => Next::GiveUpBusy {
                holder,
                waited: now.saturating_since(self.started_at),
            },
            Reply::Busy(holder) => Next::Wait {
                holder,
                for_at_most: self.give_up_at.saturating_since(now),
            },
            Reply::Failed(error) => self.failed(error, now),
            Reply::TimedOut(after) => {
                let why = format!(
                    "the backend at {} did not answer within {}",
                    self.terms.backend,
                    ms(after)
                );
                self.failed(BackendError::Unavailable(why), now)
            }
        }
    }

    /// A failed attempt: permanent errors end it; after a transient one the token is
    /// rotated (the attempt may have been applied unseen) and a retry follows after the
    /// backoff, at the give-up time at the latest; a failure at or after it gives up.
    fn failed(&mut self, error: BackendError, now: BootInstant) -> Next {
        let tried_for = now.saturating_since(self.started_at);
        if !error.is_transient() {
            return Next::Fail {
                error,
                abandon: None,
                attempts: self.attempts,
                tried_for,
            };
        }
        let abandon = std::mem::replace(&mut self.request.token, (self.random.token)());
        if now >= self.give_up_at {
            return Next::Fail {
                error,
                abandon: Some(abandon),
                attempts: self.attempts,
                tried_for,
            };
        }
        self.failures = self.failures.saturating_add(1);
        let after = self.backoff().min(self.give_up_at.saturating_since(now));
        let warn = match self.warned_at {
            None => Warn::First,
            Some(at) if now.saturating_since(at) >= WARN_EVERY => Warn::Again,
            Some(_) => Warn::Quietly,
        };
        if warn != Warn::Quietly {
            self.warned_at = Some(now);
        }
        Next::Retry {
            after,
            abandon,
            error,
            warn,
            attempts: self.attempts,
        }
    }

    /// Full jitter: a random pause from 0 to the [`retry_ceiling`] of the failures in
    /// a row, in whole milliseconds.
    fn backoff(&self) -> Duration {
        let ceiling_ms = retry_ceiling(self.failures).as_millis() as u64;
        Duration::from_millis((self.random.number)() % (ceiling_ms + 1))
    }
}

/// The longest pause after the n-th transient failure in a row: [`RETRY_BASE`] × 2ⁿ⁻¹,
/// at most [`RETRY_CAP`].
fn retry_ceiling(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RETRY_BASE.saturating_mul(1 << doublings).min(RETRY_CAP)
}

#[cfg(test)]
pub(super) mod tests;
