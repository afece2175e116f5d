//! The fixed timings of a lease ([`Params`]): the drift margin taken off every
//! deadline, the kill grace and the retry period, derived from the configuration.
//! Part of [`crate::lease`]; pure.

use std::time::Duration;

use crate::clock::BootInstant;

/// Fixed timings of one run, derived from the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// The lease length asked of the backend.
    pub ttl: Duration,
    /// Time between renewals while all goes well.
    pub renew_every: Duration,
    /// Time between renewal attempts after a transient failure.
    pub retry_every: Duration,
    /// Grace between the kill signal and SIGKILL.
    pub kill_after: Duration,
    /// Taken off every deadline: server and host clocks may run at slightly
    /// different rates, and lockrun's own timer may wake a little late on a busy
    /// machine.
    pub drift: Duration,
}

impl Params {
    /// Timings for a lease of `ttl` renewed every `renew_every`, with `kill_after` of
    /// grace: drift is 1% of the TTL (Redlock's clock-rate allowance) plus 50 ms for
    /// the time between a timer's expiry and the SIGKILL on a loaded host, at most a
    /// quarter of the TTL; retries come four
    /// times per renewal period (at most once a second, at least every 10 ms).
    pub fn new(ttl: Duration, renew_every: Duration, kill_after: Duration) -> Params {
        Params {
            ttl,
            renew_every,
            retry_every: (renew_every / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
            kill_after,
            drift: (ttl / 100 + Duration::from_millis(50)).min(ttl / 4),
        }
    }

    /// The local deadline of a lease whose request was sent at `sent_at`.
    pub fn deadline_from(&self, sent_at: BootInstant) -> BootInstant {
        sent_at + self.ttl.saturating_sub(self.drift)
    }

    /// How long before the deadline the kill signal is sent when renewals fail: the
    /// kill-after grace, but never more than half the time between the last missed
    /// renewal and the deadline, so that transient errors get retried first.
    pub fn grace(&self) -> Duration {
        self.kill_after
            .min(self.ttl.saturating_sub(self.renew_every) / 2)
    }
}
