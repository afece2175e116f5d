//! The lease machine and the job's own events: a signal lockrun forwarded (SIGKILL
//! `--kill-after` later) and a lost guard (SIGKILL at once).

use super::*;

#[test]
fn a_forwarded_signal_schedules_sigkill_after_kill_after_and_sends_nothing_itself() {
    let mut m = machine();
    let a = m.step(Event::Forwarded, at(1200));
    assert_eq!(a.signal, None, "the forwarded signal was the stop signal");
    assert_eq!(
        m.stop(),
        Stop::Terminating {
            reason: StopReason::Forwarded,
            kill_at: at(1200) + params().kill_after,
        }
    );
    let kill_at = at(1200) + params().kill_after;
    assert_eq!(m.next_wakeup().map(|t| t <= kill_at), Some(true));
    assert_eq!(m.step(Event::Tick, kill_at - MS).signal, None);
    assert_eq!(
        m.step(Event::Tick, kill_at).signal,
        Some(GroupSignal::Kill(StopReason::Forwarded))
    );
    assert!(m.holds_lease(), "released once the job is gone");
    assert!(!StopReason::Forwarded.is_loss());
}

#[test]
fn a_second_forwarded_signal_does_not_push_sigkill_back() {
    let mut m = machine();
    m.step(Event::Forwarded, at(1200));
    m.step(Event::Forwarded, at(1300));
    assert_eq!(
        m.stop(),
        Stop::Terminating {
            reason: StopReason::Forwarded,
            kill_at: at(1200) + params().kill_after,
        }
    );
}

#[test]
fn sigkill_after_a_forwarded_signal_comes_no_later_than_the_lease_deadline() {
    // --kill-after 10 s, longer than the lease: the deadline comes first.
    let p = Params::new(3000 * MS, 1000 * MS, 10_000 * MS);
    let mut m = Machine::new(p, at(1000), at(1010), None);
    m.step(Event::Tick, at(2000));
    m.step(Event::RenewFailed, at(2100));
    m.step(Event::Forwarded, at(2200));
    assert_eq!(m.step(Event::Tick, at(DEADLINE - 1)).signal, None);
    assert_eq!(
        m.step(Event::Tick, at(DEADLINE)).signal,
        Some(GroupSignal::Kill(StopReason::Forwarded))
    );
}

#[test]
fn a_lost_guard_kills_at_once_whatever_the_stop_state() {
    let mut m = machine();
    assert_eq!(
        m.step(Event::GuardLost, at(1100)).signal,
        Some(GroupSignal::Kill(StopReason::GuardLost))
    );
    assert!(m.holds_lease(), "still ours: released once the job is gone");
    assert!(StopReason::GuardLost.is_loss());
    let mut m = machine();
    m.step(Event::CommandExited, at(1100));
    assert_eq!(
        m.step(Event::GuardLost, at(1150)).signal,
        Some(GroupSignal::Kill(StopReason::GuardLost))
    );
    assert_eq!(m.step(Event::GuardLost, at(1160)).signal, None);
}

#[test]
fn a_guard_held_stopped_kills_at_once_whatever_the_stop_state() {
    let mut m = machine();
    assert_eq!(
        m.step(Event::GuardStopped, at(1100)).signal,
        Some(GroupSignal::Kill(StopReason::GuardStopped))
    );
    assert!(m.holds_lease(), "still ours: released once the job is gone");
    assert!(StopReason::GuardStopped.is_loss());
    let mut m = machine();
    m.step(Event::Forwarded, at(1100));
    assert_eq!(
        m.step(Event::GuardStopped, at(1150)).signal,
        Some(GroupSignal::Kill(StopReason::GuardStopped))
    );
    assert_eq!(m.step(Event::GuardStopped, at(1160)).signal, None);
    assert_eq!(m.step(Event::GuardLost, at(1170)).signal, None);
}
