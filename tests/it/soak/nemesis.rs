//! The soak's nemesis: one fault at a time from a seeded schedule, each applied and then
//! healed, and noted with the instants it lasted (on the safe side: just before applying,
//! just after healing).

use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::report::{Fault, FaultEvent};
use super::rig::Rig;
use super::tap::Call;
use super::{Rng, NAME};
use crate::support::*;

/// Weights of the kinds in the draw, in `Fault::ALL` order.
const WEIGHTS: [u64; 13] = [4, 2, 2, 4, 2, 2, 3, 3, 6, 3, 3, 3, 3];

impl Rig {
    /// Faults, one at a time, until `until`: every kind once first, in a seeded order,
    /// so that even a short soak sees them all; then a weighted draw.
    pub(super) fn nemesis(&self, mut rng: Rng, until: Instant) {
        let mut first: Vec<Fault> = Fault::ALL.to_vec();
        for i in (1..first.len()).rev() {
            first.swap(i, rng.below(i as u64 + 1) as usize);
        }
        while Instant::now() < until {
            thread::sleep(rng.ms(300, 1500));
            let mut pick = rng.below(WEIGHTS.iter().sum());
            let mut kind = Fault::ALL[0];
            for (k, w) in Fault::ALL.iter().zip(WEIGHTS) {
                if pick < w {
                    kind = *k;
                    break;
                }
                pick -= w;
            }
            if !first.is_empty() {
                kind = first.remove(0);
            }
            if let Some(event) = self.inject(kind, &mut rng) {
                self.faults.lock().unwrap().push(event);
            }
        }
    }

    /// Applies and heals one fault; `None` if there was nothing to apply it to.
    fn inject(&self, kind: Fault, rng: &mut Rng) -> Option<FaultEvent> {
        let from = boottime();
        let (pid, detail) = match kind {
            Fault::FreezeRedis | Fault::RestartRedis | Fault::Flushall | Fault::ClockJump => {
                (None, self.server_fault(kind, rng))
            }
            Fault::Blackhole | Fault::Cut | Fault::Refuse | Fault::Latency => {
                (None, self.network_fault(kind, rng))
            }
            Fault::StuckRequests => (None, self.stuck_requests(rng)),
            Fault::PauseLockrun => {
                let (pid, detail) = self.pause_lockrun(rng)?;
                (Some(pid), detail)
            }
            Fault::KillLockrun => (Some(self.kill_lockrun(rng)?), String::new()),
            Fault::StderrBlocked => {
                let (pid, detail) = self.block_stderr(rng)?;
                (Some(pid), detail)
            }
            Fault::StopGuard => {
                let (pid, detail) = self.stop_guard(rng)?;
                (Some(pid), detail)
            }
        };
        Some(FaultEvent {
            kind,
            from,
            to: boottime(),
            pid,
            detail,
        })
    }

    /// A fault of the lock's server: frozen, restarted empty, flushed, or its clock
    /// jumped. Returns a few words for the report.
    fn server_fault(&self, kind: Fault, rng: &mut Rng) -> String {
        match kind {
            Fault::FreezeRedis => {
                let d = rng.ms(200, 3000);
                self.redis.lock().unwrap().pause();
                thread::sleep(d);
                self.redis.lock().unwrap().resume();
                format!("{d:?}")
            }
            Fault::RestartRedis => {
                let down = rng.ms(0, 1000);
                let mut redis = self.redis.lock().unwrap();
                redis.kill();
                thread::sleep(down);
                redis.restart();
                format!("down {down:?}")
            }
            Fault::Flushall => {
                self.redis.lock().unwrap().flushall();
                String::new()
            }
            _ => {
                let by = rng.ms(300, 3000);
                let moved = self.redis.lock().unwrap().jump_clock(by);
                format!("+{by:?} ({moved} keys' expiry)")
            }
        }
    }

    /// A fault of the network between lockrun and the server: blackholed, cut, refused
    /// or slow. Returns a few words for the report.
    fn network_fault(&self, kind: Fault, rng: &mut Rng) -> String {
        let proxy = self.tap.proxy();
        match kind {
            Fault::Blackhole => {
                let d = rng.ms(200, 3000);
                proxy.set_mode(Mode::Blackhole);
                thread::sleep(d);
                proxy.set_mode(Mode::Pass);
                format!("{d:?}")
            }
            Fault::Cut => {
                proxy.set_mode(Mode::Cut);
                proxy.set_mode(Mode::Pass);
                String::new()
            }
            Fault::Refuse => {
                let d = rng.ms(200, 2000);
                proxy.set_mode(Mode::Refuse);
                proxy.cut();
                thread::sleep(d);
                proxy.set_mode(Mode::Pass);
                format!("{d:?}")
            }
            _ => {
                let delay = rng.ms(50, 700);
                let d = rng.ms(1000, 4000);
                proxy.set_reply_delay(delay);
                thread::sleep(d);
                proxy.set_reply_delay(Duration::ZERO);
                format!("{delay:?} for {d:?}")
            }
        }
    }

    /// One acquire attempt stuck (its lockrun gives up on it and cleans up), and every
    /// release meanwhile: a flaky path that delivers late.
    fn stuck_requests(&self, rng: &mut Rng) -> String {
        let d = rng.ms(1500, 4000);
        self.tap.hold_next(Call::Acquire, 1);
        self.tap.hold_next(Call::Release, 1000);
        thread::sleep(d);
        let held = self.tap.held(Call::Acquire) + self.tap.held(Call::Release);
        for call in [Call::Acquire, Call::Release] {
            self.tap.hold_next(call, 0);
            self.tap.release_held(call, true);
        }
        format!("{d:?}, {held} connection(s) held")
    }

    /// The pid of the lockrun holding the lock (of a semaphore, the slot drawn at
    /// random), if any.
    fn holder(&self, rng: &mut Rng) -> Option<i32> {
        let slot = match self.slots {
            1 => 0,
            n => rng.below(u64::from(n)) as u32,
        };
        let redis = self.redis.lock().unwrap();
        redis.hget(&slot_key(NAME, slot), "pid")?.parse().ok()
    }

    /// SIGKILL of a lockrun, mostly the holder, else anyone (`kill -9`, the OOM
    /// killer): its job must die with it, and no next holder may start beside any of
    /// it. Returns its pid, or `None` when no lockrun runs.
    fn kill_lockrun(&self, rng: &mut Rng) -> Option<i32> {
        let holder = self.holder(rng);
        let live = self.live.lock().unwrap();
        if live.is_empty() {
            return None;
        }
        let victim = match holder {
            Some(h) if live.contains(&h) && rng.chance(70) => h,
            _ => live[rng.below(live.len() as u64) as usize],
        };
        // Not reaped while `live` is held: the pid is still that lockrun's.
        signal_pid(victim, Signal::SIGKILL);
        Some(victim)
    }

    /// The holder's stderr blocked for a while: its reader stops and the pipe is full,
    /// so every line lockrun writes would block (a holder that logged acquiring, so
    /// that the checker still knows its token). Returns its pid and a few words, or
    /// `None` when no such holder runs.
    fn block_stderr(&self, rng: &mut Rng) -> Option<(i32, String)> {
        let d = rng.ms(500, 3000);
        let holder = self.holder(rng)?;
        let pipe = self.stderrs.lock().unwrap().get(&holder).cloned()?;
        if !pipe.logged_acquiring() {
            return None;
        }
        pipe.block();
        let until = Instant::now() + d;
        while Instant::now() < until {
            thread::sleep(Duration::from_millis(50));
            pipe.fill();
        }
        pipe.unblock();
        Some((holder, format!("{d:?}")))
    }

    /// SIGSTOP of a lockrun, mostly the holder (the interesting case; of a semaphore,
    /// the holder of a slot drawn at random), else anyone, and SIGCONT after a while.
    /// Returns its pid and a few words for the report, or `None` when no lockrun runs.
    fn pause_lockrun(&self, rng: &mut Rng) -> Option<(i32, String)> {
        let d = rng.ms(300, 4000);
        let holder = self.holder(rng);
        let victim = {
            let live = self.live.lock().unwrap();
            if live.is_empty() {
                return None;
            }
            let p = match holder {
                Some(h) if live.contains(&h) && rng.chance(70) => h,
                _ => live[rng.below(live.len() as u64) as usize],
            };
            signal_pid(p, Signal::SIGSTOP);
            p
        };
        thread::sleep(d);
        // It may have ended meanwhile (a stopped lockrun is continued at its lease
        // deadline); not reaped while `live` is held, a pid in it is still that lockrun's.
        let live = self.live.lock().unwrap();
        if live.contains(&victim) {
            signal_pid(victim, Signal::SIGCONT);
        }
        Some((victim, format!("{d:?}")))
    }

    /// SIGSTOP of the holder's guard (of a semaphore, the holder of a slot drawn at
    /// random). Half the time its lockrun is stopped first and SIGKILLed while both are
    /// stopped (issue 39, case 1: nothing but the kernel can continue the guard then, and
    /// the job must still die with lockrun); else lockrun, running, continues the guard,
    /// and the nemesis sends SIGCONT after a while too. Returns the lockrun's pid and a
    /// few words, or `None` when no holder runs.
    fn stop_guard(&self, rng: &mut Rng) -> Option<(i32, String)> {
        let d = rng.ms(100, 1500);
        let kill = rng.chance(50);
        let holder = self.holder(rng)?;
        let guard = {
            let live = self.live.lock().unwrap();
            if !live.contains(&holder) {
                return None;
            }
            let guard = guard_of(holder)?;
            if kill {
                signal_pid(holder, Signal::SIGSTOP);
            }
            signal_pid(guard, Signal::SIGSTOP);
            if kill {
                // Stopped, lockrun cannot have continued its guard; once both are
                // stopped, lockrun dies.
                let until = Instant::now() + Duration::from_secs(2);
                while proc_state(guard) != Some('T') && Instant::now() < until {
                    thread::sleep(Duration::from_millis(1));
                }
                signal_pid(holder, Signal::SIGKILL);
            }
            guard
        };
        if kill {
            return Some((holder, "guard stopped, then lockrun killed".into()));
        }
        thread::sleep(d);
        if comm(guard).as_deref() == Some("lockrun-guard") {
            signal_pid(guard, Signal::SIGCONT);
        }
        Some((holder, format!("{d:?}")))
    }
}
