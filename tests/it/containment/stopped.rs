//! Stopped processes (issue 39; property 10's "whichever of lockrun and its guard is
//! stopped first"), each on `file://` and on Redis, each with a job of every shape at
//! once ([`Shape::All`]: a background child, `setsid`, GNU `timeout`, a double fork, a
//! TERM-ignoring child) and a next holder already waiting on the lock, whose command
//! records which processes of the job are alive as it starts (none may be):
//!
//! - **the guard stopped, then lockrun SIGKILLed**, with lockrun's parent a child
//!   subreaper in the same session (a shell made a subreaper; the init shell of a PID
//!   namespace), where the kernel's orphaned-process-group rule continues nothing.
//!   lockrun is stopped first, so that it cannot continue its guard itself, then the
//!   guard, then lockrun is SIGKILLed: the guard's parent-death signal (SIGCONT)
//!   continues it, the job is dead within [`CONTAINED_WITHIN`] and the `file://` lock
//!   free at once;
//! - **lockrun stopped, then its guard SIGKILLed**: the command dies of its parent-death
//!   signal and the rest of the job is re-parented to the stopped lockrun, which the
//!   kernel continues at the lease deadline (lockrun's alarm): it kills the job before
//!   the lease can expire and exits 124 by itself, letting go of the `file://` lock;
//!   also unprivileged on `file://`, where the process tree alone holds the job;
//! - **the job stops its guard** (`kill -STOP $PPID`: the guard is the command's
//!   parent): lockrun continues it at once and says so (`guard_stopped`), and a SIGKILL
//!   of lockrun later still takes the job down, under a subreaper parent too;
//! - **the job keeps stopping its guard**, and **a tracer holds the guard stopped** (a
//!   debugger's attach, which SIGCONT does not undo): lockrun stops the job and the
//!   guard (124, one `guard_stopped` line at level error) and releases the lock at once;
//!   a tracer that does not stop the guard is reported once (`guard_traced`).
//!
//! On the code before issue 39 each of them fails: the job outlives lockrun beside the
//! next holder (Redis), or the next holder never gets the lock (`file://`), or lockrun
//! never ends.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use super::boundary::{as_nobody, give_to_nobody};
use super::kill_paths::On;
use crate::support::*;

/// The lease of the runs whose lease must bound the job.
const TTL: Duration = Duration::from_secs(2);

/// What lockrun runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parent {
    /// The test itself.
    Test,
    /// A shell made a child subreaper, in the test's session, that stays once lockrun
    /// is gone (as tini, a container's long-lived PID 1 shell or a CI agent would).
    Subreaper,
    /// The init shell of a PID namespace (`unshare --pid --fork --mount-proc sh`).
    NamespaceInit,
    /// The test, with lockrun run as `nobody` (no cgroup: the process tree alone).
    Nobody,
}

/// The shell of [`Parent::Subreaper`] and [`Parent::NamespaceInit`]: runs lockrun, and
/// stays (as the same process, a subreaper still) once lockrun is gone.
const STAY: &str = r#""$@" & wait; exec sleep 60"#;

/// lockrun's command line `cmd`, run under `parent`.
#[allow(unsafe_code)]
fn under(parent: Parent, cmd: Command) -> Command {
    match parent {
        Parent::Test => cmd,
        Parent::Nobody => as_nobody(&cmd),
        Parent::Subreaper => {
            let mut c = wrapped(&["sh", "-c", STAY, "sh"], &cmd);
            // SAFETY: between fork and exec only prctl(2) is called, which is
            // async-signal-safe; nothing is allocated or locked.
            unsafe {
                c.pre_exec(|| {
                    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)
                });
            }
            c
        }
        Parent::NamespaceInit => wrapped(
            &[
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "sh",
                "-c",
                STAY,
                "sh",
            ],
            &cmd,
        ),
    }
}

/// A run on `b` of `job` under `parent`, started, with every process of its job running.
struct Run {
    outer: Running,
    lockrun: i32,
    guard: i32,
    procs: Vec<Proc>,
}

impl Run {
    /// The job's `$GO` is `go` in `s`.
    fn start(b: &Backend, s: &Scratch, job: &Job, opts: &[&str], parent: Parent) -> Run {
        let what = format!("{parent:?}");
        let mut cmd = b.run("job", opts, &job.command());
        job.env(&mut cmd);
        cmd.env("GO", s.path("go"));
        let mut outer = spawn(under(parent, cmd));
        let lockrun = match parent {
            Parent::Test | Parent::Nobody => outer.pid(),
            Parent::Subreaper => only_child(outer.pid()),
            Parent::NamespaceInit => only_child(only_child(outer.pid())),
        };
        let start = Instant::now();
        while job.recorded().len() < job.processes() {
            assert!(
                start.elapsed() < WAIT && outer.is_running(),
                "{what}: {} of the job's {} processes recorded their pids; stderr so far:\n{}",
                job.recorded().len(),
                job.processes(),
                outer.stderr_so_far()
            );
            thread::sleep(POLL);
        }
        let mut pids = job.recorded();
        if parent == Parent::NamespaceInit {
            let host = pids_in_namespace_of(lockrun);
            pids = pids.iter().filter_map(|p| host.get(p).copied()).collect();
        }
        let procs = procs_of(&pids)
            .ok()
            .filter(|p| p.len() == job.processes())
            .unwrap_or_else(|| {
                panic!(
                    "{what}: a process of the job died before the test did anything; stderr \
                     so far:\n{}",
                    outer.stderr_so_far()
                )
            });
        let guard = wait_guard(lockrun);
        Run {
            outer,
            lockrun,
            guard,
            procs,
        }
    }

    /// Registers every process of the run with `reaper`.
    fn reap_with(&self, reaper: &Reaper) {
        reaper.add(self.lockrun);
        reaper.add(self.guard);
        self.procs.iter().for_each(|p| reaper.add(p.pid));
    }
}

/// Stops `pid` and waits until it is stopped.
fn stop(pid: i32, what: &str) {
    signal_pid(pid, Signal::SIGSTOP);
    wait_until(&format!("{what}: process {pid} stopped"), WAIT, || {
        proc_state(pid) == Some('T')
    });
}

/// The next holder of the run's lock, waiting on it.
fn next_holder(b: &Backend, s: &Scratch, run: &Run) -> NextHolder {
    let cmd = b.run("job", &["--wait", "30s"], &next_holder_command());
    NextHolder::spawn(cmd, s, "next", &run.procs)
}

/// The same, as `nobody` (a lock directory of nobody's is refused to root).
fn next_holder_as_nobody(b: &Backend, s: &Scratch, run: &Run) -> NextHolder {
    let cmd = b.run("job", &["--wait", "30s"], &next_holder_command());
    NextHolder::spawn(as_nobody(&cmd), s, "next", &run.procs)
}

/// The guard stopped, then lockrun SIGKILLed, under `parent`.
fn guard_stopped_then_lockrun_killed(parent: Parent, on: On) {
    let what = format!("guard stopped then lockrun killed, under {parent:?}, on {on:?}");
    let b = on.backend();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let run = Run::start(&b, &s, &job, &["--ttl", "2s"], parent);
    run.reap_with(&reaper);
    let mut next = next_holder(&b, &s, &run);

    stop(run.lockrun, &what);
    stop(run.guard, &what);
    signal_pid(run.lockrun, Signal::SIGKILL);
    wait_until(&format!("{what}: lockrun died"), WAIT, || {
        is_dead(run.lockrun)
    });
    let dead = Instant::now();
    let deaths = watch_deaths(&run.procs, dead, WAIT);
    let seen = next.assert_no_survivors(&what);
    deaths.assert_within(CONTAINED_WITHIN, &what);
    let ran_after = seen - dead;
    if let On::File = on {
        assert!(
            ran_after < Duration::from_secs(5),
            "{what}: the next holder ran only {ran_after:?} after lockrun died"
        );
    }
    wait_until(&format!("{what}: the guard exited"), WAIT, || {
        is_dead(run.guard)
    });
    drop(run.outer);
    eprintln!(
        "{what}: last process dead {:?} after, next holder ran {ran_after:?} after",
        deaths.last
    );
}

/// lockrun stopped, then its guard SIGKILLed; lockrun run by `parent` (the test, or
/// the test as `nobody`).
fn lockrun_stopped_then_guard_killed(on: On, parent: Parent) {
    let what = format!("lockrun stopped then its guard killed, {parent:?}, on {on:?}");
    let (b, s) = match (on, parent) {
        (On::File, Parent::Nobody) => {
            let files = FileService::start();
            give_to_nobody(files.root());
            let s = Scratch::new();
            give_to_nobody(&s.path(""));
            (Backend::new(files), s)
        }
        _ => (on.backend(), Scratch::new()),
    };
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let mut run = Run::start(&b, &s, &job, &["--ttl", "2s"], parent);
    run.reap_with(&reaper);
    let mut next = match parent {
        Parent::Nobody => next_holder_as_nobody(&b, &s, &run),
        _ => next_holder(&b, &s, &run),
    };

    // Every renewal lockrun sent went out before this instant, so the lease deadline it
    // knows is at most a TTL later.
    let stopped = Instant::now();
    stop(run.lockrun, &what);
    signal_pid(run.guard, Signal::SIGKILL);
    let deaths = watch_deaths(&run.procs, stopped, WAIT);
    // Not continued by the test: the kernel does it at the deadline.
    let f = run.outer.wait_for(WAIT);
    let seen = next.assert_no_survivors(&what);
    deaths.assert_within(TTL + Duration::from_millis(500), &what);
    f.assert_failure(124);
    let ran_after = seen - stopped;
    if let On::File = on {
        assert!(
            ran_after < TTL + Duration::from_secs(3),
            "{what}: the next holder ran only {ran_after:?} after the stop"
        );
    }
    eprintln!(
        "{what}: last process dead {:?} after the stop, next holder ran {ran_after:?} after",
        deaths.last
    );
}

/// The job stops its guard once, lockrun continues it and says so; lockrun SIGKILLed
/// afterwards still takes the job down (under a subreaper parent, where the kernel would
/// not continue a guard left stopped).
fn the_job_stops_its_guard(on: On) {
    let what = format!("the job stops its guard once, on {on:?}");
    let b = on.backend();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::ending(
        Shape::All,
        &s,
        "job",
        &gated("kill -STOP $PPID; exec sleep 60"),
    );
    let opts = ["--ttl", "2s", "--log-format", "json"];
    let mut run = Run::start(&b, &s, &job, &opts, Parent::Subreaper);
    run.reap_with(&reaper);
    let mut next = next_holder(&b, &s, &run);

    s.touch("go");
    wait_until(
        &format!("{what}: lockrun said it continued its guard"),
        WAIT,
        || {
            run.outer
                .stderr_so_far()
                .contains(r#""event":"guard_stopped""#)
        },
    );
    let warned = run.outer.stderr_so_far();
    assert!(
        warned.contains(r#""level":"warn""#) && !warned.contains(r#""level":"error""#),
        "{what}: one warning, no error:\n{warned}"
    );
    wait_until(&format!("{what}: the guard runs again"), WAIT, || {
        proc_state(run.guard) != Some('T')
    });
    signal_pid(run.lockrun, Signal::SIGKILL);
    wait_until(&format!("{what}: lockrun died"), WAIT, || {
        is_dead(run.lockrun)
    });
    let dead = Instant::now();
    let deaths = watch_deaths(&run.procs, dead, WAIT);
    next.assert_no_survivors(&what);
    deaths.assert_within(CONTAINED_WITHIN, &what);
}

/// The job stops its guard again and again: lockrun stops the job, exits 124 saying
/// why, and releases the lock at once (a TTL of 30 s is not waited out).
fn the_job_keeps_stopping_its_guard(on: On) {
    let what = format!("the job keeps stopping its guard, on {on:?}");
    let b = on.backend();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let restop = gated("while kill -STOP $PPID; do sleep 0.2; done; exec sleep 60");
    let job = Job::ending(Shape::All, &s, "job", &restop);
    let opts = ["--ttl", "30s", "--log-format", "json"];
    let mut run = Run::start(&b, &s, &job, &opts, Parent::Test);
    run.reap_with(&reaper);
    let mut next = next_holder(&b, &s, &run);

    let go = Instant::now();
    s.touch("go");
    let f = run.outer.wait_for(WAIT);
    let deaths = watch_deaths(&run.procs, go, WAIT);
    let seen = next.assert_no_survivors(&what);
    f.assert_code(124);
    let lines: Vec<Value> = f
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let errors: Vec<&Value> = lines.iter().filter(|v| v["level"] == "error").collect();
    assert!(
        errors.len() == 1 && errors[0]["event"] == "guard_stopped",
        "{what}: one error line, guard_stopped:\n{}",
        f.stderr
    );
    assert!(deaths.alive.is_empty(), "{what}: {deaths:?}");
    assert!(
        seen - go < Duration::from_secs(8),
        "{what}: the next holder ran {:?} after the first stop: the lock was not released",
        seen - go
    );
}

/// A tracer holds the guard in a stop that SIGCONT does not end (`gdb -p` does so: an
/// attach, then the SIGSTOP passed on): lockrun, seeing its guard still stopped after its
/// SIGCONT, stops the job and the guard, exits 124 saying why and releases the lock.
fn a_tracer_holds_the_guard(on: On) {
    let what = format!("a tracer holds the guard, on {on:?}");
    let b = on.backend();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let opts = ["--ttl", "30s", "--log-format", "json"];
    let mut run = Run::start(&b, &s, &job, &opts, Parent::Test);
    run.reap_with(&reaper);
    let mut next = next_holder(&b, &s, &run);

    let attached = Instant::now();
    let tracer = Tracer::hold(run.guard);
    let f = run.outer.wait_for(WAIT);
    let deaths = watch_deaths(&run.procs, attached, WAIT);
    let seen = next.assert_no_survivors(&what);
    f.assert_code(124);
    let errors: Vec<&str> = f
        .stderr
        .lines()
        .filter(|l| l.contains(r#""level":"error""#))
        .collect();
    assert!(
        errors.len() == 1 && errors[0].contains(r#""event":"guard_stopped""#),
        "{what}: one error line, guard_stopped:\n{}",
        f.stderr
    );
    assert!(deaths.alive.is_empty(), "{what}: {deaths:?}");
    assert!(
        seen - attached < Duration::from_secs(8),
        "{what}: the next holder ran {:?} after the attach",
        seen - attached
    );
    drop(tracer);
}

/// A tracer that does not stop the guard (it could hold it at a breakpoint): lockrun
/// sees no stop, but says at its next renewal that its guard is traced, once, and the
/// run goes on.
#[test]
fn a_traced_guard_is_reported() {
    let b = On::Redis.backend();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::ending(Shape::Background, &s, "job", &gated("exit 0"));
    let opts = ["--ttl", "2s", "--log-format", "json"];
    let mut run = Run::start(&b, &s, &job, &opts, Parent::Test);
    run.reap_with(&reaper);
    let tracer = Tracer::seize(run.guard);
    wait_until("lockrun said its guard is traced", WAIT, || {
        run.outer
            .stderr_so_far()
            .contains(r#""event":"guard_traced""#)
    });
    thread::sleep(Duration::from_millis(1500));
    drop(tracer);
    s.touch("go");
    let f = run.outer.wait_for(WAIT);
    f.assert_code(0);
    let lines = f.stderr.matches(r#""event":"guard_traced""#).count();
    assert_eq!(lines, 1, "one guard_traced line:\n{}", f.stderr);
}

/// A tracer (`ptrace`) of the test's own, on a thread of its own, holding a process in
/// a group stop until dropped or until the process is gone.
struct Tracer {
    done: mpsc::Sender<()>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Tracer {
    /// Attaches to `pid` and passes its SIGSTOP on (a group stop, which its parent
    /// sees, in a tracing stop that only the tracer ends); returns once it is so.
    fn hold(pid: i32) -> Tracer {
        Tracer::start(pid, true)
    }

    /// Traces `pid` without stopping it (`PTRACE_SEIZE`).
    fn seize(pid: i32) -> Tracer {
        Tracer::start(pid, false)
    }

    fn start(pid: i32, hold: bool) -> Tracer {
        let (done, rx) = mpsc::channel::<()>();
        let (stopped, ready) = mpsc::channel::<()>();
        let thread = thread::spawn(move || {
            trace(pid, hold);
            let _ = stopped.send(());
            while rx.recv_timeout(Duration::from_millis(50)).is_err() {
                if is_dead(pid) {
                    return;
                }
            }
            // (The tracer's thread ends: the kernel detaches what it traced.)
        });
        ready
            .recv_timeout(WAIT)
            .expect("the tracer stopped the guard");
        Tracer {
            done,
            thread: Some(thread),
        }
    }
}

/// On the tracer's thread: attaches to `pid` and holds it in a group stop (`hold`), or
/// traces it without stopping it.
#[allow(unsafe_code)]
fn trace(pid: i32, hold: bool) {
    use nix::libc;
    let wait = || {
        let mut status = 0;
        // SAFETY: waitpid(2) writes the status into a local.
        unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
    };
    // SAFETY: ptrace(2) on a process of the test's, always from the same thread (the
    // tracer's); no memory is passed.
    unsafe {
        if hold {
            assert_eq!(libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0), 0, "attach");
            wait();
            libc::ptrace(libc::PTRACE_CONT, pid, 0, libc::SIGSTOP);
            wait();
        } else {
            assert_eq!(libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0), 0, "seize");
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.done.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `end`, once the test created `go` in the job's scratch directory (`$GO`).
fn gated(end: &str) -> String {
    format!("while [ ! -e \"$GO\" ]; do sleep 0.01; done; {end}")
}

/// The tests of one case on `file://` and on Redis.
macro_rules! on_both {
    ($name:ident, $case:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn on_file() {
                $case(On::File);
            }

            #[test]
            fn on_redis() {
                $case(On::Redis);
            }
        }
    };
}

on_both!(guard_stopped_then_lockrun_killed_under_a_subreaper, |on| {
    guard_stopped_then_lockrun_killed(Parent::Subreaper, on)
});
on_both!(
    guard_stopped_then_lockrun_killed_under_a_pid_namespace_init,
    |on| guard_stopped_then_lockrun_killed(Parent::NamespaceInit, on)
);
on_both!(lockrun_stopped_then_guard_killed, |on| {
    lockrun_stopped_then_guard_killed(on, Parent::Test)
});
on_both!(the_job_stops_its_guard, the_job_stops_its_guard);
on_both!(
    the_job_keeps_stopping_its_guard,
    the_job_keeps_stopping_its_guard
);
on_both!(a_tracer_holds_the_guard, a_tracer_holds_the_guard);

#[test]
fn lockrun_stopped_then_guard_killed_unprivileged_on_file() {
    lockrun_stopped_then_guard_killed(On::File, Parent::Nobody);
}
