//! The job is every descendant when lockrun itself stops it (docs/guarantees.md,
//! "Property 10 in detail"): lock loss, `--max-runtime`, the SIGKILL that follows a forwarded signal
//! after `--kill-after` (also as PID 1 of a PID namespace, as in a container), and the
//! clean-up after the command exits all reach the processes that left the command's
//! group or session ([`Shape::All`]); none of them outlives lockrun, and the lock is
//! released only after them.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// Spawns lockrun on `name` of `b` with `opts` around `job`; returns it and the job's
/// processes once they all run.
fn start(
    b: &Backend,
    name: &str,
    opts: &[&str],
    job: &Job,
    reaper: &Reaper,
) -> (Running, Vec<Proc>) {
    let mut cmd = b.run(name, opts, &job.command());
    job.env(&mut cmd);
    let lr = spawn(cmd);
    reaper.add(lr.pid());
    let procs = job.wait_started(reaper);
    (lr, procs)
}

/// Panics unless every process of `procs` was dead when lockrun was seen ended.
fn assert_all_dead_at_exit(procs: &[Proc], f: &Finished, what: &str) {
    let alive: Vec<i32> = procs.iter().filter(|p| p.alive()).map(|p| p.pid).collect();
    assert!(
        alive.is_empty(),
        "{what}: processes of the job outlived lockrun: {alive:?} of {:?}\n{}",
        procs.iter().map(|p| p.pid).collect::<Vec<_>>(),
        f.stderr
    );
}

#[test]
fn max_runtime_stops_the_processes_that_left_the_group() {
    let b = Backend::new(RedisServer::start());
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let opts = ["--max-runtime", "1s", "--kill-after", "1s"];
    let (mut lr, procs) = start(&b, "job", &opts, &job, &reaper);
    let f = lr.wait();
    assert_all_dead_at_exit(&procs, &f, "--max-runtime");
    f.assert_failure(124);
    assert!(!b.held("job"), "the lock is held after lockrun exited");
}

#[test]
fn lock_loss_stops_the_processes_that_left_the_group() {
    let b = Backend::new(RedisServer::start());
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let opts = [
        "--ttl",
        "30s",
        "--renew-every",
        "300ms",
        "--kill-after",
        "1s",
    ];
    let (mut lr, procs) = start(&b, "job", &opts, &job, &reaper);
    run(b.admin("release", &["--force", "job"])).assert_code(0);
    let f = lr.wait();
    assert_all_dead_at_exit(&procs, &f, "lock lost");
    f.assert_failure(124);
}

#[test]
fn clean_up_after_the_command_exits_stops_the_processes_that_left_the_group() {
    // The issue's second case: `timeout 20 sleep 15 &` and the like, left running by a
    // command that exits normally, must not run on once the lock is released.
    let b = Backend::new(RedisServer::start());
    let s = Scratch::new();
    let reaper = Reaper::default();
    let end = r#"while [ ! -e "$GO" ]; do sleep 0.01; done; exit 5"#;
    let job = Job::ending(Shape::All, &s, "job", end);
    let mut cmd = b.run("job", &["--kill-after", "1s"], &job.command());
    job.env(&mut cmd);
    cmd.env("GO", s.path("go"));
    let mut lr = spawn(cmd);
    let procs = job.wait_started(&reaper);
    let next = b.run("job", &["--wait", "30s"], &next_holder_command());
    let mut next = NextHolder::spawn(next, &s, "next", &procs);
    s.touch("go");
    let f = lr.wait();
    assert_all_dead_at_exit(&procs, &f, "the command exited");
    f.assert_code(5);
    next.assert_no_survivors("the command exited");
}

/// Sends `sig` to lockrun (`lockrun_pid`, run by `outer`) whose job ([`Shape::All`],
/// the command ignoring it) lives on: after `--kill-after 1s` the whole job gets
/// SIGKILL, lockrun exits 137 and releases the lock at once (its lease is 30 s); a
/// next holder waiting meanwhile finds none of the job alive.
fn assert_escalated(
    b: &Backend,
    s: &Scratch,
    mut outer: Running,
    lockrun_pid: i32,
    procs: &[Proc],
    what: &str,
) {
    let next = b.run("job", &["--wait", "30s"], &next_holder_command());
    let mut next = NextHolder::spawn(next, s, "next", procs);
    let sent = Instant::now();
    signal_pid(lockrun_pid, Signal::SIGTERM);
    let f = outer.wait_for(Duration::from_secs(15));
    let after = f.ended - sent;
    assert_all_dead_at_exit(procs, &f, what);
    f.assert_code(137);
    assert!(
        after >= Duration::from_millis(900),
        "{what}: lockrun ended {after:?} after the TERM, before --kill-after 1s"
    );
    let seen = next.assert_no_survivors(what);
    assert!(
        seen - f.ended < Duration::from_secs(5),
        "{what}: the next holder ran {:?} after lockrun ended: the lock was not released",
        seen - f.ended
    );
}

#[test]
fn forwarded_term_is_followed_by_sigkill_of_the_whole_job_after_kill_after() {
    let b = Backend::new(RedisServer::start());
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let opts = ["--ttl", "30s", "--kill-after", "1s"];
    let (lr, procs) = start(&b, "job", &opts, &job, &reaper);
    let pid = lr.pid();
    assert_escalated(&b, &s, lr, pid, &procs, "forwarded TERM");
}

#[test]
fn as_pid_1_forwarded_term_is_followed_by_sigkill_of_the_whole_job_after_kill_after() {
    // A container's grace period: the kubelet's SIGTERM to PID 1 must end with the job
    // killed and the lock released after --kill-after, before the kubelet's SIGKILL.
    let b = Backend::new(RedisServer::start());
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let mut cmd = b.run(
        "job",
        &["--ttl", "30s", "--kill-after", "1s"],
        &job.command(),
    );
    job.env(&mut cmd);
    let un = spawn(wrapped(
        &["unshare", "--pid", "--fork", "--mount-proc"],
        &cmd,
    ));
    let lockrun_pid = only_child(un.pid());
    reaper.add(lockrun_pid);
    let inner = job.wait_recorded();
    let host = pids_in_namespace_of(lockrun_pid);
    let pids: Vec<i32> = inner
        .iter()
        .map(|p| *host.get(p).expect("a job process in the namespace"))
        .collect();
    let procs = procs_of(&pids).expect("the job runs");
    procs.iter().for_each(|p| reaper.add(p.pid));
    assert_escalated(&b, &s, un, lockrun_pid, &procs, "TERM to PID 1");
}
