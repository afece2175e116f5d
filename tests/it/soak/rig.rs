//! The soak's rig: the lock's `redis-server` behind the recording tap,
//! the fenced store, the listener the critical sections report to, and the workers that
//! run lockrun after lockrun (with the phase's `--slots`); then, at the end, everything
//! the checker needs.

use std::collections::HashMap;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::check::{self, History, Report};
use super::report::{describe, FaultEvent, Listener, Run};
use super::stderr::StderrPipe;
use super::tap::Tap;
use super::{Phase, Rng, NAME, TTL};
use crate::support::*;

/// The critical section, run by lockrun as `perl -e`.
const SECTION: &str = include_str!("section.pl");

/// The fenced store's compare-and-set: a write is accepted only if its token is at
/// least the highest accepted so far on its key (compared as decimal strings: exact for
/// any u64); sections write to the key of their slot. Every write, accepted or not, is
/// logged in the order the store took it.
const STORE_CAS: &str = r#"
local t = ARGV[1]
local hi = redis.call('GET', KEYS[1])
local ok = (not hi) or (#t > #hi) or (#t == #hi and t >= hi)
if ok then redis.call('SET', KEYS[1], t) end
redis.call('RPUSH', KEYS[2], (ok and '1' or '0') .. ' ' .. ARGV[2])
if ok then return 1 else return 0 end
"#;

/// A lockrun that has not ended after this long is hung (a bug): it is killed and
/// reported. Far above `--wait` plus the longest section and fault.
const HUNG_AFTER: Duration = Duration::from_secs(60);

/// What the soak shares between the nemesis and the workers.
pub(super) struct Rig {
    /// The phase's `--slots`.
    pub(super) slots: u32,
    pub(super) redis: Mutex<RedisServer>,
    store: RedisServer,
    sha: String,
    pub(super) tap: Tap,
    listener: Listener,
    run_id: String,
    /// lockruns that have not been reaped: the nemesis may pause or kill them. A worker
    /// reaps only while holding this lock, so a pid here is never a reused one.
    pub(super) live: Mutex<Vec<i32>>,
    /// The stderr of each lockrun not reaped yet, by its pid: the nemesis may block it.
    pub(super) stderrs: Mutex<HashMap<i32, Arc<StderrPipe>>>,
    runs: Mutex<Vec<Run>>,
    pub(super) faults: Mutex<Vec<FaultEvent>>,
    stop: AtomicBool,
}

/// Runs `phase` of the soak for `secs` with `seed`; returns the checker's report (with
/// the failures found at the end: processes left, lock not freed) and how long after the
/// last holder the lock was free.
pub(super) fn soak(phase: Phase, seed: u64, secs: u64) -> (Report, Duration) {
    let rig = Rig::new(phase.slots);
    let until = Instant::now() + Duration::from_secs(secs);
    thread::scope(|scope| {
        for w in 0..phase.workers {
            let r = Rng::new(seed.wrapping_add(w + 1).wrapping_mul(0x1000_0000_01B3));
            let rig = &rig;
            scope.spawn(move || rig.worker(r));
        }
        rig.nemesis(Rng::new(seed), until);
        rig.stop.store(true, Ordering::SeqCst);
    });
    let (end_failures, freed_after) = rig.end_failures();
    let mut report = rig.check(seed);
    report.failures.extend(end_failures);
    (report, freed_after)
}

impl Rig {
    fn new(slots: u32) -> Rig {
        let redis = RedisServer::start();
        let store = RedisServer::start();
        let sha: String = store.query(redis::cmd("SCRIPT").arg("LOAD").arg(STORE_CAS));
        let tap = Tap::start(redis.port());
        Rig {
            slots,
            redis: Mutex::new(redis),
            store,
            sha,
            tap,
            listener: Listener::start(),
            run_id: format!("{}-{}", std::process::id(), boottime().as_nanos()),
            live: Mutex::new(Vec::new()),
            stderrs: Mutex::default(),
            runs: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }
    }

    /// True once the workers are to stop.
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// One worker: lockrun after lockrun until told to stop.
    fn worker(&self, mut rng: Rng) {
        while !self.stopping() {
            let mut lr = self.start_lockrun(&mut rng);
            let pid = lr.pid();
            let (finished, hung) = self.reap(&mut lr);
            let ended = boottime();
            let stderr = self.stderrs.lock().unwrap().remove(&pid);
            self.runs.lock().unwrap().push(Run {
                pid,
                ended,
                code: finished.code,
                stderr: stderr.map_or(String::new(), |e| e.finish()),
                hung,
            });
            thread::sleep(rng.ms(0, 300));
        }
    }

    /// Starts one lockrun around the critical section, with a seeded choice of how long
    /// it holds and how it behaves, and counts it live.
    fn start_lockrun(&self, rng: &mut Rng) -> Running {
        // Mostly shorter than the TTL; some much longer, so they live on renewals.
        let hold = match rng.below(20) {
            0..=7 => rng.ms(10, 150),
            8..=16 => rng.ms(150, 1200),
            _ => rng.ms(1500, 3500),
        };
        let slots = self.slots.to_string();
        let mut opts = vec![
            "--ttl",
            "1500ms",
            "--wait",
            "20s",
            "-vv",
            "--log-format",
            "json",
        ];
        if self.slots > 1 {
            opts.extend(["--slots", &slots]);
        }
        // Some sections leave a child running: in their group, in a session of its own,
        // or orphaned by a double fork (see section.pl).
        let child = match rng.below(20) {
            0 => "group",
            1 => "setsid",
            2 => "orphan",
            _ => "",
        };
        let mut cmd = lockrun_run(&self.tap.url(), NAME, &opts, &["perl", "-e", SECTION]);
        cmd.env("SOAK_HARNESS", self.listener.port().to_string())
            .env("SOAK_STORE", self.store.port().to_string())
            .env("SOAK_SHA", &self.sha)
            .env("SOAK_HOLD_MS", hold.as_millis().to_string())
            .env("SOAK_TERM", if rng.chance(25) { "ignore" } else { "obey" })
            .env("SOAK_CHILD", child)
            .env("SOAK_RUN", &self.run_id);
        let (stderr, write) = StderrPipe::start();
        let lr = spawn_with_stderr(cmd, write);
        self.stderrs.lock().unwrap().insert(lr.pid(), stderr);
        self.live.lock().unwrap().push(lr.pid());
        lr
    }

    /// Waits for `lr` to end (killing it if it hangs) and counts it no longer live;
    /// returns how it ended and whether it hung.
    fn reap(&self, lr: &mut Running) -> (Finished, bool) {
        let pid = lr.pid();
        let started = Instant::now();
        loop {
            {
                let mut live = self.live.lock().unwrap();
                if let Some(f) = lr.try_finish() {
                    live.retain(|&p| p != pid);
                    return (f, false);
                }
                if started.elapsed() > HUNG_AFTER {
                    signal_pid(pid, Signal::SIGCONT);
                    signal_pid(pid, Signal::SIGKILL);
                    let f = lr.wait();
                    live.retain(|&p| p != pid);
                    return (f, true);
                }
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Check 4, at the end: nothing left running, and the lock (every slot) freed within
    /// a TTL of the last holder's end (or of the last fault's healing, whichever is later: a request
    /// held back by a partition may land then). Returns the failures and how long after
    /// that the lock was free.
    fn end_failures(&self) -> (Vec<String>, Duration) {
        let mut failures = Vec::new();
        let left = self.leftovers();
        if !left.is_empty() {
            failures.push(format!("processes of the soak still running: {left:?}"));
            for p in &left {
                signal_pid(*p, Signal::SIGKILL);
            }
        }
        let healed = self.faults.lock().unwrap().last().map(|f| f.to);
        let last_end = self.runs.lock().unwrap().iter().map(|r| r.ended).max();
        let last_end = last_end.unwrap_or_default().max(healed.unwrap_or_default());
        let free_at = {
            let redis = self.redis.lock().unwrap();
            let start = Instant::now();
            while self.held(&redis) && start.elapsed() < TTL * 4 {
                thread::sleep(Duration::from_millis(5));
            }
            boottime()
        };
        let freed_after = free_at.saturating_sub(last_end);
        if freed_after > TTL + Duration::from_millis(300) {
            failures.push(format!(
                "the lock was still held {freed_after:?} after the last holder ended (TTL {TTL:?})"
            ));
        }
        (failures, freed_after)
    }

    /// True while any slot of the lock is held (its key exists; slot 0's is the plain
    /// lock's).
    fn held(&self, redis: &RedisServer) -> bool {
        (0..self.slots).any(|i| redis.exists(&slot_key(NAME, i)))
    }

    /// Processes of this soak (by their SOAK_RUN variable) that still exist.
    fn leftovers(&self) -> Vec<i32> {
        let marker = format!("SOAK_RUN={}", self.run_id);
        let mut found = Vec::new();
        for e in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            if env.split(|&b| b == 0).any(|v| v == marker.as_bytes()) && is_alive(pid) {
                found.push(pid);
            }
        }
        found
    }

    /// Collects the whole history and checks it; writes it to a file when the check
    /// fails (or `LOCKRUN_SOAK_DUMP` names one).
    fn check(&self, seed: u64) -> Report {
        // Give the listener a moment to see the last connections close.
        let settle = Instant::now();
        while self.listener.sections().iter().any(|s| s.gone.is_none())
            && settle.elapsed() < Duration::from_secs(5)
        {
            thread::sleep(Duration::from_millis(10));
        }
        let sections = self.listener.sections();
        let records = self.tap.records();
        let faults = self.faults.lock().unwrap().clone();
        let runs = self.runs.lock().unwrap().clone();
        let store_log: Vec<String> = self
            .store
            .query(redis::cmd("LRANGE").arg("log").arg(0).arg(-1));
        let history = History {
            sections: &sections,
            records: &records,
            faults: &faults,
            runs: &runs,
            store_log: &store_log,
            ttl: TTL,
            slots: self.slots,
        };
        let report = check::check(&history);
        let dump = std::env::var("LOCKRUN_SOAK_DUMP").ok().or_else(|| {
            (!report.failures.is_empty()).then(|| {
                let name = format!("lockrun-soak-{seed}-{}.txt", std::process::id());
                std::env::temp_dir()
                    .join(name)
                    .to_string_lossy()
                    .into_owned()
            })
        });
        if let Some(path) = dump {
            fs::write(&path, describe(&history)).expect("write the soak's history");
            eprintln!("soak: the whole history is in {path}");
        }
        report
    }
}
