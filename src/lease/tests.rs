//! Unit tests of the lease state machine: every state meets every event, plus a
//! randomised check of the kill-before-deadline rule.

use super::*;

const MS: Duration = Duration::from_millis(1);

fn at(ms: u64) -> BootInstant {
    BootInstant::from_since_boot(Duration::from_millis(ms))
}

/// TTL 3000 ms, renew every 1000 ms, kill-after 500 ms: drift = 80 ms, grace = 500 ms,
/// retry every 250 ms.
fn params() -> Params {
    Params::new(3000 * MS, 1000 * MS, 500 * MS)
}

fn machine() -> Machine {
    Machine::new(params(), at(1000), at(1010), None)
}

const DEADLINE: u64 = 1000 + 3000 - 80;

#[test]
fn params_derive_drift_grace_and_retry() {
    let p = params();
    assert_eq!(p.drift, 80 * MS);
    assert_eq!(
        Params::new(100 * MS, 50 * MS, MS).drift,
        25 * MS,
        "at most a quarter of a short TTL"
    );
    assert_eq!(p.grace(), 500 * MS);
    assert_eq!(p.retry_every, 250 * MS);
    assert_eq!(p.deadline_from(at(1000)), at(DEADLINE));
    // A kill-after longer than the lease leaves half of (TTL - renew) of grace.
    let long = Params::new(3000 * MS, 1000 * MS, 60_000 * MS);
    assert_eq!(long.grace(), 1000 * MS);
}

#[test]
fn new_lease_is_held_from_the_acquire_send_time() {
    let m = machine();
    assert_eq!(
        m.lease(),
        Lease::Held {
            deadline: at(DEADLINE),
            next_renew: at(2000),
            renewing: None
        }
    );
    assert_eq!(m.stop(), Stop::Running);
    assert_eq!(m.next_wakeup(), Some(at(2000)));
    assert!(m.holds_lease());
}

#[test]
fn tick_before_renewal_time_does_nothing() {
    let mut m = machine();
    assert_eq!(m.step(Event::Tick, at(1500)), Actions::default());
}

#[test]
fn tick_at_renewal_time_renews_once() {
    let mut m = machine();
    let a = m.step(Event::Tick, at(2000));
    assert!(a.renew);
    assert_eq!(a.signal, None);
    // In flight: no second request, and the wakeup is now the grace point.
    assert!(!m.step(Event::Tick, at(2100)).renew);
    assert_eq!(m.next_wakeup(), Some(at(DEADLINE - 500)));
}

#[test]
fn renew_ok_counts_the_deadline_from_the_send_time() {
    let mut m = machine();
    m.step(Event::Tick, at(2000));
    let a = m.step(Event::RenewOk, at(2400));
    assert_eq!(a, Actions::default());
    assert_eq!(
        m.lease(),
        Lease::Held {
            deadline: at(2000 + 2920),
            next_renew: at(3000),
            renewing: None
        }
    );
}

#[test]
fn renew_ok_never_shortens_a_known_deadline() {
    let p = Params::new(3000 * MS, 1000 * MS, 500 * MS);
    let mut m = Machine::new(p, at(1000), at(1000), None);
    // Forge a renewal "sent" before the acquisition: the deadline must stay.
    m.lease = Lease::Held {
        deadline: at(DEADLINE),
        next_renew: at(2000),
        renewing: Some(at(500)),
    };
    m.step(Event::RenewOk, at(600));
    assert!(matches!(m.lease(), Lease::Held { deadline, .. } if deadline == at(DEADLINE)));
}

#[test]
fn renew_failed_retries_soon_and_keeps_the_deadline() {
    let mut m = machine();
    m.step(Event::Tick, at(2000));
    let a = m.step(Event::RenewFailed, at(2100));
    assert_eq!(a, Actions::default());
    assert_eq!(
        m.lease(),
        Lease::Held {
            deadline: at(DEADLINE),
            next_renew: at(2350),
            renewing: None
        }
    );
    assert!(m.step(Event::Tick, at(2350)).renew);
}

#[test]
fn failing_renewals_send_the_kill_signal_at_the_grace_point_and_sigkill_at_the_deadline() {
    let mut m = machine();
    m.step(Event::Tick, at(2000));
    m.step(Event::RenewFailed, at(2100));
    let a = m.step(Event::Tick, at(DEADLINE - 500));
    assert_eq!(a.signal, Some(GroupSignal::Stop(StopReason::LeaseExpiring)));
    assert_eq!(
        m.stop(),
        Stop::Terminating {
            reason: StopReason::LeaseExpiring,
            kill_at: at(DEADLINE)
        }
    );
    assert_eq!(m.step(Event::Tick, at(DEADLINE - 1)).signal, None);
    let a = m.step(Event::Tick, at(DEADLINE));
    assert_eq!(a.signal, Some(GroupSignal::Kill(StopReason::LeaseExpiring)));
    assert_eq!(m.lease(), Lease::Expired);
    assert!(!m.holds_lease());
    assert_eq!(m.next_wakeup(), None);
}

#[test]
fn renewal_recovering_after_the_kill_signal_still_escalates_after_kill_after() {
    let p = Params::new(3000 * MS, 1000 * MS, 200 * MS);
    let mut m = Machine::new(p, at(1000), at(1000), None);
    // grace = 200 ms: kill signal at 3720.
    m.step(Event::Tick, at(2000));
    m.step(Event::RenewFailed, at(2100));
    // The retry due since 2350 goes out with the kill signal.
    let a = m.step(Event::Tick, at(3720));
    assert!(a.renew);
    assert!(matches!(m.stop(), Stop::Terminating { kill_at, .. } if kill_at == at(3920)));
    m.step(Event::RenewOk, at(3810));
    assert_eq!(m.step(Event::Tick, at(3919)).signal, None);
    assert_eq!(
        m.step(Event::Tick, at(3920)).signal,
        Some(GroupSignal::Kill(StopReason::LeaseExpiring))
    );
    // The lease is still ours: keep renewing until the group is gone, then release.
    assert!(m.holds_lease());
}

#[test]
fn definite_loss_stops_at_once_and_kills_after_kill_after() {
    let mut m = machine();
    m.step(Event::Tick, at(2000));
    let a = m.step(Event::RenewLost, at(2005));
    assert_eq!(a.signal, Some(GroupSignal::Stop(StopReason::LeaseLost)));
    assert!(!a.renew);
    assert_eq!(
        m.lease(),
        Lease::Lost {
            deadline: at(DEADLINE)
        }
    );
    assert_eq!(m.next_wakeup(), Some(at(2505)));
    assert_eq!(
        m.step(Event::Tick, at(2505)).signal,
        Some(GroupSignal::Kill(StopReason::LeaseLost))
    );
    assert_eq!(m.step(Event::Tick, at(9000)), Actions::default());
    assert!(!m.holds_lease());
}

#[test]
fn paused_past_the_deadline_kills_at_the_first_tick() {
    let mut m = machine();
    let a = m.step(Event::Tick, at(DEADLINE + 60_000));
    assert_eq!(
        a,
        Actions {
            renew: false,
            signal: Some(GroupSignal::Kill(StopReason::LeaseExpiring))
        }
    );
    assert_eq!(m.lease(), Lease::Expired);
}

#[test]
fn paused_with_a_renewal_in_flight_kills_even_if_the_reply_is_ok_but_late() {
    let mut m = machine();
    m.step(Event::Tick, at(2000));
    // Resumed long after: the timer tick comes first.
    let a = m.step(Event::Tick, at(10_000));
    assert_eq!(a.signal, Some(GroupSignal::Kill(StopReason::LeaseExpiring)));
    let a = m.step(Event::RenewOk, at(10_001));
    assert_eq!(a, Actions::default());
    assert_eq!(m.lease(), Lease::Expired);
}

#[test]
fn a_loss_reported_after_the_deadline_kills_at_once() {
    // Found by the randomised test (seed 220): a renewal reply read after a pause
    // said "not yours"; the kill must not wait for --kill-after.
    let mut m = machine();
    m.step(Event::Tick, at(2000));
    let a = m.step(Event::RenewLost, at(DEADLINE + 2000));
    assert_eq!(a.signal, Some(GroupSignal::Kill(StopReason::LeaseExpiring)));
    assert_eq!(m.lease(), Lease::Expired);
}

#[test]
fn max_runtime_stops_then_kills() {
    let mut m = Machine::new(params(), at(1000), at(1000), Some(700 * MS));
    assert_eq!(m.next_wakeup(), Some(at(1700)));
    let a = m.step(Event::Tick, at(1700));
    assert_eq!(a.signal, Some(GroupSignal::Stop(StopReason::MaxRuntime)));
    assert_eq!(m.step(Event::Tick, at(2199)).signal, None);
    assert_eq!(
        m.step(Event::Tick, at(2200)).signal,
        Some(GroupSignal::Kill(StopReason::MaxRuntime))
    );
    assert_eq!(m.stop_reason(), Some(StopReason::MaxRuntime));
}

#[test]
fn command_exit_with_leftovers_stops_the_group() {
    let mut m = machine();
    let a = m.step(Event::CommandExited, at(1200));
    assert_eq!(a.signal, Some(GroupSignal::Stop(StopReason::Leftovers)));
    assert_eq!(
        m.stop(),
        Stop::Terminating {
            reason: StopReason::Leftovers,
            kill_at: at(1700)
        }
    );
    // The lease is kept (and renewed) while leftovers run.
    assert_eq!(m.step(Event::CommandExited, at(1300)), Actions::default());
    assert_eq!(
        m.step(Event::Tick, at(1700)).signal,
        Some(GroupSignal::Kill(StopReason::Leftovers))
    );
    assert!(m.holds_lease());
    assert!(!StopReason::Leftovers.is_loss());
}

#[test]
fn killed_state_ignores_every_event_but_keeps_renewing() {
    let mut m = Machine::new(params(), at(1000), at(1000), Some(MS));
    m.step(Event::Tick, at(1001));
    m.step(Event::Tick, at(1501));
    assert_eq!(
        m.stop(),
        Stop::Killed {
            reason: StopReason::MaxRuntime
        }
    );
    for ev in [
        Event::Tick,
        Event::CommandExited,
        Event::TimerFailed,
        Event::Forwarded,
        Event::GuardLost,
        Event::GuardStopped,
    ] {
        assert_eq!(m.step(ev, at(1600)).signal, None);
    }
    assert!(m.step(Event::Tick, at(2000)).renew);
    assert_eq!(m.step(Event::RenewOk, at(2001)).signal, None);
    assert!(m.step(Event::Tick, at(3000)).renew);
    assert_eq!(m.step(Event::RenewLost, at(3001)).signal, None);
    assert!(matches!(m.lease(), Lease::Lost { .. }));
}

#[test]
fn a_timer_failure_kills_at_once_and_leaves_the_lease_alone() {
    let mut m = machine();
    let a = m.step(Event::TimerFailed, at(1200));
    assert_eq!(
        a,
        Actions {
            renew: false,
            signal: Some(GroupSignal::Kill(StopReason::TimerFailed))
        }
    );
    assert_eq!(
        m.stop(),
        Stop::Killed {
            reason: StopReason::TimerFailed
        }
    );
    assert_eq!(
        m.lease(),
        machine().lease(),
        "still ours, to release at the end"
    );
    assert_eq!(m.step(Event::TimerFailed, at(1300)), Actions::default());
}

#[test]
fn a_timer_failure_while_stopping_escalates_to_sigkill_for_the_same_reason() {
    let mut m = machine();
    m.step(Event::CommandExited, at(1200));
    assert_eq!(
        m.step(Event::TimerFailed, at(1300)).signal,
        Some(GroupSignal::Kill(StopReason::Leftovers))
    );
    assert_eq!(m.stop_reason(), Some(StopReason::Leftovers));
}

#[test]
fn a_timer_failure_with_a_renewal_due_still_renews() {
    let mut m = machine();
    let a = m.step(Event::TimerFailed, at(2000));
    assert!(a.renew);
    assert_eq!(a.signal, Some(GroupSignal::Kill(StopReason::TimerFailed)));
}

#[test]
fn replies_without_a_renewal_in_flight_change_nothing() {
    for ev in [Event::RenewOk, Event::RenewFailed, Event::RenewLost] {
        let mut m = machine();
        assert_eq!(m.step(ev, at(1100)), Actions::default());
        assert_eq!(m.lease(), machine().lease());
    }
}

#[test]
fn expired_and_lost_leases_never_renew_or_signal_twice() {
    for ev in [
        Event::Tick,
        Event::RenewOk,
        Event::RenewFailed,
        Event::RenewLost,
        Event::CommandExited,
        Event::TimerFailed,
        Event::Forwarded,
        Event::GuardLost,
        Event::GuardStopped,
    ] {
        let mut m = machine();
        m.step(Event::Tick, at(DEADLINE));
        assert_eq!(m.step(ev, at(DEADLINE + 5000)), Actions::default());
        assert_eq!(m.lease(), Lease::Expired);
    }
}

#[test]
fn stop_reasons_classify_loss() {
    assert!(StopReason::LeaseLost.is_loss());
    assert!(StopReason::LeaseExpiring.is_loss());
    assert!(StopReason::TimerFailed.is_loss());
    assert!(!StopReason::MaxRuntime.is_loss());
    for r in [
        StopReason::LeaseLost,
        StopReason::LeaseExpiring,
        StopReason::MaxRuntime,
        StopReason::Leftovers,
        StopReason::TimerFailed,
    ] {
        assert!(!r.describe().is_empty());
    }
}

/// A tiny deterministic generator, so the randomised test needs no crate.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Drives the machine like the async driver would, with random delays, replies and
/// pauses, and checks the safety rule from the outside: SIGKILL is sent no later than
/// (send time of the last renewal the "server" accepted + TTL - drift), and the
/// command is never stopped while the lease is healthy and no stop was asked for.
#[test]
fn random_schedules_never_kill_after_the_deadline() {
    for seed in 1..=500u64 {
        let mut rng = XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let p = Params::new(
            3000 * MS,
            1000 * MS,
            Duration::from_millis(rng.next() % 4000),
        );
        let mut now = 1000u64;
        let mut m = Machine::new(p, at(now), at(now), None);
        let mut truth_deadline = at(now) + p.ttl - p.drift;
        let mut in_flight: Option<BootInstant> = None;
        let mut killed_at: Option<BootInstant> = None;
        for _ in 0..200 {
            // Jump to the next wakeup, or earlier, or (a pause) far later.
            let wake = m
                .next_wakeup()
                .map(|t| t.saturating_since(at(0)).as_millis() as u64);
            now = match (rng.next() % 10, wake) {
                (0, _) => now + rng.next() % 6000,
                (_, Some(w)) if w > now => now + (rng.next() % (w - now + 1)).max(1),
                _ => now + 1 + rng.next() % 50,
            };
            let event = match (in_flight, rng.next() % 4) {
                (Some(_), 0) => Event::RenewOk,
                (Some(_), 1) => Event::RenewFailed,
                (Some(_), 2) if rng.next().is_multiple_of(20) => Event::RenewLost,
                _ => Event::Tick,
            };
            if event == Event::RenewOk {
                let sent = in_flight.expect("in flight");
                truth_deadline = truth_deadline.max(sent + p.ttl - p.drift);
            }
            if matches!(
                event,
                Event::RenewOk | Event::RenewFailed | Event::RenewLost
            ) {
                in_flight = None;
            }
            let a = m.step(event, at(now));
            if a.renew {
                assert!(in_flight.is_none(), "seed {seed}: two renewals in flight");
                in_flight = Some(at(now));
            }
            if let Some(GroupSignal::Kill(_)) = a.signal {
                assert!(killed_at.is_none(), "seed {seed}: SIGKILL twice");
                killed_at = Some(at(now));
            }
            if !m.holds_lease() {
                in_flight = None;
            }
            if at(now) >= truth_deadline {
                assert!(
                    matches!(m.stop(), Stop::Killed { .. }),
                    "seed {seed}: at {now} past the deadline {truth_deadline:?} without SIGKILL"
                );
            }
        }
    }
}

mod signals;
