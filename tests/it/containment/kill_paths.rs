//! lockrun killed from outside, every job shape at once (each its own lockrun and lock
//! name), on `file://` and on Redis: a next holder waits on each lock before the kill;
//! after it, every process of the job is dead within [`CONTAINED_WITHIN`] of the
//! instant the test saw lockrun (or its guard) dead, and the next holder's command
//! finds none of them alive as it starts. On `file://` the lock stays taken until the
//! job is dead (so the next holder cannot start beside it); on Redis it stays until its
//! TTL, and the job dies long before anyway.
//!
//! The kill paths: SIGKILL; `timeout -s KILL`; the init of a PID namespace (lockrun,
//! `unshare --pid --fork`) SIGKILLed; the OOM killer (a memory cgroup of the test's,
//! see [`MemCg`]); the guard SIGKILLed instead of lockrun (lockrun then stops the job,
//! exits 124 saying why, and releases the lock at once: `--ttl 30s`, and the next holder
//! runs within seconds).

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::each_shape;
use crate::support::*;

/// How lockrun is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    /// SIGKILL from the test.
    Sigkill,
    /// `timeout -s KILL 60 lockrun ...`, its time run out (SIGALRM, the very signal
    /// its own timer sends it, so that the test does not race the job's start).
    Timeout,
    /// `unshare --pid --fork --mount-proc lockrun ...`, lockrun (PID 1 in there)
    /// SIGKILLed from outside.
    PidNamespaceInit,
    /// The OOM killer of a memory cgroup lockrun was moved into.
    Oom,
    /// SIGKILL of lockrun's guard, not of lockrun.
    Guard,
}

/// Which lock a case runs on.
#[derive(Clone, Copy, Debug)]
pub(super) enum On {
    File,
    Redis,
}

impl On {
    pub(super) fn backend(self) -> Backend {
        match self {
            On::File => Backend::new(FileService::start()),
            On::Redis => Backend::new(RedisServer::start()),
        }
    }
}

/// Runs `kill` against every job shape on the lock of `on`, and prints the figures.
fn kill_every_shape(kill: Kill, on: On) {
    let b = on.backend();
    let figures = each_shape(&Shape::EVERY, |shape, i| {
        case(&b, kill, on, shape, &format!("job{i}"))
    });
    eprintln!("{kill:?} on {on:?}: {}", figures.join("; "));
}

/// One case: lockrun on `name` with a job of `shape`, killed by `kill`; returns its
/// figures.
fn case(b: &Backend, kill: Kill, on: On, shape: Shape, name: &str) -> String {
    let what = format!("{kill:?} on {on:?}, {}", shape.name());
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(shape, &s, "job");
    // Killing the guard must release the lock at once, not at the end of the lease.
    let ttl = if kill == Kill::Guard { "30s" } else { "2s" };
    let mut opts = vec!["--ttl", ttl];
    if kill == Kill::Guard && matches!(on, On::Redis) {
        opts.extend(["--log-format", "json"]);
    }
    let mut cmd = b.run(name, &opts, &job.command());
    job.env(&mut cmd);
    let cmd = match kill {
        Kill::Timeout => wrapped(&["timeout", "-s", "KILL", "60"], &cmd),
        Kill::PidNamespaceInit => wrapped(&["unshare", "--pid", "--fork", "--mount-proc"], &cmd),
        Kill::Sigkill | Kill::Oom | Kill::Guard => cmd,
    };
    let mut outer = spawn(cmd);
    let lockrun_pid = match kill {
        Kill::Timeout | Kill::PidNamespaceInit => only_child(outer.pid()),
        Kill::Sigkill | Kill::Oom | Kill::Guard => outer.pid(),
    };
    reaper.add(lockrun_pid);
    let start = Instant::now();
    while job.recorded().len() < job.processes() {
        if start.elapsed() > WAIT || !outer.is_running() {
            panic!(
                "{what}: {} of the job's {} processes recorded their pids (lockrun ended: \
                 {}); stderr so far:\n{}",
                job.recorded().len(),
                job.processes(),
                !outer.is_running(),
                outer.stderr_so_far()
            );
        }
        std::thread::sleep(POLL);
    }
    let mut pids = job.recorded();
    if kill == Kill::PidNamespaceInit {
        let host = pids_in_namespace_of(lockrun_pid);
        let inner = pids;
        pids = Vec::new();
        for p in inner {
            match host.get(&p) {
                Some(&h) => pids.push(h),
                None => died_early(&what, p, &mut outer),
            }
        }
    }
    let procs = procs_of(&pids).unwrap_or_else(|pid| died_early(&what, pid, &mut outer));
    // (Read from outside a PID namespace too: /proc/PID/cgroup is relative to the
    // reader's cgroup namespace.)
    let cgroup = job_cgroup_of(procs[0].pid);
    procs.iter().for_each(|p| reaper.add(p.pid));
    let guard = match kill {
        Kill::Guard => Some(wait_guard(lockrun_pid)),
        _ => guard_of(lockrun_pid),
    };
    guard.iter().for_each(|&g| reaper.add(g));

    let next = b.run(name, &["--wait", "30s"], &next_holder_command());
    let mut next = NextHolder::spawn(next, &s, "next", &procs);
    let mut memcg = None;
    match kill {
        Kill::Sigkill | Kill::PidNamespaceInit => signal_pid(lockrun_pid, Signal::SIGKILL),
        Kill::Timeout => signal_pid(outer.pid(), Signal::SIGALRM),
        Kill::Oom => memcg = Some(MemCg::oom_kill(lockrun_pid, &what)),
        Kill::Guard => signal_pid(guard.unwrap(), Signal::SIGKILL),
    }
    // The instant the test saw the process whose death must take the job down dead.
    let watched = if kill == Kill::Guard {
        guard.unwrap()
    } else {
        lockrun_pid
    };
    wait_until(&format!("{what}: process {watched} died"), WAIT, || {
        is_dead(watched)
    });
    let dead = Instant::now();
    let deaths = watch_deaths(&procs, dead, WAIT);
    let seen = next.assert_no_survivors(&what);
    deaths.assert_within(CONTAINED_WITHIN, &what);
    let ran_after = seen - dead;

    match kill {
        Kill::Guard => {
            assert_guard_lost(&outer.wait(), &what);
            // Released by lockrun once the job was dead: the next holder did not sit out
            // the 30 s lease.
            assert!(
                ran_after < Duration::from_secs(5),
                "{what}: the next holder ran {ran_after:?} after the guard died: the lock was \
                 not released"
            );
        }
        Kill::Oom => {
            let f = outer.wait();
            assert_eq!(
                f.status.signal(),
                Some(9),
                "{what}: lockrun was not OOM-killed: {:?}\n{}",
                f.status,
                f.stderr
            );
            memcg.unwrap().assert_oom_killed(&what);
        }
        Kill::Sigkill | Kill::Timeout | Kill::PidNamespaceInit => {
            outer.wait();
        }
    }
    if let (On::File, false) = (on, kill == Kill::Guard) {
        // The guard lets the lock go as soon as the job is dead.
        assert!(
            ran_after < Duration::from_secs(5),
            "{what}: the next holder ran only {ran_after:?} after lockrun died"
        );
    }
    if let Some(g) = guard.filter(|_| kill != Kill::Guard) {
        wait_until(&format!("{what}: the guard {g} exited"), WAIT, || {
            is_dead(g)
        });
    }
    if let Some(dir) = cgroup.as_ref().filter(|_| kill == Kill::PidNamespaceInit) {
        // What a later lockrun would sweep once it is old: the test's own clean-up, so
        // that runs of the suite do not pile empty cgroups up on the machine.
        wait_until_quietly(|| fs::remove_dir(dir).is_ok() || !dir.exists());
    }
    if let Some(dir) = cgroup.filter(|_| kill != Kill::PidNamespaceInit) {
        // Nothing left behind: the job's cgroup goes with it. (Not when the namespace's
        // init dies: the kernel kills the guard with the rest, and the next lockrun of
        // that name removes the empty cgroup.)
        wait_until(
            &format!("{what}: the job's cgroup {} was removed", dir.display()),
            WAIT,
            || !dir.exists(),
        );
    }
    format!(
        "{}: last process dead {:?} after, next holder ran {ran_after:?} after",
        shape.name(),
        deaths.last
    )
}

/// Panics: process `pid` of the job died before the test killed anything (lockrun may
/// have stopped the job; its stderr tells).
fn died_early(what: &str, pid: i32, lockrun: &mut Running) -> ! {
    panic!(
        "{what}: process {pid} of the job died before the test killed anything; stderr so \
         far:\n{}",
        lockrun.stderr_so_far()
    )
}

/// Panics unless lockrun exited 124 saying why in one line: in JSON, one `guard_lost`
/// line, the only one at level error (the `killing` line before it may name the reason
/// too, as it does for a lost lock); in text, its last line names the guard.
fn assert_guard_lost(f: &Finished, what: &str) {
    f.assert_code(124);
    let err = &f.stderr;
    if err.starts_with('{') {
        let lines: Vec<serde_json::Value> = err
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        let lost: Vec<_> = lines
            .iter()
            .filter(|v| v["event"] == "guard_lost")
            .collect();
        assert_eq!(lost.len(), 1, "{what}: one guard_lost line:\n{err}");
        let errors: Vec<_> = lines.iter().filter(|v| v["level"] == "error").collect();
        assert_eq!(
            errors, lost,
            "{what}: the one error line is guard_lost:\n{err}"
        );
    } else {
        f.assert_explained();
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("lockrun: ") && last.contains("guard"),
            "{what}: the last line says the guard died:\n{err}"
        );
    }
}

/// A memory cgroup (v1, the only memory controller this machine has) of the test's
/// own, under the test's own memory cgroup, that lockrun alone is moved into, where
/// hogs then make the kernel's OOM killer pick lockrun. The killer takes the task of the
/// highest score, its RSS plus `oom_score_adj` times a thousandth of the limit in pages:
/// lockrun's `oom_score_adj` of 1000 is worth almost the whole limit, so each hog is
/// kept to a quarter of it (eight of them together go past it). One hog as large as
/// the limit would score about as much as lockrun, whose RSS is small once it gives
/// its code pages back, and the killer's choice would be a coin toss. (A hog's own
/// score can only be raised: lowering it needs CAP_SYS_RESOURCE, which the tests may
/// not have.) Processes forked before the move (the guard, the job) stay where they
/// were, so the OOM killer reaches lockrun alone; hogs die of it next.
struct MemCg {
    dir: PathBuf,
    hog: Option<Running>,
}

/// A number for each cgroup made by this test binary.
static MEMCGS: AtomicU32 = AtomicU32::new(0);

impl MemCg {
    /// Moves `lockrun` into a new memory cgroup and fills it until the OOM killer acts.
    fn oom_kill(lockrun: i32, what: &str) -> MemCg {
        let own = fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
        let own = own
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
            .unwrap_or_else(|| panic!("{what}: the test runs in no memory cgroup (v1)"));
        let n = MEMCGS.fetch_add(1, Ordering::SeqCst);
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/memory{}/lockrun-test-oom-{}-{n}",
            own.trim_end_matches('/'),
            std::process::id()
        ));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("{what}: mkdir {}: {e}", dir.display()));
        let mut cg = MemCg { dir, hog: None };
        cg.write("memory.limit_in_bytes", &(32u64 << 20).to_string());
        fs::write(format!("/proc/{lockrun}/oom_score_adj"), "1000").expect("oom_score_adj");
        cg.write("cgroup.procs", &lockrun.to_string());
        // Eight hogs of 8 MiB each (perl holds the 4 MiB string twice): twice the limit
        // in all, a quarter of it each.
        let mut hog = Command::new("sh");
        hog.arg("-c")
            .arg(
                r#"echo $$ > "$CG/cgroup.procs"
                for i in 1 2 3 4 5 6 7 8; do perl -e '$x = "x" x (4 << 20); sleep 60' & done
                wait"#,
            )
            .env("CG", &cg.dir);
        cg.hog = Some(spawn(hog));
        cg
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        fs::write(&path, value).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Panics unless the OOM killer acted in this cgroup.
    fn assert_oom_killed(&self, what: &str) {
        let control = fs::read_to_string(self.dir.join("memory.oom_control")).unwrap();
        let kills: u64 = control
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        assert!(kills >= 1, "{what}: no OOM kill in the cgroup:\n{control}");
    }
}

impl Drop for MemCg {
    fn drop(&mut self) {
        drop(self.hog.take());
        let procs = self.dir.join("cgroup.procs");
        let _ = wait_until_quietly(|| {
            let text = fs::read_to_string(&procs).unwrap_or_default();
            text.lines()
                .filter_map(|p| p.parse().ok())
                .for_each(|p| signal_pid(p, Signal::SIGKILL));
            text.trim().is_empty()
        });
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Polls `cond` for up to `WAIT` without panicking (for clean-ups); true if it held.
fn wait_until_quietly(mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < WAIT {
        if cond() {
            return true;
        }
        std::thread::sleep(POLL);
    }
    false
}

/// The tests of one kill path: on `file://` and on Redis.
macro_rules! kill_path {
    ($name:ident, $kill:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn on_file() {
                kill_every_shape($kill, On::File);
            }

            #[test]
            fn on_redis() {
                kill_every_shape($kill, On::Redis);
            }
        }
    };
}

kill_path!(lockrun_sigkilled, Kill::Sigkill);
kill_path!(lockrun_killed_by_timeout, Kill::Timeout);
kill_path!(pid_namespace_init_killed, Kill::PidNamespaceInit);
kill_path!(lockrun_oom_killed, Kill::Oom);
kill_path!(guard_killed, Kill::Guard);
