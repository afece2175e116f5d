//! Time for lease deadlines: `CLOCK_BOOTTIME`, which keeps counting while the
//! machine is suspended (a frozen VM, a laptop lid), and a timer that fires on it.
//!
//! `CLOCK_MONOTONIC` (tokio's clock) stops during suspend, so a lease measured with it
//! would look longer than the server's TTL after a resume. Every deadline in
//! [`crate::lease`] is a [`BootInstant`] of this clock; [`Timer`] wakes the driver
//! when the earliest one is due, and fires at once after a resume if it was passed
//! meanwhile. The type is named apart from `std`'s and tokio's `Instant` (both on
//! `CLOCK_MONOTONIC`) so that the two clocks cannot be mixed by an import.
//! [`marks`] notes the time of each step of a run, for `.ci/bench`, when
//! `LOCKRUN_DEBUG_TIMES` names a file.
//! Depends on nothing else in the crate.

use std::io;
use std::ops::{Add, Sub};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::time::clock_gettime;
use tokio::io::unix::AsyncFd;

/// A point in time on `CLOCK_BOOTTIME`: time since boot, suspend included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// The current time.
    pub fn now() -> BootInstant {
        // CLOCK_BOOTTIME cannot fail on Linux ≥ 2.6.39; fall back to zero rather than
        // panic, which only makes every deadline look already passed (fail closed).
        let ts = clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .unwrap_or_else(|_| TimeSpec::new(0, 0));
        BootInstant(Duration::from(ts))
    }

    /// An instant at `since_boot` (for tests of the pure state machines).
    #[cfg(test)]
    pub const fn from_since_boot(since_boot: Duration) -> BootInstant {
        BootInstant(since_boot)
    }

    /// Time since boot (what another process compares with its own reading of
    /// `CLOCK_BOOTTIME`).
    pub fn since_boot(self) -> Duration {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(d))
    }
}

impl Sub<Duration> for BootInstant {
    type Output = BootInstant;
    fn sub(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(d))
    }
}

/// A one-shot timer on `CLOCK_BOOTTIME` (a non-blocking `timerfd` with an absolute
/// expiry), usable from tokio.
pub struct Timer {
    fd: AsyncFd<OwnedTimerFd>,
    armed: bool,
}

/// The timerfd, owned, with the raw-fd view tokio's reactor needs.
struct OwnedTimerFd(TimerFd);

impl AsRawFd for OwnedTimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl Timer {
    /// Creates a disarmed timer.
    pub fn new() -> io::Result<Timer> {
        let fd = TimerFd::new(
            ClockId::CLOCK_BOOTTIME,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        Ok(Timer {
            fd: register(OwnedTimerFd(fd))?,
            armed: false,
        })
    }

    /// Arms the timer to fire at `at` (at once if `at` has passed), or disarms it.
    pub fn set(&mut self, at: Option<BootInstant>) -> io::Result<()> {
        match at {
            Some(at) => {
                // A zero it_value would disarm the timer: never ask for time zero.
                let at = at.0.max(Duration::from_nanos(1));
                self.fd.get_ref().0.set(
                    Expiration::OneShot(TimeSpec::from_duration(at)),
                    TimerSetTimeFlags::TFD_TIMER_ABSTIME,
                )?;
                self.armed = true;
            }
            None => {
                self.fd.get_ref().0.unset()?;
                self.armed = false;
            }
        }
        Ok(())
    }

    /// Waits until the armed expiry; never returns while the timer is disarmed.
    pub async fn fired(&mut self) -> io::Result<()> {
        if !self.armed {
            return std::future::pending().await;
        }
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.get_inner().0.wait() {
                Ok(()) => {
                    self.armed = false;
                    return Ok(());
                }
                Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A POSIX timer on `CLOCK_BOOTTIME` that has the kernel send this process SIGCONT at
/// an instant: a process stopped then (SIGSTOP, SIGTSTP) is continued with no other
/// process's help, since a SIGCONT continues a stopped process the moment it is sent,
/// whatever its disposition; a running process ignores it (the default action). It is
/// how lockrun and its guard make sure that a stop never outlasts a lease deadline.
/// Not inherited across `fork` (each process makes its own), gone at `exec`.
pub struct ContinueAt(nix::sys::timer::Timer);

impl ContinueAt {
    /// Creates a disarmed one.
    pub fn new() -> io::Result<ContinueAt> {
        use nix::sys::signal::{SigEvent, SigevNotify, Signal};
        let event = SigEvent::new(SigevNotify::SigevSignal {
            signal: Signal::SIGCONT,
            si_value: 0,
        });
        let timer = nix::sys::timer::Timer::new(nix::time::ClockId::CLOCK_BOOTTIME, event)?;
        Ok(ContinueAt(timer))
    }

    /// Arms it for `since_boot` on `CLOCK_BOOTTIME` (at once if that has passed),
    /// replacing the instant armed before.
    pub fn set(&mut self, since_boot: Duration) -> io::Result<()> {
        // A zero it_value would disarm the timer: never ask for time zero.
        let at = since_boot.max(Duration::from_nanos(1));
        self.0
            .set(
                nix::sys::timer::Expiration::OneShot(TimeSpec::from_duration(at)),
                // (On Linux, timerfd's flag is TIMER_ABSTIME, 1.)
                nix::sys::timer::TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            )
            .map_err(io::Error::from)
    }
}

/// Registers the timer with tokio's reactor.
#[allow(unsafe_code)]
fn register(fd: OwnedTimerFd) -> io::Result<AsyncFd<OwnedTimerFd>> {
    // SAFETY: the AsyncFd owns the OwnedTimerFd, which owns the descriptor, so the
    // descriptor stays open for as long as it is registered, and nothing else closes it.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}

/// Where a run's time goes, for `.ci/bench` (docs/performance.md): with
/// `LOCKRUN_DEBUG_TIMES=FILE` in the environment, lockrun and its guard note the
/// `CLOCK_MONOTONIC` time of each step of a run ([`mark`]) and each appends them to
/// `FILE` as it exits ([`write_marks`]), one `PID STEP NANOSECONDS` line a step. Unset,
/// a mark costs one relaxed load. Marks are only taken on the main thread (and in the
/// guard, forked while lockrun had one thread), so the lock is never contended.
pub mod marks {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    /// The variable that turns marks on: the file to append them to.
    pub const VAR: &str = "LOCKRUN_DEBUG_TIMES";

    static ON: AtomicBool = AtomicBool::new(false);
    static MARKS: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());

    /// Turns marks on if [`VAR`] is set, and notes `main`.
    pub fn init() {
        if std::env::var_os(VAR).is_some_and(|v| !v.is_empty()) {
            ON.store(true, Ordering::Relaxed);
            mark("main");
        }
    }

    /// Notes the time of `step`, if marks are on.
    pub fn mark(step: &'static str) {
        if !ON.load(Ordering::Relaxed) {
            return;
        }
        let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC);
        let ns = ts.map_or(0, |t| {
            u64::try_from(std::time::Duration::from(t).as_nanos()).unwrap_or(u64::MAX)
        });
        if let Ok(mut m) = MARKS.lock() {
            m.push((step, ns));
        }
    }

    /// Notes `step`, then does `next`.
    pub fn then<T>(step: &'static str, next: impl FnOnce() -> T) -> T {
        mark(step);
        next()
    }

    /// In a child just forked: forgets the parent's marks, and notes `step`.
    pub fn forked(step: &'static str) {
        if let Ok(mut m) = MARKS.lock() {
            m.clear();
        }
        mark(step);
    }

    /// Appends this process's marks to [`VAR`]'s file in one write (errors ignored:
    /// a debugging aid never changes a run).
    pub fn write_marks() {
        use std::io::Write;
        let Some(path) = std::env::var_os(VAR).filter(|_| ON.load(Ordering::Relaxed)) else {
            return;
        };
        let pid = std::process::id();
        let text: String = MARKS.lock().map_or_else(
            |_| String::new(),
            |m| {
                m.iter()
                    .map(|(s, ns)| format!("{pid} {s} {ns}\n"))
                    .collect()
            },
        );
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path);
        if let Ok(mut f) = file {
            let _ = f.write_all(text.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_arithmetic_saturates() {
        let t = BootInstant::from_since_boot(Duration::from_secs(5));
        assert_eq!(
            t - Duration::from_secs(10),
            BootInstant::from_since_boot(Duration::ZERO)
        );
        assert_eq!(
            (t + Duration::from_secs(1)).saturating_since(t),
            Duration::from_secs(1)
        );
        assert_eq!(
            t.saturating_since(t + Duration::from_secs(1)),
            Duration::ZERO
        );
    }

    #[test]
    fn now_is_monotonic() {
        let a = BootInstant::now();
        let b = BootInstant::now();
        assert!(b >= a);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn timer_fires_at_the_armed_instant_and_at_once_when_past() {
        let mut timer = Timer::new().unwrap();
        let start = BootInstant::now();
        timer.set(Some(start + Duration::from_millis(30))).unwrap();
        timer.fired().await.unwrap();
        assert!(BootInstant::now().saturating_since(start) >= Duration::from_millis(30));

        timer.set(Some(start)).unwrap();
        tokio::time::timeout(Duration::from_secs(5), timer.fired())
            .await
            .expect("a timer armed in the past fires at once")
            .unwrap();
    }

    #[test]
    fn a_continue_alarm_that_fires_on_a_running_process_changes_nothing() {
        // SIGCONT to a running process is ignored (its default action): the test goes
        // on. (That it continues a stopped one is checked on real processes, by
        // tests/it/containment/stopped.rs.)
        let mut alarm = ContinueAt::new().unwrap();
        alarm.set(BootInstant::now().since_boot()).unwrap();
        alarm.set(Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn disarmed_timer_never_fires() {
        let mut timer = Timer::new().unwrap();
        timer.set(Some(BootInstant::now())).unwrap();
        timer.set(None).unwrap();
        let r = tokio::time::timeout(Duration::from_millis(50), timer.fired()).await;
        assert!(r.is_err());
    }
}
