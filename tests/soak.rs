//! The nemesis soak (issue 3): several lockruns contend for one lock in a loop while a
//! seeded random schedule freezes, kills, restarts and flushes Redis, blackholes, cuts,
//! refuses and slows the network, pauses lockruns, and jumps the server's wall clock.
//! Every critical section writes to a fenced store and reports its own history; a
//! checker (`soak/check.rs`) then verifies SPEC's safety properties and prints figures.
//!
//! The default run is bounded (about a minute and a half) with a fixed seed. Longer or
//! other runs, and the replay of a failing one (the seed is printed):
//!
//! ```text
//! LOCKRUN_SOAK_SEED=12345 LOCKRUN_SOAK_SECS=600 cargo test --test soak -- --nocapture
//! ```
//!
//! A replay repeats the schedule of faults and of the workers' choices, not the exact
//! interleaving (the machine decides that), so a rare failure may need a few runs.
//!
//! Needs `redis-server`, `perl` and Debian's `faketime` (libfaketime).

mod support;

#[path = "soak/check.rs"]
mod check;
#[path = "soak/history.rs"]
mod history;
#[path = "soak/tap.rs"]
mod tap;

use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::*;

use crate::history::{Fault, FaultEvent, Listener, Run};
use crate::tap::{Call, Tap};

/// The critical section, run by lockrun as `perl -e`.
const SECTION: &str = include_str!("soak/section.pl");

/// The fenced store's compare-and-set: a write is accepted only if its token is at
/// least the highest accepted so far (compared as decimal strings: exact for any u64).
/// Every write, accepted or not, is logged in the order the store took it.
const STORE_CAS: &str = r#"
local t = ARGV[1]
local hi = redis.call('GET', KEYS[1])
local ok = (not hi) or (#t > #hi) or (#t == #hi and t >= hi)
if ok then redis.call('SET', KEYS[1], t) end
redis.call('RPUSH', KEYS[2], (ok and '1' or '0') .. ' ' .. ARGV[2])
if ok then return 1 else return 0 end
"#;

/// The lock every worker contends for.
const NAME: &str = "soak";

/// The lease of every lockrun: short, so that faults often outlast it.
const TTL: Duration = Duration::from_millis(1500);

/// Contending lockruns.
const WORKERS: u64 = 4;

/// The default seed and length of the soak in the normal test suite.
const DEFAULT_SEED: u64 = 20_250_301;
const DEFAULT_SECS: u64 = 75;

/// A lockrun that has not ended after this long is hung (a bug): it is killed and
/// reported. Far above `--wait` plus the longest section and fault.
const HUNG_AFTER: Duration = Duration::from_secs(60);

/// xorshift64*: small, seeded, good enough to pick faults.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A duration uniformly in `lo..hi` milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo))
    }

    /// True with probability `percent`/100.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// What the soak shares between the nemesis and the workers.
struct Rig {
    clock: FakeClock,
    redis: Mutex<RedisServer>,
    store: RedisServer,
    sha: String,
    tap: Tap,
    listener: Listener,
    run_id: String,
    /// lockruns that have not been reaped: the nemesis may pause them. A worker reaps
    /// only while holding this lock, so a pid here is never a reused one.
    live: Mutex<Vec<i32>>,
    runs: Mutex<Vec<Run>>,
    faults: Mutex<Vec<FaultEvent>>,
    stop: AtomicBool,
}

impl Rig {
    fn new() -> Rig {
        let clock = FakeClock::new();
        let redis = RedisServer::with_env(&clock.env());
        let store = RedisServer::start();
        let sha: String = store.query(redis::cmd("SCRIPT").arg("LOAD").arg(STORE_CAS));
        let tap = Tap::start(redis.port());
        Rig {
            clock,
            redis: Mutex::new(redis),
            store,
            sha,
            tap,
            listener: Listener::start(),
            run_id: format!("{}-{}", std::process::id(), boottime().as_nanos()),
            live: Mutex::new(Vec::new()),
            runs: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }
    }

    /// One worker: lockrun after lockrun until told to stop.
    fn worker(&self, mut rng: Rng) {
        while !self.stop.load(Ordering::SeqCst) {
            // Mostly shorter than the TTL; some much longer, so they live on renewals.
            let hold = match rng.below(20) {
                0..=7 => rng.ms(10, 150),
                8..=16 => rng.ms(150, 1200),
                _ => rng.ms(1500, 3500),
            };
            let mut cmd = lockrun_run(
                &self.tap.url(),
                NAME,
                &[
                    "--ttl",
                    "1500ms",
                    "--wait",
                    "20s",
                    "-vv",
                    "--log-format",
                    "json",
                ],
                &["perl", "-e", SECTION],
            );
            cmd.env("SOAK_HARNESS", self.listener.port().to_string())
                .env("SOAK_STORE", self.store.port().to_string())
                .env("SOAK_SHA", &self.sha)
                .env("SOAK_HOLD_MS", hold.as_millis().to_string())
                .env("SOAK_TERM", if rng.chance(25) { "ignore" } else { "obey" })
                .env("SOAK_CHILD", if rng.chance(15) { "1" } else { "" })
                .env("SOAK_RUN", &self.run_id);
            let mut lr = spawn(cmd);
            let pid = lr.pid();
            self.live.lock().unwrap().push(pid);
            let started = Instant::now();
            let (finished, hung) = loop {
                {
                    let mut live = self.live.lock().unwrap();
                    if let Some(f) = lr.try_finish() {
                        live.retain(|&p| p != pid);
                        break (f, false);
                    }
                    if started.elapsed() > HUNG_AFTER {
                        signal_pid(pid, Signal::SIGCONT);
                        signal_pid(pid, Signal::SIGKILL);
                        let f = lr.wait();
                        live.retain(|&p| p != pid);
                        break (f, true);
                    }
                }
                thread::sleep(Duration::from_millis(5));
            };
            self.runs.lock().unwrap().push(Run {
                pid,
                ended: boottime(),
                code: finished.code,
                stderr: finished.stderr,
                hung,
            });
            thread::sleep(rng.ms(0, 300));
        }
    }

    /// The nemesis: faults, one at a time, until `until`.
    fn nemesis(&self, mut rng: Rng, until: Instant) {
        // Weights of the kinds, in `Fault::ALL` order.
        const WEIGHTS: [u64; 10] = [4, 2, 2, 4, 2, 2, 3, 3, 6, 3];
        // Every kind once first, in a seeded order, so that even a short soak sees
        // them all; then a weighted draw.
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

    fn inject(&self, kind: Fault, rng: &mut Rng) -> Option<FaultEvent> {
        let from = boottime();
        let mut pid = None;
        let detail = match kind {
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
            Fault::Blackhole => {
                let d = rng.ms(200, 3000);
                self.tap.set_mode(Mode::Blackhole);
                thread::sleep(d);
                self.tap.set_mode(Mode::Pass);
                format!("{d:?}")
            }
            Fault::Cut => {
                self.tap.set_mode(Mode::Cut);
                self.tap.set_mode(Mode::Pass);
                String::new()
            }
            Fault::Refuse => {
                let d = rng.ms(200, 2000);
                self.tap.set_mode(Mode::Refuse);
                self.tap.cut();
                thread::sleep(d);
                self.tap.set_mode(Mode::Pass);
                format!("{d:?}")
            }
            Fault::Latency => {
                let delay = rng.ms(50, 700);
                let d = rng.ms(1000, 4000);
                self.tap.set_reply_delay(delay);
                thread::sleep(d);
                self.tap.set_reply_delay(Duration::ZERO);
                format!("{delay:?} for {d:?}")
            }
            Fault::StuckRequests => {
                // One acquire attempt stuck (its lockrun gives up on it and cleans up),
                // and every release meanwhile: a flaky path that delivers late.
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
            Fault::PauseLockrun => {
                let d = rng.ms(300, 4000);
                // Mostly the holder (the interesting case), else anyone.
                let holder: Option<i32> = self
                    .redis
                    .lock()
                    .unwrap()
                    .hget(&lock_key(NAME), "pid")
                    .and_then(|p| p.parse().ok());
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
                pid = Some(victim);
                thread::sleep(d);
                // Stopped, it cannot have exited: the pid is still ours.
                signal_pid(victim, Signal::SIGCONT);
                format!("{d:?}")
            }
            Fault::ClockJump => {
                let by = rng.ms(300, 3000);
                let offset = self.clock.jump_forward(by);
                format!("+{by:?} (offset {offset:?})")
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
}

/// Runs the soak for `secs` with `seed`; returns the checker's report plus the failures
/// found at the end (processes left, lock not freed).
fn soak(seed: u64, secs: u64) -> (check::Report, Duration) {
    let rig = Rig::new();
    let mut rng = Rng::new(seed);
    let until = Instant::now() + Duration::from_secs(secs);
    thread::scope(|scope| {
        for w in 0..WORKERS {
            let r = Rng::new(seed.wrapping_add(w + 1).wrapping_mul(0x1000_0000_01B3));
            let rig = &rig;
            scope.spawn(move || rig.worker(r));
        }
        rig.nemesis(rng.clone(), until);
        rig.stop.store(true, Ordering::SeqCst);
    });
    let _ = rng.next();
    let healed = rig
        .faults
        .lock()
        .unwrap()
        .last()
        .map_or(Duration::ZERO, |f| f.to);

    // Check 4, at the end: nothing left running, and the lock freed within a TTL of the
    // last holder's end (or of the last fault's healing, whichever is later: a request
    // held back by a partition may land then).
    let mut end_failures = Vec::new();
    let left = rig.leftovers();
    if !left.is_empty() {
        end_failures.push(format!("processes of the soak still running: {left:?}"));
        for p in &left {
            signal_pid(*p, Signal::SIGKILL);
        }
    }
    let last_end = rig
        .runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.ended)
        .max()
        .unwrap_or_default()
        .max(healed);
    let free_at = {
        let redis = rig.redis.lock().unwrap();
        let start = Instant::now();
        while redis.lock_held(NAME) && start.elapsed() < TTL * 4 {
            thread::sleep(Duration::from_millis(5));
        }
        boottime()
    };
    let freed_after = free_at.saturating_sub(last_end);
    if freed_after > TTL + Duration::from_millis(300) {
        end_failures.push(format!(
            "the lock was still held {freed_after:?} after the last holder ended (TTL {TTL:?})"
        ));
    }
    // Give the listener a moment to see the last connections close.
    let settle = Instant::now();
    while rig.listener.sections().iter().any(|s| s.gone.is_none())
        && settle.elapsed() < Duration::from_secs(5)
    {
        thread::sleep(Duration::from_millis(10));
    }

    let sections = rig.listener.sections();
    let records = rig.tap.records();
    let faults = rig.faults.lock().unwrap().clone();
    let runs = rig.runs.lock().unwrap().clone();
    let store_log: Vec<String> = rig
        .store
        .query(redis::cmd("LRANGE").arg("log").arg(0).arg(-1));
    let history = check::History {
        sections: &sections,
        records: &records,
        faults: &faults,
        runs: &runs,
        store_log: &store_log,
        ttl: TTL,
    };
    let mut report = check::check(&history);
    report.failures.extend(end_failures);
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
    (report, freed_after)
}

/// The whole history as text (all instants in ms of CLOCK_BOOTTIME), for a person
/// looking into a failure.
fn describe(h: &check::History<'_>) -> String {
    use std::fmt::Write as _;
    let ms = |d: Duration| d.as_millis();
    let mut out = String::new();
    let _ = writeln!(out, "# faults: kind from to pid detail");
    for f in h.faults {
        let _ = writeln!(
            out,
            "{} {} {} {:?} {}",
            f.kind.name(),
            ms(f.from),
            ms(f.to),
            f.pid,
            f.detail
        );
    }
    let _ = writeln!(
        out,
        "\n# sections: fence lockrun start until gone writes(t:ok)"
    );
    let mut sections: Vec<_> = h.sections.iter().collect();
    sections.sort_by_key(|s| s.start);
    for s in sections {
        let writes: Vec<String> = s
            .writes
            .iter()
            .map(|(t, ok)| format!("{}:{}", ms(*t), u8::from(*ok)))
            .collect();
        let _ = writeln!(
            out,
            "{} {} {} {} {:?} {}",
            s.fence,
            s.lockrun_pid,
            ms(s.start),
            ms(s.until()),
            s.gone.map(ms),
            writes.join(",")
        );
    }
    let _ = writeln!(out, "\n# tap: call token sent replied delivered reply");
    for r in h.records {
        let _ = writeln!(
            out,
            "{:?} {} {} {:?} {} {:?}",
            r.call,
            r.token,
            ms(r.sent),
            r.replied.map(ms),
            r.delivered,
            r.reply
        );
    }
    let _ = writeln!(out, "\n# runs: pid ended code, then the log");
    for r in h.runs {
        let _ = writeln!(
            out,
            "## {} {} {:?}\n{}",
            r.pid,
            ms(r.ended),
            r.code,
            r.stderr
        );
    }
    out
}

#[test]
fn nemesis_soak_keeps_the_safety_properties() {
    let seed = env_u64("LOCKRUN_SOAK_SEED", DEFAULT_SEED);
    let secs = env_u64("LOCKRUN_SOAK_SECS", DEFAULT_SECS);
    let replay = format!(
        "replay: LOCKRUN_SOAK_SEED={seed} LOCKRUN_SOAK_SECS={secs} cargo test --test soak -- \
         --nocapture nemesis_soak"
    );
    eprintln!("soak: seed={seed} secs={secs} ({replay})");
    let (report, freed_after) = soak(seed, secs);
    eprintln!(
        "soak: seed={seed} secs={secs} {} | lock free {} ms after the last holder ended",
        report.summary(),
        freed_after.as_millis()
    );
    if !report.failures.is_empty() {
        let shown: Vec<&String> = report.failures.iter().take(15).collect();
        panic!(
            "the soak found {} violation(s) (seed {seed}; {replay}):\n- {}",
            report.failures.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n- ")
        );
    }
    assert!(
        report.sections as u64 >= secs / 3,
        "only {} critical sections ran: the soak proved little",
        report.sections
    );
}

/// Regression (seen while building the soak, then found by it: the default run,
/// `LOCKRUN_SOAK_SEED=20250301 LOCKRUN_SOAK_SECS=75`, at the end of a `stuck-requests`
/// fault): an acquire attempt that times out is abandoned with a release of the lock
/// token, and the next attempt reuses that token. If the abandoned attempt's release is
/// held up in the network and lands after the next attempt took the lock, it matches the
/// token and frees the lock while the command runs: a newcomer then runs beside it.
#[test]
fn a_late_release_from_an_abandoned_attempt_leaves_the_next_attempts_lock_alone() {
    let redis = RedisServer::start();
    let tap = Tap::start(redis.port());
    let s = Scratch::new();
    let reaper = Reaper::default();
    // The first acquire never gets through; the clean-up's release is held back.
    tap.hold_next(Call::Acquire, 1);
    tap.hold_next(Call::Release, 1);
    let mut cmd = lockrun_run(
        &tap.url(),
        "job",
        &["--ttl", "3s", "--wait", "20s", "-v"],
        &sh(r#"echo $$ > "$PIDFILE"; while [ ! -e "$GO" ]; do sleep 0.02; done"#),
    );
    cmd.env("PIDFILE", s.path("pid")).env("GO", s.path("go"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    reaper.add(pid);
    assert_eq!(
        tap.held(Call::Release),
        1,
        "the abandoned attempt sent no release to hold back"
    );

    // The stuck packets move on: the first acquire is lost, the release arrives late.
    tap.release_held(Call::Acquire, false);
    tap.release_held(Call::Release, true);
    wait_until("the late release reached the server", WAIT, || {
        tap.records()
            .iter()
            .any(|r| r.call == Call::Release && r.reply.is_some())
    });
    let held = redis.lock_held("job");
    let newcomer = run(lockrun_run(&redis.url(), "job", &[], &["true"]));
    let alive = is_alive(pid);
    s.touch("go");
    let f = lr.wait();
    assert!(
        held && newcomer.code == Some(75),
        "a release delayed from an abandoned acquire attempt freed the lock of the next \
         attempt (same lock token) while its command ran (still running: {alive}); a \
         newcomer then exited {:?}.\nlockrun's log:\n{}",
        newcomer.code,
        f.stderr
    );
    f.assert_code(0);
}

// ---------------------------------------------------------------------------------------
// The checker catches what it must: synthetic histories with one violation each.
// ---------------------------------------------------------------------------------------

fn at(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A successful acquire of `fence` by lock token `token`, sent at `sent` ms.
fn acquired(token: &str, fence: u64, sent: u64) -> tap::Record {
    tap::Record {
        call: Call::Acquire,
        token: token.into(),
        sent: at(sent),
        replied: Some(at(sent + 1)),
        reply: Some(tap::Resp::Array(vec![
            tap::Resp::Int(1),
            tap::Resp::Text(fence.to_string()),
        ])),
        delivered: true,
    }
}

/// A section of `fence` run by lockrun `pid` from `start` to `end` ms, writing once.
fn section(fence: u64, pid: i32, start: u64, end: u64) -> history::Section {
    history::Section {
        fence,
        lockrun_pid: pid,
        pids: vec![pid + 1000],
        start: at(start),
        last_seen: at(end),
        end: Some(at(end)),
        gone: Some(at(end + 1)),
        writes: vec![(at(start), true)],
        garbage: Vec::new(),
    }
}

/// A lockrun `pid` that acquired `fence` and exited `code` at `ended` ms.
fn lockrun_run_of(pid: i32, fence: u64, code: i32, ended: u64) -> Run {
    let mut stderr = format!(
        r#"{{"ts":"t","level":"info","event":"acquired","lock":"soak","fencing_token":{fence}}}"#
    );
    if code == 124 {
        stderr
            .push_str("\n{\"ts\":\"t\",\"level\":\"error\",\"event\":\"lost\",\"lock\":\"soak\"}");
    }
    Run {
        pid,
        ended: at(ended),
        code: Some(code),
        stderr,
        hung: false,
    }
}

fn check_of(
    records: &[tap::Record],
    sections: &[history::Section],
    runs: &[Run],
    faults: &[FaultEvent],
    store_log: &[String],
) -> check::Report {
    check::check(&check::History {
        sections,
        records,
        faults,
        runs,
        store_log,
        ttl: TTL,
    })
}

fn fault(kind: Fault, from: u64, to: u64, pid: Option<i32>) -> FaultEvent {
    FaultEvent {
        kind,
        from: at(from),
        to: at(to),
        pid,
        detail: String::new(),
    }
}

#[test]
fn checker_passes_a_clean_history() {
    let r = check_of(
        &[acquired("a", 100, 1000), acquired("b", 200, 2000)],
        &[section(100, 11, 1002, 1500), section(200, 12, 2002, 2500)],
        &[
            lockrun_run_of(11, 100, 0, 1510),
            lockrun_run_of(12, 200, 0, 2510),
        ],
        &[],
        &["1 100".into(), "1 200".into()],
    );
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.sections, 2);
}

#[test]
fn checker_flags_an_overlap_that_no_fault_explains() {
    let records = [acquired("a", 100, 1000), acquired("b", 200, 1500)];
    let sections = [section(100, 11, 1002, 2000), section(200, 12, 1502, 2500)];
    let runs = [
        lockrun_run_of(11, 100, 0, 2010),
        lockrun_run_of(12, 200, 0, 2510),
    ];
    let log = ["1 100".to_string(), "1 200".into(), "0 100".into()];
    let r = check_of(&records, &sections, &runs, &[], &log);
    assert!(
        r.failures.iter().any(|f| f.contains("overlapped")),
        "{:?}",
        r.failures
    );
    // A freeze does not explain it either; a FLUSHALL during the first holder's lease
    // does, and the stale write is counted.
    let freeze = [fault(Fault::FreezeRedis, 1200, 1300, None)];
    let r = check_of(&records, &sections, &runs, &freeze, &log);
    assert!(r.failures.iter().any(|f| f.contains("overlapped")));
    let flush = [fault(Fault::Flushall, 1200, 1200, None)];
    let r = check_of(&records, &sections, &runs, &flush, &log);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.overlaps.get("flushall"), Some(&1));
    assert_eq!(r.stale_rejected, 1);
    // A pause explains it only if it is the stale holder's lockrun that was paused.
    let other = [fault(Fault::PauseLockrun, 1100, 1600, Some(12))];
    let r = check_of(&records, &sections, &runs, &other, &log);
    assert!(r.failures.iter().any(|f| f.contains("overlapped")));
    let own = [fault(Fault::PauseLockrun, 1100, 1600, Some(11))];
    let r = check_of(&records, &sections, &runs, &own, &log);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
}

#[test]
fn checker_flags_a_command_running_past_the_deadline_lockrun_could_know() {
    // Acquired at 1000 ms, never renewed: the deadline is 1000 + TTL.
    let late = 1000 + TTL.as_millis() as u64 + 20;
    let r = check_of(
        &[acquired("a", 100, 1000)],
        &[section(100, 11, 1002, late)],
        &[lockrun_run_of(11, 100, 124, late + 10)],
        &[],
        &["1 100".into()],
    );
    assert!(
        r.failures.iter().any(|f| f.contains("still running")),
        "{:?}",
        r.failures
    );
    // A renewal sent at 1500 ms that came back moves the deadline past it.
    let mut renewal = acquired("a", 0, 1500);
    renewal.call = Call::Renew;
    renewal.reply = Some(tap::Resp::Int(1));
    let r = check_of(
        &[acquired("a", 100, 1000), renewal.clone()],
        &[section(100, 11, 1002, late)],
        &[lockrun_run_of(11, 100, 124, late + 10)],
        &[],
        &["1 100".into()],
    );
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    // Unless its answer never reached lockrun.
    renewal.delivered = false;
    let r = check_of(
        &[acquired("a", 100, 1000), renewal],
        &[section(100, 11, 1002, late)],
        &[lockrun_run_of(11, 100, 124, late + 10)],
        &[],
        &["1 100".into()],
    );
    assert!(r.failures.iter().any(|f| f.contains("still running")));
}

#[test]
fn checker_flags_fencing_tokens_that_go_backwards() {
    let r = check_of(
        &[acquired("a", 200, 1000), acquired("b", 100, 2000)],
        &[section(200, 11, 1002, 1500), section(100, 12, 2002, 2500)],
        &[
            lockrun_run_of(11, 200, 0, 1510),
            lockrun_run_of(12, 100, 0, 2510),
        ],
        &[],
        &["1 200".into(), "0 100".into()],
    );
    assert!(
        r.failures.iter().any(|f| f.contains("went backwards")),
        "{:?}",
        r.failures
    );
    assert!(
        r.failures
            .iter()
            .any(|f| f.contains("later holder got a smaller token")),
        "{:?}",
        r.failures
    );
}

#[test]
fn checker_flags_statuses_spec_does_not_allow_and_unexplained_ones() {
    let mut killed = lockrun_run_of(11, 100, 0, 1510);
    killed.code = Some(137);
    let mut silent = lockrun_run_of(12, 200, 0, 2510);
    silent.code = Some(124); // no "lost" line
    silent.stderr = silent.stderr.lines().next().unwrap().to_string();
    let r = check_of(
        &[acquired("a", 100, 1000), acquired("b", 200, 2000)],
        &[section(100, 11, 1002, 1500), section(200, 12, 2002, 2500)],
        &[killed, silent],
        &[],
        &[],
    );
    assert!(
        r.failures.iter().any(|f| f.contains("137")),
        "{:?}",
        r.failures
    );
    assert!(
        r.failures
            .iter()
            .any(|f| f.contains("without a \"lost\" line")),
        "{:?}",
        r.failures
    );
}

#[test]
fn tap_parses_resp2_and_resp3_frames() {
    use tap::{parse, Resp};
    assert_eq!(parse(b":1\r\n"), Some((Resp::Int(1), false, 4)));
    assert_eq!(parse(b"$3\r\nab"), None, "incomplete bulk string");
    let (v, push, len) = parse(b"*2\r\n:1\r\n$4\r\n1234\r\n+extra").unwrap();
    assert_eq!(
        v,
        Resp::Array(vec![Resp::Int(1), Resp::Text("1234".into())])
    );
    assert!(!push);
    assert_eq!(len, 18);
    let (v, push, _) = parse(b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$8\r\nreleased\r\n").unwrap();
    assert!(push);
    assert_eq!(
        v,
        Resp::Array(vec![
            Resp::Text("message".into()),
            Resp::Text("ch".into()),
            Resp::Text("released".into())
        ])
    );
    let (v, _, _) = parse(b"%1\r\n+server\r\n+redis\r\n").unwrap();
    assert_eq!(
        v,
        Resp::Array(vec![
            Resp::Text("server".into()),
            Resp::Text("redis".into())
        ])
    );
    assert_eq!(parse(b"_\r\n").map(|x| x.0), Some(Resp::Null));
}
